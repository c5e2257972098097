//! What the engine measures: each step's metrics and their totals over the engine's life.

use super::block_manager::CacheStats;
use std::time::Duration;

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepMetrics {
    /// Sequences in the batch.
    pub seqs: usize,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Of which prompt (or recomputed) tokens.
    pub prefill_tokens: usize,
    /// Requests still waiting for admission after the step.
    pub waiting: usize,
    /// KV blocks the running sequences hold during the step (a block shared by several
    /// counts once; cached blocks nobody holds are free).
    pub blocks_used: usize,
    /// Packing the batch's inputs and copying them to the device.
    pub inputs: Duration,
    pub forward: Duration,
    /// Of `forward`, the time in attention (measured with `EngineConfig::profile`).
    pub attention: Option<Duration>,
    /// Computing grammar masks (overlapped with `forward` on a GPU).
    pub masks: Duration,
    /// Masks computed.
    pub num_masks: usize,
    pub sampling: Duration,
    /// Copies of logits, masks, draws or token ids between device and host.
    pub copies: Duration,
}

/// Totals over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineTotals {
    /// Requests this engine took (in this process: a resumed run counts only its own).
    pub requests: u64,
    pub steps: u64,
    pub prompt_tokens: u64,
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
    /// Tokens appended because the grammar forced them.
    pub forced_tokens: u64,
    pub inputs: Duration,
    pub forward: Duration,
    /// Attention time of the steps that measured it.
    pub attention: Duration,
    pub masks: Duration,
    pub num_masks: u64,
    pub sampling: Duration,
    pub copies: Duration,
    pub preemptions: u64,
    pub cache: CacheStats,
}

impl EngineTotals {
    /// Share of admitted prompt tokens found in the prefix cache.
    pub fn prefix_hit_rate(&self) -> f64 {
        self.cache.hit_tokens as f64 / self.cache.queried_tokens.max(1) as f64
    }
}
