//! One step of a run, for stepping through what happened: each numeric state column
//! summarised over every agent of every cell, and the scenario's aggregates of that step.
//! The state is read a batch at a time and never leaves the server as rows.

use crate::record::{AGGREGATES, STATE, STATE_PARQUET, StepRecord, open};
use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

#[derive(Debug, Serialize)]
pub struct StepView {
    /// The step's position among the run's steps (1-based).
    pub step: usize,
    pub last_step: usize,
    pub population: usize,
    /// The step within its population.
    pub population_step: usize,
    pub state: Vec<ColumnSummary>,
    pub aggregates: Vec<AggregateRow>,
}

#[derive(Debug, Serialize)]
pub struct ColumnSummary {
    pub column: String,
    pub agents: usize,
    pub mean: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct AggregateRow {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub values: BTreeMap<String, serde_json::Value>,
}

/// A numeric column over some agents.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub sum: f64,
    pub n: usize,
    pub min: f64,
    pub max: f64,
}

impl Default for Stat {
    fn default() -> Self {
        Stat {
            sum: 0.0,
            n: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl Stat {
    pub fn add(&mut self, v: f64) {
        self.sum += v;
        self.n += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub(crate) fn merge(&mut self, o: &Stat) {
        self.sum += o.sum;
        self.n += o.n;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

/// Per (population, step, arm, replicate, column): a numeric state column over the agents
/// of a Parquet file of the state table (a step's part, or the joined table).
pub(crate) type Sums = BTreeMap<(usize, usize, String, usize, String), Stat>;

/// What was computed from the files of run folders read so far, by path, with the size and
/// time each had: a step's part (or a joined table) is read once, however often pages ask.
pub struct FileCache<T>(Mutex<HashMap<PathBuf, Stamped<T>>>);

/// A value computed from a file, with the size and time the file had.
type Stamped<T> = (u64, Option<SystemTime>, Arc<T>);

impl<T> Default for FileCache<T> {
    fn default() -> Self {
        FileCache(Mutex::default())
    }
}

impl<T> FileCache<T> {
    /// `compute` of the file `name` of `dir` (opened as [`open::regular`] does), from the
    /// cache while the file has not changed; none when it cannot be read.
    pub fn get(
        &self,
        dir: &Path,
        name: &str,
        compute: impl FnOnce(std::fs::File) -> Option<T>,
    ) -> Option<Arc<T>> {
        let file = open::regular(dir, name).ok()?;
        let meta = file.metadata().ok()?;
        let stamp = (meta.len(), meta.modified().ok());
        let path = dir.join(name);
        let known = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&path)
            .filter(|(len, time, _)| (*len, *time) == stamp)
            .map(|(_, _, value)| Arc::clone(value));
        if known.is_some() {
            return known;
        }
        let value = Arc::new(compute(file)?);
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path, (stamp.0, stamp.1, Arc::clone(&value)));
        Some(value)
    }
}

/// The sums of the state files read so far.
pub(crate) type SumsCache = FileCache<Sums>;

/// [`sums`] of the state file `name` of `dir`, from `cache` while it has not changed.
pub(crate) fn cached_sums(dir: &Path, name: &str, cache: &SumsCache) -> Option<Arc<Sums>> {
    cache.get(dir, name, sums)
}

/// Sums every numeric state column of `file`, a batch at a time (none when it cannot be
/// read, as while it is being written).
pub fn sums(file: std::fs::File) -> Option<Sums> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .ok()?
        .with_batch_size(65536)
        .build()
        .ok()?;
    let mut out = Sums::new();
    for batch in reader {
        let batch = batch.ok()?;
        let whole = |name: &str| {
            let c = arrow_cast::cast(batch.column_by_name(name)?, &DataType::UInt64).ok()?;
            Some(c.as_primitive::<UInt64Type>().values().to_vec())
        };
        let arms = batch
            .column_by_name("arm")
            .and_then(|c| arrow_cast::cast(c, &DataType::Utf8).ok());
        let (Some(pops), Some(steps), Some(reps), Some(arms)) =
            (whole("population"), whole("step"), whole("replicate"), arms)
        else {
            continue;
        };
        let arms = arms.as_string::<i32>();
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let dt = field.data_type();
            if KEYS.contains(&field.name().as_str())
                || !(dt.is_numeric() || dt == &DataType::Boolean)
            {
                continue;
            }
            let Ok(c) = arrow_cast::cast(column, &DataType::Float64) else {
                continue;
            };
            let c = c.as_primitive::<Float64Type>();
            // Rows come in runs of one cell and step: one map entry per run.
            let mut r = 0;
            while r < batch.num_rows() {
                let key = (pops[r], steps[r], arms.value(r), reps[r]);
                let mut stat = Stat::default();
                while r < batch.num_rows() && (pops[r], steps[r], arms.value(r), reps[r]) == key {
                    if c.is_valid(r) && c.value(r).is_finite() {
                        stat.add(c.value(r));
                    }
                    r += 1;
                }
                out.entry((
                    key.0 as usize,
                    key.1 as usize,
                    key.2.to_string(),
                    key.3 as usize,
                    field.name().clone(),
                ))
                .or_default()
                .merge(&stat);
            }
        }
    }
    Some(out)
}

/// Key columns, not measurements.
const KEYS: &[&str] = &["population", "replicate", "step", "agent"];

/// The state file holding the step at position `at` (1-based), by its name in `dir`: its
/// part while the run has not joined them (named by the population's place among the run's
/// sizes and the step within it), else the joined table.
pub(crate) fn state_file(dir: &Path, steps: &[StepRecord], at: usize) -> Option<String> {
    let record = steps.get(at.checked_sub(1)?)?;
    let group = steps[..at]
        .windows(2)
        .filter(|w| w[0].population != w[1].population)
        .count();
    let part = format!("{STATE}.parts/g{group:03}-s{:06}.parquet", record.step);
    Some(if open::regular(dir, &part).is_ok() {
        part
    } else {
        STATE_PARQUET.to_string()
    })
}

/// The step at position `at` (1-based), or none past the run's steps.
pub fn step(dir: &Path, steps: &[StepRecord], at: usize, cache: &SumsCache) -> Option<StepView> {
    let record = steps.get(at.checked_sub(1)?)?;
    let name = state_file(dir, steps, at)?;
    Some(StepView {
        step: at,
        last_step: steps.len(),
        population: record.population,
        population_step: record.step,
        state: state(dir, &name, record.population, record.step, cache),
        aggregates: aggregates(dir, record.population, record.step),
    })
}

/// Each numeric column at one step, over every arm's agents, in column order.
fn state(
    dir: &Path,
    name: &str,
    population: usize,
    step: usize,
    cache: &SumsCache,
) -> Vec<ColumnSummary> {
    let Some(sums) = cached_sums(dir, name, cache) else {
        return Vec::new();
    };
    let mut by: BTreeMap<&str, Stat> = BTreeMap::new();
    for ((p, s, _, _, column), stat) in sums.iter() {
        if (*p, *s) == (population, step) {
            by.entry(column).or_default().merge(stat);
        }
    }
    by.into_iter()
        .map(|(column, stat)| {
            let some = stat.n > 0;
            ColumnSummary {
                column: column.to_string(),
                agents: stat.n,
                mean: some.then(|| stat.sum / stat.n as f64),
                min: some.then_some(stat.min),
                max: some.then_some(stat.max),
            }
        })
        .collect()
}

fn aggregates(dir: &Path, population: usize, step: usize) -> Vec<AggregateRow> {
    let Ok(file) = open::regular(dir, AGGREGATES) else {
        return Vec::new();
    };
    let mut reader = csv::Reader::from_reader(std::io::BufReader::new(file));
    let Ok(headers) = reader.headers().cloned() else {
        return Vec::new();
    };
    let col = |name: &str| headers.iter().position(|h| h == name);
    let (Some(arm), Some(pop), Some(rep), Some(st)) =
        (col("arm"), col("population"), col("replicate"), col("step"))
    else {
        return Vec::new();
    };
    reader
        .records()
        .flatten()
        .filter(|r| {
            r.get(pop).and_then(|p| p.parse().ok()) == Some(population)
                && r.get(st).and_then(|s| s.parse().ok()) == Some(step)
        })
        .take(1000)
        .map(|r| AggregateRow {
            arm: r[arm].to_string(),
            population,
            replicate: r[rep].parse().unwrap_or(0),
            values: headers
                .iter()
                .enumerate()
                .filter(|(i, _)| ![arm, pop, rep, st].contains(i))
                .map(|(i, h)| {
                    let v = &r[i];
                    let value = v
                        .parse::<f64>()
                        .ok()
                        .and_then(|x| {
                            serde_json::Number::from_f64(x).map(serde_json::Value::Number)
                        })
                        .unwrap_or_else(|| serde_json::Value::String(v.to_string()));
                    (h.to_string(), value)
                })
                .collect(),
        })
        .collect()
}
