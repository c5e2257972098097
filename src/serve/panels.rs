//! The run's measures over its steps, a panel each, so that each has its own scale (a count
//! of 150,000 players and a mean guess near 10 never share an axis): the mean of every numeric
//! state column and every column of the scenario's `aggregates.csv`, per arm (the arms side by
//! side), with a thinner line per replicate; and per group level, the spread (lowest, mean,
//! highest) of its groups' means. Positions count steps across populations, as the page's
//! charts do.

use super::folders::listing;
use super::replay::{self, FileCache, Stat, SumsCache};
use crate::record::{AGGREGATES, GROUPS, STATE, STATE_PARQUET, StepRecord, open};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Panels shown at most: beyond them, the records have the rest.
pub(crate) const PANELS: usize = 24;

/// Replicates drawn as lines of their own at most, per arm (their mean has them all).
pub(crate) const REPLICATE_LINES: usize = 10;

/// The most of `aggregates.csv` read.
const MOST: u64 = 256 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct Panel {
    /// The column measured.
    pub measure: String,
    /// `state` (its mean over agents), `aggregates` (the scenario's per-cell rows), or
    /// `groups` (its group means at `level`).
    pub source: &'static str,
    pub level: Option<String>,
    pub title: String,
    pub lines: Vec<Line>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub arm: String,
    /// `None`: over every replicate of the arm.
    pub replicate: Option<usize>,
    /// In a group level's panel: `mean`, `lowest` or `highest` of its groups' means.
    pub stat: Option<&'static str>,
    /// (step position, value).
    pub points: Vec<(usize, f64)>,
}

/// Per (population, step, arm, level, column): a column's group means at a level, over the
/// groups and replicates of a Parquet file of the groups table.
pub(crate) type LevelSums = BTreeMap<(usize, usize, String, String, String), Stat>;

/// What panels read once per file.
#[derive(Default)]
pub struct Caches {
    pub sums: SumsCache,
    pub levels: FileCache<LevelSums>,
}

/// The panels of the run in `dir`.
pub fn panels(dir: &Path, steps: &[StepRecord], caches: &Caches) -> Vec<Panel> {
    let position: BTreeMap<(usize, usize), usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.population, s.step), i + 1))
        .collect();
    let mut all = state_panels(dir, &position, &caches.sums);
    all.extend(aggregate_panels(dir, &position));
    all.extend(level_panels(dir, &position, &caches.levels));
    all.truncate(PANELS);
    all
}

/// The Parquet files of table `name` of `dir`: the joined table, or its parts while the run
/// goes.
fn table_files(dir: &Path, name: &str) -> Vec<String> {
    let joined = format!("{name}.parquet");
    if listing(dir, "").contains(&joined) {
        return vec![joined];
    }
    let parts = format!("{name}.parts");
    let mut found: Vec<String> = listing(dir, &parts)
        .into_iter()
        .filter(|n| n.ends_with(".parquet"))
        .map(|n| format!("{parts}/{n}"))
        .collect();
    found.sort();
    found
}

/// (arm, replicate, position) -> (sum, n), gathered for one column.
type Gathered = BTreeMap<String, BTreeMap<usize, BTreeMap<usize, (f64, usize)>>>;

/// A panel's lines from what was gathered: per arm the mean over its replicates (of every
/// agent's value, or of the replicates' values), and a line per replicate when there are
/// several.
fn lines_of(arms: Gathered) -> Vec<Line> {
    let mut lines = Vec::new();
    for (arm, replicates) in arms {
        let mut mean: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
        for points in replicates.values() {
            for (&at, &(sum, n)) in points {
                let e = mean.entry(at).or_default();
                e.0 += sum;
                e.1 += n;
            }
        }
        let points = |m: &BTreeMap<usize, (f64, usize)>| {
            m.iter()
                .filter(|(_, (_, n))| *n > 0)
                .map(|(&at, &(sum, n))| (at, sum / n as f64))
                .collect()
        };
        lines.push(Line {
            arm: arm.clone(),
            replicate: None,
            stat: None,
            points: points(&mean),
        });
        if replicates.len() > 1 {
            for (&r, m) in replicates.iter().take(REPLICATE_LINES) {
                lines.push(Line {
                    arm: arm.clone(),
                    replicate: Some(r),
                    stat: None,
                    points: points(m),
                });
            }
        }
    }
    lines
}

fn state_panels(
    dir: &Path,
    position: &BTreeMap<(usize, usize), usize>,
    cache: &SumsCache,
) -> Vec<Panel> {
    let mut by: BTreeMap<String, Gathered> = BTreeMap::new();
    let files = if listing(dir, "").iter().any(|n| n == STATE_PARQUET) {
        vec![STATE_PARQUET.to_string()]
    } else {
        table_files(dir, STATE)
    };
    for name in files {
        let Some(sums) = replay::cached_sums(dir, &name, cache) else {
            continue;
        };
        for ((population, step, arm, replicate, column), stat) in sums.iter() {
            if let Some(&at) = position.get(&(*population, *step)) {
                let e = by
                    .entry(column.clone())
                    .or_default()
                    .entry(arm.clone())
                    .or_default()
                    .entry(*replicate)
                    .or_default()
                    .entry(at)
                    .or_default();
                e.0 += stat.sum;
                e.1 += stat.n;
            }
        }
    }
    by.into_iter()
        .map(|(column, arms)| Panel {
            title: format!("{column} (mean over agents)"),
            measure: column,
            source: "state",
            level: None,
            lines: lines_of(arms),
        })
        .collect()
}

