//! One process per device: which rank this process is, how many there are, and how they
//! exchange bytes. Ranks come from MPI when the `mpi` feature is built and the process was
//! started by `mpirun` or `srun --mpi=...`; from SLURM's variables (`SLURM_PROCID`,
//! `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`) under a plain `srun`. Every exchange has a
//! timeout, so that a rank that died or hangs stops the job with its number instead of
//! leaving the others waiting forever.
//!
//! Plain transport: this module knows nothing of simulations; the runner decides what the
//! bytes are.

mod error;
#[cfg(feature = "mpi")]
mod over_mpi;
mod transport;

pub use error::ClusterError;
pub use transport::Topology;
use transport::Transport;

use std::rc::Rc;
use std::time::Duration;

/// How long a rank waits for another at an exchange before it stops the job.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How the process was started, read from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// On its own.
    Alone,
    /// By an MPI launcher (mpirun, mpiexec, or srun with an MPI plugin); `size` when the
    /// launcher says it (PMIx alone does not).
    Mpi {
        size: Option<usize>,
        variable: &'static str,
    },
    /// By srun without an MPI plugin.
    Srun(Topology),
}

/// Variables MPI launchers set in every process they start, with the world size.
const MPI_SIZE_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_SIZE", // Open MPI's mpirun
    "PMI_SIZE",             // MPICH's Hydra, Intel MPI, srun --mpi=pmi2
    "MV2_COMM_WORLD_SIZE",  // MVAPICH
    "MPI_LOCALNRANKS",      // MPICH's Hydra, per node
];

/// How the process was started, from `env` (the process environment, or a test's).
pub fn launcher(env: &dyn Fn(&str) -> Option<String>) -> Launcher {
    let number = |name: &str| env(name).and_then(|v| v.trim().parse::<usize>().ok());
    for var in MPI_SIZE_VARS {
        if let Some(size) = number(var) {
            return Launcher::Mpi {
                size: Some(size),
                variable: var,
            };
        }
    }
    // srun --mpi=pmix sets PMIX_RANK (and SLURM's variables); Open MPI 4's mpirun does too.
    if env("PMIX_RANK").is_some() {
        return Launcher::Mpi {
            size: number("SLURM_STEP_NUM_TASKS"),
            variable: "PMIX_RANK",
        };
    }
    // SLURM_STEP_NUM_TASKS is set by srun only, not in the batch script itself, where
    // SLURM_NTASKS describes the whole allocation.
    match (number("SLURM_PROCID"), number("SLURM_STEP_NUM_TASKS")) {
        (Some(rank), Some(size)) if rank < size => Launcher::Srun(Topology {
            rank,
            size,
            local_rank: number("SLURM_LOCALID").unwrap_or(0),
            local_size: 1,
        }),
        _ => Launcher::Alone,
    }
}

/// A process alone.
struct Alone;

