//! What the server's handlers share: the models it serves, what it remembers of their
//! replies, its stores and its counts.

use super::{memo, rounds, seeds, store};
use crate::engine::{EngineHandle, PromptEncoder};
use crate::serve::access::Access;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

/// One model the server answers for.
pub struct Served {
    /// The name requests give as `model`.
    pub name: String,
    pub handle: EngineHandle,
    /// Renders, tokenizes and keys its requests as its engine does, on the server's threads.
    pub encoder: PromptEncoder,
    /// Sequences its engine runs at once: the most choices one request may ask for.
    pub max_seqs: usize,
}

/// What every handler shares.
pub(super) struct App {
    pub(super) models: Vec<Served>,
    /// The rounds of calls learned for each model, in order.
    pub(super) rounds: Vec<rounds::Rounds>,
    pub(super) access: Access,
    pub(super) queue: usize,
    pub(super) max_tokens: usize,
    /// Sequences admitted and not yet finished or cancelled, over every model.
    pub(super) admitted: Arc<AtomicUsize>,
    pub(super) seeds: seeds::Seeds,
    /// Sequences finished since start, for `Retry-After`.
    pub(super) finished: Arc<AtomicUsize>,
    pub(super) started: std::time::Instant,
    /// Recent replies, to splice into the conversations that repeat them.
    pub(super) memo: memo::Memo,
    pub(super) recorder: Option<store::Recorder>,
    pub(super) sources: Option<store::Sources>,
    /// Choices answered from `sources`, and prompts with replies spliced in.
    pub(super) reused: AtomicU64,
    pub(super) spliced: AtomicU64,
}
