//! One run's page data: its summary, every step done, the panels of its measures, the
//! ranks, the controls allowed now, the report's files and the records to download. Only
//! summaries and per-step rows leave the server: never a per-agent table.

use super::control::ChildView;
use super::files;
use super::folders::{Read, RunStatus, RunSummary, Writer};
use super::panels::{self, Caches, Panel};
use crate::record::StepRecord;
use serde::Serialize;
use std::path::Path;

/// A rank counts as slow when its step took this many times the ranks' median.
const SLOW: f64 = 1.5;

#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub summary: RunSummary,
    pub steps: Vec<StepRow>,
    /// A panel per measure, each on its own scale.
    pub panels: Vec<Panel>,
    pub ranks: Vec<RankView>,
    pub controls: Controls,
    pub child: Option<ChildView>,
    /// The report's files, as `/runs/{id}/files/<name>` serves them.
    pub files: Vec<String>,
    /// The records there are to download, from `/runs/{id}/files/<name>` too.
    pub downloads: Vec<String>,
}

/// One step, as `steps.csv` has it, with the rates the page plots.
#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
    #[serde(flatten)]
    pub record: StepRecord,
    pub tokens_per_second: f64,
    /// The rates of the LLM policy's decisions and of scripted ones, apart (`None` for a
    /// step recorded before they were kept).
    pub model_decisions_per_second: Option<f64>,
    pub scripted_decisions_per_second: Option<f64>,
    pub prefix_hit_rate: f64,
    /// Each rank's step time (one entry without MPI).
    pub rank_seconds: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RankView {
    pub rank: usize,
    pub status: &'static str,
    pub last_step: usize,
    pub step_seconds: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Controls {
    pub pause: bool,
    pub resume: bool,
    pub delete: bool,
}

impl Controls {
    /// What may be done to a run now; nothing on a read-only server.
    pub fn of(status: RunStatus, writer: Writer, child_running: bool, read_only: bool) -> Self {
        if read_only {
            return Controls::default();
        }
        Controls {
            // Only a writer of this machine can be signalled.
            pause: status == RunStatus::Running && matches!(writer, Writer::Here(_)),
            resume: matches!(
                status,
                RunStatus::Paused | RunStatus::Interrupted | RunStatus::Failed
            ) && !child_running,
            delete: matches!(status, RunStatus::Finished | RunStatus::Failed)
                && writer == Writer::None
                && !child_running,
        }
    }
}

impl StepRow {
    pub fn of(record: StepRecord) -> Self {
        let tokens = record.prompt_tokens - record.cached_tokens.min(record.prompt_tokens)
            + record.generated_tokens;
        let mut rank_seconds: Vec<f64> = record
            .rank_seconds
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect();
        if rank_seconds.is_empty() {
            rank_seconds.push(record.seconds);
        }
        let rate = |n: usize| n as f64 / record.seconds.max(1e-9);
        let split = record.split();
        StepRow {
            tokens_per_second: tokens as f64 / record.seconds.max(1e-9),
            model_decisions_per_second: split.map(|(m, _)| rate(m)),
            scripted_decisions_per_second: split.map(|(_, s)| rate(s)),
            prefix_hit_rate: record.cached_tokens as f64 / record.prompt_tokens.max(1) as f64,
            rank_seconds,
            record,
        }
    }
}

/// Builds the page data of the run `read` describes.
pub fn detail(
    read: &Read,
    root: &Path,
    child: Option<ChildView>,
    read_only: bool,
    caches: &Caches,
) -> RunDetail {
    let summary = read.summary(root);
    let steps: Vec<StepRow> = read.steps.iter().cloned().map(StepRow::of).collect();
    let child_running = child.as_ref().is_some_and(|c| c.running);
    let error = read.manifest.as_ref().ok().and_then(|m| m.error.clone());
    RunDetail {
        controls: Controls::of(summary.status, read.writer, child_running, read_only),
        panels: panels::panels(&read.dir, &read.steps, caches),
        ranks: ranks(&steps, summary.status, error.as_deref()),
        files: files::report_files(&read.dir),
        downloads: files::downloads(&read.dir),
        child,
        summary,
        steps,
    }
}

/// Per rank, its last step time, and whether it stands out: slow (well above the ranks'
/// median), or lost (the run failed naming it: it stopped answering, or failed itself).
fn ranks(steps: &[StepRow], status: RunStatus, error: Option<&str>) -> Vec<RankView> {
    let Some(last) = steps.last() else {
        return Vec::new();
    };
    let mut sorted = last.rank_seconds.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    last.rank_seconds
        .iter()
        .enumerate()
        .map(|(rank, &s)| RankView {
            rank,
            status: if !s.is_finite()
                || (status == RunStatus::Failed && error.is_some_and(|e| names_rank(e, rank)))
            {
                "lost"
            } else if sorted.len() > 1 && s > SLOW * median && s > median + 0.01 {
                "slow"
            } else if status == RunStatus::Interrupted && sorted.len() > 1 {
                "stopped"
            } else {
                "ok"
            },
            last_step: steps.len(),
            step_seconds: s.is_finite().then_some(s),
        })
        .collect()
}

/// Whether a run's error names rank `rank` (`rank 3: ...`, `rank 3 did not answer`).
fn names_rank(error: &str, rank: usize) -> bool {
    let word = format!("rank {rank}");
    error.match_indices(&word).any(|(at, _)| {
        !error[at + word.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}