impl Transport for Alone {
    fn gather(&self, mine: Vec<u8>, _: Duration) -> Result<Option<Vec<Vec<u8>>>, ClusterError> {
        Ok(Some(vec![mine]))
    }
    fn broadcast(&self, bytes: Vec<u8>, _: Duration) -> Result<Vec<u8>, ClusterError> {
        Ok(bytes)
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// This process's place in the job, and the way to the others. Cheap to clone; stays on the
/// thread that joined (MPI is initialised for one thread to call it).
#[derive(Clone)]
pub struct Ranks {
    topology: Topology,
    transport: Rc<dyn Transport>,
    timeout: Duration,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranks")
            .field("topology", &self.topology)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for Ranks {
    fn default() -> Self {
        Self::single()
    }
}

impl Ranks {
    /// A process alone: rank 0 of 1.
    pub fn single() -> Self {
        Ranks {
            topology: Topology::SINGLE,
            transport: Rc::new(Alone),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Joins the job this process was started in (MPI is initialised here, once, when the
    /// launcher is an MPI one); a process started alone is rank 0 of 1. `timeout` bounds
    /// every wait for another rank.
    pub fn join(timeout: Duration) -> Result<Self, ClusterError> {
        let env = |name: &str| std::env::var(name).ok();
        let topology = match launcher(&env) {
            Launcher::Alone => Topology::SINGLE,
            Launcher::Srun(t) if t.size == 1 => t,
            Launcher::Mpi { size, variable } => return Self::join_mpi(size, variable, timeout),
            Launcher::Srun(t) => return Self::join_srun(t, timeout),
        };
        Ok(Ranks {
            topology,
            timeout,
            ..Self::single()
        })
    }

    #[cfg(feature = "mpi")]
    fn join_mpi(
        _size: Option<usize>,
        _variable: &'static str,
        timeout: Duration,
    ) -> Result<Self, ClusterError> {
        let (topology, transport) = over_mpi::init()?;
        Ok(Ranks {
            topology,
            transport,
            timeout,
        })
    }

    #[cfg(not(feature = "mpi"))]
    fn join_mpi(
        size: Option<usize>,
        variable: &'static str,
        _timeout: Duration,
    ) -> Result<Self, ClusterError> {
        match size {
            Some(1) => Ok(Self::single()),
            size => Err(ClusterError::NotBuiltWithMpi {
                size: size.unwrap_or(2),
                variable,
            }),
        }
    }

    /// srun without an MPI plugin: MPI may still connect the tasks (PMI set up by other
    /// means); if it does not, they cannot exchange records, so refuse.
    #[cfg(feature = "mpi")]
    fn join_srun(slurm: Topology, timeout: Duration) -> Result<Self, ClusterError> {
        let (topology, transport) = over_mpi::init()?;
        if topology.size != slurm.size {
            return Err(ClusterError::NotConnected {
                size: slurm.size,
                why: " (MPI sees each task alone)",
            });
        }
        Ok(Ranks {
            topology,
            transport,
            timeout,
        })
    }

    #[cfg(not(feature = "mpi"))]
    fn join_srun(slurm: Topology, _timeout: Duration) -> Result<Self, ClusterError> {
        Err(ClusterError::NotConnected {
            size: slurm.size,
            why: " (this throng was built without MPI)",
        })
    }

    pub(crate) fn topology(&self) -> Topology {
        self.topology
    }
    pub fn rank(&self) -> usize {
        self.topology.rank
    }
    pub fn size(&self) -> usize {
        self.topology.size
    }
    pub(crate) fn is_root(&self) -> bool {
        self.topology.rank == 0
    }
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Every rank's `mine` at the root, in rank order; `None` at the other ranks.
    pub(crate) fn gather(&self, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, ClusterError> {
        self.transport.gather(mine, self.timeout)
    }

    /// The root's `bytes` at every rank (the others pass anything, e.g. an empty vector).
    pub(crate) fn broadcast(&self, bytes: Vec<u8>) -> Result<Vec<u8>, ClusterError> {
        self.transport.broadcast(bytes, self.timeout)
    }

    /// Every rank's `mine` at every rank, in rank order.
    pub(crate) fn all_gather(&self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, ClusterError> {
        if self.size() == 1 {
            return Ok(vec![mine]);
        }
        let joined = match self.gather(mine)? {
            Some(all) => frame(&all),
            None => Vec::new(),
        };
        Ok(unframe(&self.broadcast(joined)?))
    }

    /// Ends the whole job now (every rank), with `code`.
    pub(crate) fn abort(&self, code: i32) -> ! {
        self.transport.abort(code)
    }
}

/// Length-prefixed pieces in one buffer.
fn frame(pieces: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(|p| p.len() + 8).sum());
    for p in pieces {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn unframe(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while bytes.len() >= 8 {
        let len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        out.push(bytes[8..8 + len].to_vec());
        bytes = &bytes[8 + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    // Guards which launcher a process believes it was started by: a wrong guess either runs N
    // copies over one folder or refuses a correct job.
    fn the_launcher_is_read_from_the_environment() {
        assert_eq!(launcher(&env(&[])), Launcher::Alone);
        assert_eq!(
            launcher(&env(&[
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_RANK", "2")
            ])),
            Launcher::Mpi {
                size: Some(4),
                variable: "OMPI_COMM_WORLD_SIZE"
            }
        );
        assert_eq!(
            launcher(&env(&[("PMI_SIZE", "3")])),
            Launcher::Mpi {
                size: Some(3),
                variable: "PMI_SIZE"
            }
        );
        assert_eq!(
            launcher(&env(&[
                ("SLURM_PROCID", "5"),
                ("SLURM_STEP_NUM_TASKS", "8"),
                ("SLURM_LOCALID", "1")
            ])),
            Launcher::Srun(Topology {
                rank: 5,
                size: 8,
                local_rank: 1,
                local_size: 1,
            })
        );
        // The batch script itself (no srun step) is a process alone.
        assert_eq!(
            launcher(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")])),
            Launcher::Alone
        );
        assert_eq!(
            launcher(&env(&[("PMIX_RANK", "1"), ("SLURM_STEP_NUM_TASKS", "2")])),
            Launcher::Mpi {
                size: Some(2),
                variable: "PMIX_RANK"
            }
        );
    }

    #[test]
    // Guards the all-gather's framing: pieces of any length, empty ones included, come back
    // whole and in order.
    fn framed_pieces_come_back_in_order() {
        let pieces = vec![b"abc".to_vec(), Vec::new(), vec![7; 1000]];
        assert_eq!(unframe(&frame(&pieces)), pieces);
    }
}
