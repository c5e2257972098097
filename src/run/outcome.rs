//! How a run ended, and what it says of it when it ends.

use crate::sim::runner::Ended;
use std::path::{Path, PathBuf};

/// Where a run was written, and how it ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub dir: PathBuf,
    pub ended: Ended,
    /// The steps this process ran.
    pub steps_done: u64,
    /// Whether a signal (or the embedding program) paused it, rather than `stop_after`.
    pub by_signal: bool,
    /// The ranks of the job.
    pub ranks: usize,
    /// Whether this process is the job's first rank, the one that writes the run folder
    /// (the others' outcomes say nothing of the run).
    pub root: bool,
    /// The report's key numbers, when it was written.
    pub report: Option<String>,
}

impl Outcome {
    /// What the run says on standard output when it ends: how to resume a paused run; the
    /// report's key numbers and where it is; or where the run is.
    pub fn lines(&self) -> Vec<String> {
        if !self.root {
            return Vec::new();
        }
        if self.ended == Ended::Paused {
            return vec![paused(
                &self.dir,
                self.steps_done,
                self.by_signal,
                self.ranks,
            )];
        }
        match &self.report {
            Some(text) => vec![
                text.trim_end().to_string(),
                format!("report: {}", self.dir.join("report.html").display()),
            ],
            None => vec![format!("run: {}", self.dir.display())],
        }
    }
}

fn paused(dir: &Path, steps_done: u64, by_signal: bool, ranks: usize) -> String {
    let why = match by_signal {
        true => "stopped by a signal",
        false => "paused",
    };
    format!(
        "{why} after {steps_done} steps, checkpointed; resume with: {}{}",
        crate::host::resume_command(dir),
        match ranks {
            1 => "",
            _ => " (under mpirun or srun, with any number of ranks)",
        }
    )
}
