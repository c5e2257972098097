//! The game's numbers, as `summary.json` holds them and the page shows them.

use crate::analysis::overview::LevelSpread;
use crate::analysis::stats::Summary;
use crate::record::Manifest;
use serde::Serialize;

/// A round's statistics over the replicates of one arm and population.
#[derive(Debug, Clone, Serialize)]
pub struct RoundSummary {
    pub arm: String,
    pub population: usize,
    pub round: usize,
    pub replicates: usize,
    /// Mean guess: mean over games, with a 95% CI over games when there are at least 2.
    pub mean: Option<Summary>,
    pub target: Option<f64>,
    /// Mean over games of the winning number (the lower one where two won).
    pub winning_number: Option<f64>,
    /// Games in which guesses on both sides of the target were equally close, and the mean
    /// of the higher winning number in those games.
    pub two_sided_ties: usize,
    pub tied_winning_number: Option<f64>,
    /// Mean over games of the agents who guessed a winning number.
    pub winners: f64,
    pub median: Option<f64>,
    pub std: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub guesses: f64,
    pub players: usize,
    /// Wall time of the step that played the round (all cells of the population at once).
    pub seconds: Option<f64>,
    pub equilibrium: Option<f64>,
}

/// One model's mean guess in one round, where the agents of a game ask several models.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRound {
    pub arm: String,
    pub population: usize,
    pub round: usize,
    pub model: String,
    /// Mean over games of the model's agents' mean guess, with a 95% CI over games (as the
    /// round table's): after round 1 a game's agents have seen the same results, so its
    /// agents are not independent draws, its games are.
    pub mean: Option<Summary>,
    pub games: usize,
    /// The model's agents in a game.
    pub agents: usize,
}

/// Round 1's mean guess of one group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupMean {
    pub arm: String,
    pub attribute: String,
    pub group: String,
    pub mean: Option<Summary>,
}

/// A target rule of the run and its equilibrium, in words.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleEquilibrium {
    /// `2/3 of the average`, `5 plus 1/2 of the average`.
    pub rule: String,
    /// The arms that play it.
    pub arms: Vec<String>,
    pub equilibrium: Option<f64>,
    /// Which equilibrium the clamped rule has, and why.
    pub explanation: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub manifest: Manifest,
    /// Lines a reader must see first: a model smaller than the study's, scripted players.
    pub notes: Vec<String>,
    /// Every target rule of the run (one unless arms change it), with its equilibrium.
    pub rules: Vec<RuleEquilibrium>,
    pub rounds: Vec<RoundSummary>,
    /// Every round by model, when a game's agents ask several models (empty otherwise).
    pub models: Vec<ModelRound>,
    pub groups: Vec<GroupMean>,
    /// Under `[[population.groups]]`: how each level's groups differ in their mean guess and
    /// share of winners at the last round.
    pub levels: Vec<LevelSpread>,
    pub figures: Vec<String>,
}
