//! A game's state: every round's guesses, one small integer per agent, and each round's
//! result.

use super::rules::RoundResult;
use serde::{Deserialize, Serialize};

/// `None` in a round's column: the agent could not decide (its reply fell back).
pub(crate) type Guess = Option<u16>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Game {
    pub agents: usize,
    /// `guesses[r][agent]`: round `r + 1`'s guess in hundredths.
    pub guesses: Vec<Vec<Guess>>,
    /// `results[r]`: round `r + 1`'s outcome over the whole cell (`None` when nobody guessed).
    pub results: Vec<Option<RoundResult>>,
    /// When the groups of a level play games of their own (the `group` knob): each agent's
    /// group; empty otherwise.
    #[serde(default)]
    pub group_of: Vec<u32>,
    /// `group_results[r][g]`: round `r + 1`'s outcome in group `g`.
    #[serde(default)]
    pub group_results: Vec<Vec<Option<RoundResult>>>,
}

impl Game {
    pub fn new(agents: usize) -> Self {
        Self {
            agents,
            guesses: Vec::new(),
            results: Vec::new(),
            group_of: Vec::new(),
            group_results: Vec::new(),
        }
    }

    /// Whether groups play games of their own.
    pub fn grouped(&self) -> bool {
        !self.group_of.is_empty()
    }

    /// The outcome of round `r + 1` in the game `agent` played: its group's, or the cell's.
    pub(crate) fn result_for(&self, r: usize, agent: usize) -> Option<&RoundResult> {
        match self.grouped() {
            true => self.group_results[r][self.group_of[agent] as usize].as_ref(),
            false => self.results[r].as_ref(),
        }
    }

    /// The last round's outcome in the game `agent` plays.
    pub(crate) fn last_for(&self, agent: usize) -> Option<&RoundResult> {
        self.rounds()
            .checked_sub(1)
            .and_then(|r| self.result_for(r, agent))
    }

    /// Rounds played so far.
    pub fn rounds(&self) -> usize {
        self.results.len()
    }

    /// The last round's result.
    pub fn last(&self) -> Option<&RoundResult> {
        self.results.last().and_then(Option::as_ref)
    }
}
