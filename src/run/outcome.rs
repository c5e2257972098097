//! How a run ended, and what it says of it when it ends.

use crate::host::Program;
use crate::sim::runner::Ended;
use std::path::PathBuf;

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
    /// How to name the program that resumes it.
    pub program: Program,
}

impl Outcome {
    /// What the run says on standard output when it ends: how to resume a paused run; the
    /// report's key numbers and where it is; or where the run is.
    pub fn lines(&self) -> Vec<String> {
        if !self.root {
            return Vec::new();
        }
        if self.ended == Ended::Paused {
            return vec![paused(self)];
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

fn paused(outcome: &Outcome) -> String {
    let why = match outcome.by_signal {
        true => "stopped by a signal",
        false => "paused",
    };
    format!(
        "{why} after {} steps, checkpointed; resume with: {}{}",
        outcome.steps_done,
        outcome.program.resume_command(&outcome.dir),
        match outcome.ranks {
            1 => "",
            _ => " (under mpirun or srun, with any number of ranks)",
        }
    )
}
