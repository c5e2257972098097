//! Crash points for testing that a run survives being killed anywhere: with
//! `THRONG_CRASH_AT=STEP:POINT` the process aborts (as a `kill -9` would stop it, without
//! unwinding or flushing) when it reaches `POINT` of step `STEP` (1-based, counted over every
//! population size). The points lie between the writes of a step, where a crash is hardest
//! to recover from; [`POINTS`] names them in order. `THRONG_CRASH_AT=STEP:hang` instead makes
//! step `STEP` never finish (before anything of it is written), as a runaway template or a
//! stuck device would, for testing how a run that cannot finish its step is stopped.
//!
//! `THRONG_STEP_DELAY_MS=N` makes every step wait `N` milliseconds before it decides, for
//! tests that watch a run advance step by step: a scripted run on a fast machine otherwise
//! finishes several steps between two looks of the watcher.

use std::sync::OnceLock;
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

fn target() -> Option<&'static (usize, String)> {
    static TARGET: OnceLock<Option<(usize, String)>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let spec = std::env::var("THRONG_CRASH_AT").ok()?;
            let (step, point) = spec.split_once(':')?;
            Some((step.parse().ok()?, point.to_string()))
        })
        .as_ref()
}

/// Aborts the process if the run was asked to crash at `point` of `step`; never returns if it
/// was asked to hang there ([`HANG`]).
pub fn point(step: usize, point: &str) {
    if let Some((s, p)) = target()
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

/// Waits the delay `THRONG_STEP_DELAY_MS` asks each step to wait, if any.
pub(crate) fn pace() {
    static DELAY: OnceLock<Option<Duration>> = OnceLock::new();
    let delay = DELAY.get_or_init(|| {
        let ms = std::env::var("THRONG_STEP_DELAY_MS").ok()?;
        ms.trim().parse().ok().map(Duration::from_millis)
    });
    if let Some(delay) = delay {
        std::thread::sleep(*delay);
    }
}
