//! The `scripted` players: a level-k model, the classic behavioural account of this game.
//! A level-0 player guesses at random; a level-k player best-responds to a crowd of level
//! k-1 players (so applies the rule k times to 50). From round 2 on, players best-respond to
//! the last round's mean, the more sophisticated looking one step further ahead. Where the
//! population has an `education` attribute, players in later-listed (higher) categories reason
//! one level deeper more often, as the study found of its LLM agents.

use super::config::GuessConfig;
use super::rules::to_hundredths;
use super::world::Game;
use crate::sim::population::{Column, Population};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Shares of levels 0 to 3 in a population without education (Nagel's and later
/// experiments put most people at levels 0 to 2).
const LEVELS: [f64; 4] = [0.25, 0.4, 0.25, 0.1];

fn level(population: &Population, agent: usize, rng: &mut ChaCha8Rng) -> usize {
    let u: f64 = rng.random();
    let mut k = LEVELS
        .iter()
        .scan(0.0, |acc, &p| {
            *acc += p;
            Some(*acc)
        })
        .position(|cum| u < cum)
        .unwrap_or(LEVELS.len() - 1);
    if let Some(Column::Categorical { categories, codes }) = population.column("education") {
        let top = categories.len().saturating_sub(1).max(1) as f64;
        let schooling = codes[agent] as f64 / top;
        if rng.random_bool(schooling.clamp(0.0, 1.0) * 0.6) {
            k = (k + 1).min(LEVELS.len() - 1);
        }
    } else {
        let _: bool = rng.random_bool(0.5);
    }
    k
}

/// The guess of `agent` in the coming round.
pub fn guess(
    cfg: &GuessConfig,
    game: &Game,
    population: &Population,
    agent: usize,
    rng: &mut ChaCha8Rng,
) -> u16 {
    let rule = cfg.rule();
    let apply = |x: f64, times: usize| {
        (0..times).fold(x, |x, _| rule.ratio.value() * x + rule.offset.value())
    };
    let k = level(population, agent, rng);
    let noise = rng.random_range(-3.0..=3.0);
    let x = match game.last_for(agent) {
        None if k == 0 => rng.random_range(0.0..=100.0),
        None => apply(50.0, k) + noise,
        // Best response to last round's crowd, looking one step further at level 2 and up.
        Some(last) => apply(last.mean, 1 + (k >= 2) as usize) + noise,
    };
    to_hundredths(x, cfg.decimals)
}
