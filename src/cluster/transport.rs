//! Where this process sits among the ranks, and the way bytes move between them.

use super::error::ClusterError;
use std::time::Duration;

/// Where this process sits among the ranks of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    pub rank: usize,
    pub size: usize,
    /// The rank among the processes of this machine: the device it takes (`cuda:LOCAL`).
    pub local_rank: usize,
    /// Processes on this machine, which share its cores.
    pub local_size: usize,
}

impl Topology {
    pub(crate) const SINGLE: Topology = Topology {
        rank: 0,
        size: 1,
        local_rank: 0,
        local_size: 1,
    };
}

/// Moves bytes between ranks. Every call is collective: every rank makes the same calls in
/// the same order.
pub(super) trait Transport {
    /// Every rank's `mine`, at the root, in rank order; `None` elsewhere.
    fn gather(
        &self,
        mine: Vec<u8>,
        timeout: Duration,
    ) -> Result<Option<Vec<Vec<u8>>>, ClusterError>;
    /// The root's `bytes` (ignored elsewhere), at every rank.
    fn broadcast(&self, bytes: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, ClusterError>;
    /// Ends every rank of the job now.
    fn abort(&self, code: i32) -> !;
}
