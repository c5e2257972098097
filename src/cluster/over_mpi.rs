//! The MPI transport (the `mpi` feature, over the system's MPI through rsmpi). Exchanges are
//! point-to-point messages polled against a deadline, rather than blocking collectives,
//! because MPI collectives cannot time out and cannot say which rank is missing.

use super::error::ClusterError;
use super::transport::{Topology, Transport};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::rc::Rc;
use std::time::Duration;

const GATHER: mpi::Tag = 11;
const BROADCAST: mpi::Tag = 12;

struct Mpi {
    /// Kept alive for the process's life: dropping it finalises MPI.
    _universe: Universe,
    world: SimpleCommunicator,
}

/// Initialises MPI and reads this process's place in it.
pub(super) fn init() -> Result<(Topology, Rc<dyn Transport>), ClusterError> {
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
        .ok_or_else(|| ClusterError::Mpi("MPI was already initialised in this process".into()))?;
    let world = universe.world();
    // The processes sharing this machine's memory, in world-rank order: their rank among
    // them picks the device.
    let local = world.split_shared(world.rank());
    let topology = Topology {
        rank: world.rank() as usize,
        size: world.size() as usize,
        local_rank: local.rank() as usize,
        local_size: local.size() as usize,
    };
    Ok((
        topology,
        Rc::new(Mpi {
            _universe: universe,
            world,
        }),
    ))
}

fn check_len(bytes: &[u8]) -> Result<(), ClusterError> {
    if bytes.len() > i32::MAX as usize {
        return Err(ClusterError::TooLarge { bytes: bytes.len() });
    }
    Ok(())
}

impl Mpi {
    /// Sends `bytes` to `to`, waiting at most `timeout` for it to be taken.
    fn send(
        &self,
        to: usize,
        bytes: &[u8],
        tag: mpi::Tag,
        timeout: Duration,
        during: &'static str,
    ) -> Result<(), ClusterError> {
        check_len(bytes)?;
        let target = self.world.process_at_rank(to as i32);
        mpi::request::scope(|scope| {
            let mut request = target.immediate_send_with_tag(scope, bytes, tag);
            let mut backoff = Backoff::new();
            loop {
                match request.test() {
                    Ok(_) => return,
                    Err(pending) => request = pending,
                }
                if backoff.elapsed() > timeout {
                    self.give_up(ClusterError::Timeout {
                        rank: to,
                        secs: timeout.as_secs(),
                        during,
                    });
                }
                backoff.wait();
            }
        });
        Ok(())
    }

    /// A send that cannot finish leaves a request MPI still owns, which must not be dropped:
    /// say why and end the job here.
    fn give_up(&self, error: ClusterError) -> ! {
        eprintln!("throng: rank {}: {error}", self.world.rank());
        self.world.abort(1)
    }

    /// Receives the next message with `tag` from `from`, waiting at most `timeout`.
    fn receive(
        &self,
        from: usize,
        tag: mpi::Tag,
        timeout: Duration,
        during: &'static str,
    ) -> Result<Vec<u8>, ClusterError> {
        let source = self.world.process_at_rank(from as i32);
        let mut backoff = Backoff::new();
        loop {
            if let Some(probed) = source.immediate_matched_probe_with_tag(tag) {
                let (bytes, _) = probed.matched_receive_vec::<u8>();
                return Ok(bytes);
            }
            if backoff.elapsed() > timeout {
                return Err(ClusterError::Timeout {
                    rank: from,
                    secs: timeout.as_secs(),
                    during,
                });
            }
            backoff.wait();
        }
    }
}

impl Transport for Mpi {
    fn gather(
        &self,
        mine: Vec<u8>,
        timeout: Duration,
    ) -> Result<Option<Vec<Vec<u8>>>, ClusterError> {
        let size = self.world.size() as usize;
        if self.world.rank() != 0 {
            self.send(0, &mine, GATHER, timeout, "sending its step to rank 0")?;
            return Ok(None);
        }
        let mut all = vec![mine];
        for from in 1..size {
            all.push(self.receive(from, GATHER, timeout, "rank 0 gathered a step")?);
        }
        Ok(Some(all))
    }

    fn broadcast(&self, bytes: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, ClusterError> {
        let size = self.world.size() as usize;
        if self.world.rank() != 0 {
            return self.receive(0, BROADCAST, timeout, "the others waited for rank 0");
        }
        check_len(&bytes)?;
        // Every send at once, so that a slow or dead rank does not hold up the others.
        mpi::request::scope(|scope| {
            let mut pending: Vec<(usize, _)> = (1..size)
                .map(|to| {
                    let target = self.world.process_at_rank(to as i32);
                    (
                        to,
                        Some(target.immediate_send_with_tag(scope, &bytes[..], BROADCAST)),
                    )
                })
                .collect();
            let mut backoff = Backoff::new();
            loop {
                for (_, slot) in pending.iter_mut() {
                    if let Some(request) = slot.take()
                        && let Err(still) = request.test()
                    {
                        *slot = Some(still);
                    }
                }
                if let Some(&(to, _)) = pending.iter().find(|(_, s)| s.is_some()) {
                    if backoff.elapsed() > timeout {
                        self.give_up(ClusterError::Timeout {
                            rank: to,
                            secs: timeout.as_secs(),
                            during: "rank 0 sent the step's outcome",
                        });
                    }
                    backoff.wait();
                } else {
                    return;
                }
            }
        });
        Ok(bytes)
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}

/// Waits between polls of an exchange: short at first, then up to 2 ms, so that a rank
/// waiting for a slower one leaves the CPU to it (on an oversubscribed machine the slower
/// one may be on the same core).
struct Backoff {
    started: std::time::Instant,
    spins: u32,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            started: std::time::Instant::now(),
            spins: 0,
        }
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn wait(&mut self) {
        self.spins += 1;
        if self.spins < 64 {
            std::thread::yield_now();
        } else {
            let micros = (self.spins as u64 - 63).min(2000);
            std::thread::sleep(Duration::from_micros(micros));
        }
    }
}
