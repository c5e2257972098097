//! Progress of a run, for whoever runs it: a callback per event, and the progress bar the
//! command line and the Python package show on standard error.

use crate::sim::runner::Progress;
use indicatif::{ProgressBar, ProgressStyle};

/// Watches a run as it goes, on the run's own thread.
pub trait Observer {
    /// The run starts its steps: `planned` decisions in all; `root`: this process is the
    /// job's first rank (the one that speaks for the run).
    fn started(&mut self, _planned: u64, _root: bool) {}
    /// Agents decided, or a step finished.
    fn progress(&mut self, _progress: &Progress) {}
    /// Asked often: `true` stops the run after the current step, paused and resumable (for
    /// a program that watches its own signals, such as the Python package).
    fn stop_requested(&mut self) -> bool {
        false
    }
    /// A stop was asked; the run stops after the current step.
    fn stopping(&mut self) {}
    /// The steps ended: `finished` unless an error or a panic stopped them.
    fn ended(&mut self, _finished: bool) {}
}

/// Nothing shown.
pub struct Quiet;

impl Observer for Quiet {}

/// A progress bar of the run's decisions on standard error, with the last step's size and
/// time.
pub struct Bar {
    bar: ProgressBar,
}

impl Default for Bar {
    fn default() -> Self {
        Self {
            bar: ProgressBar::hidden(),
        }
    }
}

impl Observer for Bar {
    fn started(&mut self, planned: u64, root: bool) {
        self.bar = match root {
            true => ProgressBar::new(planned),
            false => ProgressBar::hidden(),
        };
        self.bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {human_pos}/{human_len} decisions, {per_sec} [{elapsed_precise}, ETA {eta_precise}] {msg}",
            )
            .expect("invariant: a valid template"),
        );
    }

    fn progress(&mut self, progress: &Progress) {
        match progress {
            Progress::Decided(n) => self.bar.inc(*n as u64),
            Progress::Step {
                population,
                step,
                steps,
                step_seconds,
                ..
            } => self.bar.set_message(format!(
                "{population} agents, step {step}/{steps} took {step_seconds:.2}s"
            )),
        }
    }

    fn stopping(&mut self) {
        self.bar.println("throng: stopping after the current step");
    }

    fn ended(&mut self, finished: bool) {
        match finished {
            true => self.bar.finish(),
            false => self.bar.abandon(),
        }
    }
}
