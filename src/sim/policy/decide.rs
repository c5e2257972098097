//! What every way of deciding does, behind one trait, and where its time went.

use super::decided::Decided;
use super::error::PolicyError;
use super::turn::{AgentTurn, CellView};
use crate::sim::scenario::Scenario;
use std::time::Duration;

pub trait Policy<S: Scenario> {
    /// Decisions for `turns`, in order; `done(n)` reports n more decided as they finish.
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError>;
    /// Where the time went since the last call.
    fn take_times(&mut self) -> PolicyTimes {
        PolicyTimes::default()
    }
    /// State to carry over a restart (chat histories), as bytes.
    fn checkpoint(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&mut self, _state: &[u8]) -> Result<(), PolicyError> {
        Ok(())
    }
}

/// Where a policy's time went during a step, and the most KV memory it held.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PolicyTimes {
    /// Preparing prompts: rendering templates, and tokenizing.
    pub template: Duration,
    pub tokenize: Duration,
    /// In the engine: forward passes, and the constrained decoder's token masks.
    pub forward: Duration,
    pub masks: Duration,
    /// The most KV-cache memory in use at once.
    pub kv_peak_bytes: u64,
    /// Decisions whose reply came from an earlier run's store (`--reuse`), which took no time
    /// in the engine.
    pub reused: u64,
}