/// Each numeric column of `aggregates.csv` (a row per cell and step).
fn aggregate_panels(dir: &Path, position: &BTreeMap<(usize, usize), usize>) -> Vec<Panel> {
    let Ok(bytes) = open::read(dir, AGGREGATES, MOST) else {
        return Vec::new();
    };
    // Up to its last whole line: a line being appended is not a row yet.
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
    let replicate = col("replicate");
    let keys = ["arm", "population", "replicate", "step", "agent"];
    let values: Vec<usize> = (0..headers.len())
        .filter(|&i| !keys.contains(&&headers[i]))
        .collect();
    let mut by: BTreeMap<usize, Gathered> = BTreeMap::new();
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
        let r = replicate
            .and_then(|c| row.get(c))
            .and_then(|r| r.parse::<usize>().ok())
            .unwrap_or(0);
        for &c in &values {
            match row.get(c).map(str::parse::<f64>) {
                Some(Ok(v)) if v.is_finite() => {
                    let e = by
                        .entry(c)
                        .or_default()
                        .entry(a.to_string())
                        .or_default()
                        .entry(r)
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
    by.into_iter()
        .filter(|(c, _)| numeric[*c])
        .map(|(c, arms)| Panel {
            measure: headers[c].to_string(),
            source: "aggregates",
            level: None,
            title: headers[c].to_string(),
            lines: lines_of(arms),
        })
        .collect()
}

/// Per group level and column, the lowest, mean and highest of the groups' means, per arm.
fn level_panels(
    dir: &Path,
    position: &BTreeMap<(usize, usize), usize>,
    cache: &FileCache<LevelSums>,
) -> Vec<Panel> {
    // (level, column) -> arm -> position -> the groups' means
    let mut by: BTreeMap<(String, String), BTreeMap<String, BTreeMap<usize, Stat>>> =
        BTreeMap::new();
    for name in table_files(dir, GROUPS) {
        let Some(sums) = cache.get(dir, &name, level_sums) else {
            continue;
        };
        for ((population, step, arm, level, column), stat) in sums.iter() {
            if let Some(&at) = position.get(&(*population, *step)) {
                by.entry((level.clone(), column.clone()))
                    .or_default()
                    .entry(arm.clone())
                    .or_default()
                    .entry(at)
                    .or_default()
                    .merge(stat);
            }
        }
    }
    by.into_iter()
        .map(|((level, column), arms)| {
            let mut lines = Vec::new();
            for (arm, points) in arms {
                for (stat, of) in SPREAD {
                    lines.push(Line {
                        arm: arm.clone(),
                        replicate: None,
                        stat: Some(stat),
                        points: points
                            .iter()
                            .filter(|(_, s)| s.n > 0)
                            .map(|(&at, s)| (at, of(s)))
                            .collect(),
                    });
                }
            }
            Panel {
                title: format!("{column}: means of the groups of level {level}"),
                measure: column,
                source: "groups",
                level: Some(level),
                lines,
            }
        })
        .collect()
}

/// A statistic of the groups' means at a step, by name.
type Spread = (&'static str, fn(&Stat) -> f64);

const SPREAD: [Spread; 3] = [
    ("mean", |s| s.sum / s.n as f64),
    ("lowest", |s| s.min),
    ("highest", |s| s.max),
];

/// Sums the group means (`mean_<column>`) of a Parquet file of the groups table, a batch at
/// a time.
fn level_sums(file: std::fs::File) -> Option<LevelSums> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .ok()?
        .with_batch_size(65536)
        .build()
        .ok()?;
    let mut out = LevelSums::new();
    for batch in reader {
        let batch = batch.ok()?;
        add_levels(&batch, &mut out);
    }
    Some(out)
}

fn add_levels(batch: &RecordBatch, out: &mut LevelSums) {
    let whole = |name: &str| {
        let c = arrow_cast::cast(batch.column_by_name(name)?, &DataType::UInt64).ok()?;
        Some(c.as_primitive::<UInt64Type>().values().to_vec())
    };
    let text = |name: &str| {
        let c = arrow_cast::cast(batch.column_by_name(name)?, &DataType::Utf8).ok()?;
        let s = c.as_string::<i32>();
        Some(
            (0..s.len())
                .map(|i| s.value(i).to_string())
                .collect::<Vec<_>>(),
        )
    };
    let (Some(pops), Some(steps), Some(arms), Some(levels)) = (
        whole("population"),
        whole("step"),
        text("arm"),
        text("level"),
    ) else {
        return;
    };
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let Some(measure) = field.name().strip_prefix("mean_") else {
            continue;
        };
        let Ok(c) = arrow_cast::cast(column, &DataType::Float64) else {
            continue;
        };
        let c = c.as_primitive::<Float64Type>();
        for r in 0..batch.num_rows() {
            if c.is_valid(r) && c.value(r).is_finite() {
                out.entry((
                    pops[r] as usize,
                    steps[r] as usize,
                    arms[r].clone(),
                    levels[r].clone(),
                    measure.to_string(),
                ))
                .or_default()
                .add(c.value(r));
            }
        }
    }
}
