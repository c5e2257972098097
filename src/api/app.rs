//! What the server's handlers share: the models it serves and its counts.

use super::seeds;
use crate::engine::EngineHandle;
use crate::serve::access::Access;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

/// One model the server answers for.
pub struct Served {
    /// The name requests give as `model`.
    pub name: String,
    pub handle: EngineHandle,
    /// Sequences its engine runs at once: the most choices one request may ask for.
    pub max_seqs: usize,
}

/// What every handler shares.
pub(super) struct App {
    pub(super) models: Vec<Served>,
    pub(super) access: Access,
    pub(super) queue: usize,
    pub(super) max_tokens: usize,
    /// Sequences admitted and not yet finished or cancelled, over every model.
    pub(super) admitted: Arc<AtomicUsize>,
    pub(super) seeds: seeds::Seeds,
    /// Sequences finished since start, for `Retry-After`.
    pub(super) finished: Arc<AtomicUsize>,
    pub(super) started: std::time::Instant,
}
