//! One run's page data: its summary, every step done, the scenario's headline series, the
//! ranks, the controls allowed now, and the report's files. Only summaries and per-step rows
//! leave the server: never a per-agent table.

use super::control::ChildView;
use super::folders::{Read, RunStatus, RunSummary, Writer};
use super::replay;
use crate::record::{AGGREGATES, STATE, STATE_PARQUET, StepRecord};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use super::replay::SumsCache;

/// Headline series shown at most: beyond them, `aggregates.csv` has the rest.
const SERIES: usize = 12;

/// A rank counts as slow when its step took this many times the ranks' median.
const SLOW: f64 = 1.5;

#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub summary: RunSummary,
    pub steps: Vec<StepRow>,
    pub series: Vec<Series>,
    pub ranks: Vec<RankView>,
    pub controls: Controls,
    pub child: Option<ChildView>,
    /// The report's files, as `/runs/{id}/files/<name>` serves them.
    pub files: Vec<String>,
}

/// One step, as `steps.csv` has it, with the rates the page plots.
#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
    #[serde(flatten)]
    pub record: StepRecord,
    pub tokens_per_second: f64,
    pub prefix_hit_rate: f64,
    /// Each rank's step time (one entry without MPI).
    pub rank_seconds: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    /// (step position, value): the position counts steps across populations, as the page's
    /// charts do.
    pub points: Vec<(usize, f64)>,
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
        StepRow {
            tokens_per_second: tokens as f64 / record.seconds.max(1e-9),
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
    cache: &SumsCache,
) -> RunDetail {
    let summary = read.summary(root);
    let steps: Vec<StepRow> = read.steps.iter().cloned().map(StepRow::of).collect();
    let child_running = child.as_ref().is_some_and(|c| c.running);
    let error = read.manifest.as_ref().ok().and_then(|m| m.error.clone());
    let mut series = state_series(&read.dir, &read.steps, cache);
    series.extend(aggregate_series(&read.dir, &read.steps));
    series.truncate(SERIES);
    RunDetail {
        controls: Controls::of(summary.status, read.writer, child_running, read_only),
        series,
        ranks: ranks(&steps, summary.status, error.as_deref()),
        files: report_files(&read.dir),
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

/// The generic headline series: the mean of every numeric state column over the agents of
/// each arm, at each step. Each state file is read once (see [`SumsCache`]).
pub fn state_series(dir: &Path, steps: &[StepRecord], cache: &SumsCache) -> Vec<Series> {
    let joined = dir.join(STATE_PARQUET);
    let files: Vec<PathBuf> = if joined.is_file() {
        vec![joined]
    } else {
        let mut parts: Vec<PathBuf> = std::fs::read_dir(dir.join(format!("{STATE}.parts")))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
                    .collect()
            })
            .unwrap_or_default();
        parts.sort();
        parts
    };
    let position: BTreeMap<(usize, usize), usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.population, s.step), i + 1))
        .collect();
    let mut by: BTreeMap<(String, String), BTreeMap<usize, (f64, usize)>> = BTreeMap::new();
    for file in files {
        let Some(sums) = replay::cached_sums(&file, cache) else {
            continue;
        };
        for ((population, step, arm, column), stat) in sums.iter() {
            if let Some(&at) = position.get(&(*population, *step)) {
                let e = by
                    .entry((column.clone(), arm.clone()))
                    .or_default()
                    .entry(at)
                    .or_default();
                e.0 += stat.sum;
                e.1 += stat.n;
            }
        }
    }
    by.into_iter()
        .map(|((column, arm), points)| Series {
            name: format!("mean {column} ({arm})"),
            points: points
                .into_iter()
                .filter(|(_, (_, n))| *n > 0)
                .map(|(at, (sum, n))| (at, sum / n as f64))
                .collect(),
        })
        .collect()
}

/// The scenario's own series: each numeric column of `aggregates.csv`, per arm and
/// population, its mean over replicates at each step.
pub fn aggregate_series(dir: &Path, steps: &[StepRecord]) -> Vec<Series> {
    let Ok(bytes) = std::fs::read(dir.join(AGGREGATES)) else {
        return Vec::new();
    };
    let whole = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    let mut reader = csv::Reader::from_reader(whole);
    let Ok(headers) = reader.headers().cloned() else {
        return Vec::new();
    };
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (Some(arm), Some(population), Some(step)) = (col("arm"), col("population"), col("step"))
    else {
        return Vec::new();
    };
    let keys = ["arm", "population", "replicate", "step", "agent"];
    let values: Vec<usize> = (0..headers.len())
        .filter(|&i| !keys.contains(&&headers[i]))
        .collect();
    // The position of (population, step) among the run's steps.
    let position: BTreeMap<(usize, usize), usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.population, s.step), i + 1))
        .collect();
    // (column, arm, population) -> position -> (sum, n)
    type Acc = BTreeMap<usize, (f64, usize)>;
    let mut acc: BTreeMap<(usize, String, usize), Acc> = BTreeMap::new();
    let mut numeric = vec![true; headers.len()];
    for row in reader.records().flatten() {
        let (Some(a), Some(p), Some(s)) = (
            row.get(arm),
            row.get(population).and_then(|p| p.parse::<usize>().ok()),
            row.get(step).and_then(|s| s.parse::<usize>().ok()),
        ) else {
            continue;
        };
        let Some(&at) = position.get(&(p, s)) else {
            continue;
        };
        for &c in &values {
            match row.get(c).map(str::parse::<f64>) {
                Some(Ok(v)) if v.is_finite() => {
                    let e = acc
                        .entry((c, a.to_string(), p))
                        .or_default()
                        .entry(at)
                        .or_default();
                    e.0 += v;
                    e.1 += 1;
                }
                Some(Ok(_)) | None => {}
                Some(Err(_)) => {
                    if !row[c].is_empty() {
                        numeric[c] = false;
                    }
                }
            }
        }
    }
    acc.into_iter()
        .filter(|((c, _, _), _)| numeric[*c])
        .take(SERIES)
        .map(|((c, arm, population), points)| Series {
            name: format!("{} ({arm}, n={population})", &headers[c]),
            points: points
                .into_iter()
                .map(|(at, (sum, n))| (at, sum / n as f64))
                .collect(),
        })
        .collect()
}

/// The report's files in `dir`: `report.html`, the figures it shows and the tables beside it.
/// The server serves a file only when its name is one of these, found here, never one
/// built from what a client sent.
pub fn report_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let wanted = |name: &str| {
        name == "report.html"
            || name == "summary.json"
            || name == "means.csv"
            || name.ends_with(".svg")
            || name.ends_with(".png")
    };
    for (sub, prefix) in [(dir.to_path_buf(), ""), (dir.join("figures"), "figures/")] {
        let Ok(entries) = std::fs::read_dir(&sub) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Some(name) = e.file_name().to_str()
                && wanted(name)
            {
                files.push(format!("{prefix}{name}"));
            }
        }
    }
    files.sort();
    files
}
