//! A game's state: every round's guesses, one small integer per agent, and each round's
//! result.

use super::rules::RoundResult;
use serde::{Deserialize, Serialize};

/// `None` in a round's column: the agent could not decide (its reply fell back).
pub type Guess = Option<u16>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Game {
    pub agents: usize,
    /// `guesses[r][agent]`: round `r + 1`'s guess in hundredths.
    pub guesses: Vec<Vec<Guess>>,
    /// `results[r]`: round `r + 1`'s outcome (`None` when nobody guessed).
    pub results: Vec<Option<RoundResult>>,
}

impl Game {
    pub fn new(agents: usize) -> Self {
        Self {
            agents,
            guesses: Vec::new(),
            results: Vec::new(),
        }
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
