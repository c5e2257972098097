//! Crash points for testing that a run survives being killed anywhere: given
//! `THRONG_CRASH_AT=STEP:POINT` (read by the command line into [`Faults`]) the process aborts (as a `kill -9` would stop it, without
//! unwinding or flushing) when it reaches `POINT` of step `STEP` (1-based, counted over every
//! population size). The points lie between the writes of a step, where a crash is hardest
//! to recover from; [`POINTS`] names them in order. `THRONG_CRASH_AT=STEP:hang` instead makes
//! step `STEP` never finish (before anything of it is written), as a runaway template or a
//! stuck device would, for testing how a run that cannot finish its step is stopped.
//!
//! `THRONG_STEP_DELAY_MS=N` makes every step wait `N` milliseconds before it decides, for
//! tests that watch a run advance step by step: a scripted run on a fast machine otherwise
//! finishes several steps between two looks of the watcher.

use std::time::Duration;

/// Every crash point, in the order a step passes them.
pub const POINTS: &[&str] = &[
    // Decisions made, nothing of the step written.
    "decided",
    // The state table's part written, not the rest.
    "state",
    // Every record written, not the checkpoint.
    "records",
    // The checkpoint written, not the manifest.
    "checkpoint",
];

/// The point at which a step hangs instead of crashing: not in [`POINTS`], since a run that
/// reaches it never ends by itself.
pub(crate) const HANG: &str = "hang";

/// What a run is asked to do wrong on purpose, for tests. The program that starts a run
/// reads it ([`Faults::from_env`]: the command line does); the runner only obeys what it is
/// given, so a library caller's run never crashes because of its environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Abort at this point of this step (1-based, over every population size), or hang there
    /// ([`HANG`]).
    pub crash_at: Option<(usize, String)>,
    /// Wait this long before each step decides.
    pub step_delay: Option<Duration>,
}

impl Faults {
    /// `THRONG_CRASH_AT=STEP:POINT` and `THRONG_STEP_DELAY_MS=N`, where set and well formed.
    pub fn from_env() -> Self {
        let crash_at = std::env::var("THRONG_CRASH_AT").ok().and_then(|spec| {
            let (step, point) = spec.split_once(':')?;
            Some((step.parse().ok()?, point.to_string()))
        });
        let step_delay = std::env::var("THRONG_STEP_DELAY_MS")
            .ok()
            .and_then(|ms| ms.trim().parse().ok())
            .map(Duration::from_millis);
        Self {
            crash_at,
            step_delay,
        }
    }

    /// Aborts the process if the run was asked to crash at `point` of `step`; never returns
    /// if it was asked to hang there ([`HANG`]).
    pub fn point(&self, step: usize, point: &str) {
        if let Some((s, p)) = &self.crash_at
            && *s == step
            && p == point
        {
            if point == HANG {
                eprintln!("throng: THRONG_CRASH_AT={s}:{p}: this step never finishes");
                loop {
                    std::thread::park();
                }
            }
            eprintln!("throng: THRONG_CRASH_AT={s}:{p}: aborting here, as a kill would");
            std::process::abort();
        }
    }

    /// Waits the delay each step was asked to wait, if any.
    pub(crate) fn pace(&self) {
        if let Some(delay) = self.step_delay {
            std::thread::sleep(delay);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_fault_is_asked_unless_given() {
        let faults = Faults::default();
        // Neither aborts nor waits.
        faults.point(1, "state");
        faults.point(1, HANG);
        faults.pace();
        let asked = Faults {
            crash_at: Some((3, "state".into())),
            step_delay: None,
        };
        asked.point(2, "state");
        asked.point(3, "records");
    }
}
