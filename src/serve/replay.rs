//! One step of a run, for stepping through what happened: each numeric state column
//! summarised over every agent of every cell, and the scenario's aggregates of that step.
//! The state is read a batch at a time and never leaves the server as rows.

use crate::record::{AGGREGATES, STATE, STATE_PARQUET, StepRecord};
use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

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

/// Per (population, step, arm, column): the sum and count of a numeric state column over
/// the agents of a Parquet file of the state table (a step's part, or the joined table).
pub type Sums = BTreeMap<(usize, usize, String, String), (f64, usize)>;

/// Sums every numeric state column of the file at `path`, a batch at a time (none when it
/// cannot be read, as while it is being written).
pub fn sums(path: &Path) -> Option<Sums> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).ok()?)
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
        let (Some(pops), Some(steps), Some(arms)) = (whole("population"), whole("step"), arms)
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
            // Rows come in runs of one (population, step, arm): one map entry per run.
            let mut r = 0;
            while r < batch.num_rows() {
                let key = (pops[r], steps[r], arms.value(r));
                let (mut sum, mut n) = (0.0, 0usize);
                while r < batch.num_rows() && (pops[r], steps[r], arms.value(r)) == key {
                    if c.is_valid(r) && c.value(r).is_finite() {
                        sum += c.value(r);
                        n += 1;
                    }
                    r += 1;
                }
                let e = out
                    .entry((
                        key.0 as usize,
                        key.1 as usize,
                        key.2.to_string(),
                        field.name().clone(),
                    ))
                    .or_default();
                e.0 += sum;
                e.1 += n;
            }
        }
    }
    Some(out)
}

/// Key columns, not measurements.
const KEYS: &[&str] = &["population", "replicate", "step", "agent"];

/// The step at position `at` (1-based), or none past the run's steps.
pub fn step(dir: &Path, steps: &[StepRecord], at: usize) -> Option<StepView> {
    let record = steps.get(at.checked_sub(1)?)?;
    let group = steps[..at]
        .windows(2)
        .filter(|w| w[0].population != w[1].population)
        .count();
    let part = dir
        .join(format!("{STATE}.parts"))
        .join(format!("g{group:03}-s{:06}.parquet", record.step));
    let path = if part.is_file() {
        part
    } else {
        dir.join(STATE_PARQUET)
    };
    Some(StepView {
        step: at,
        last_step: steps.len(),
        population: record.population,
        population_step: record.step,
        state: state(&path, record.population, record.step),
        aggregates: aggregates(dir, record.population, record.step),
    })
}

#[derive(Default)]
struct Running {
    n: usize,
    sum: f64,
    min: f64,
    max: f64,
}

fn state(path: &Path, population: usize, step: usize) -> Vec<ColumnSummary> {
    let Some(reader) = std::fs::File::open(path).ok().and_then(|f| {
        ParquetRecordBatchReaderBuilder::try_new(f)
            .ok()?
            .with_batch_size(65536)
            .build()
            .ok()
    }) else {
        return Vec::new();
    };
    let mut acc: BTreeMap<String, Running> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for batch in reader.flatten() {
        let whole = |name: &str| {
            let c = arrow_cast::cast(batch.column_by_name(name)?, &DataType::UInt64).ok()?;
            Some(c.as_primitive::<UInt64Type>().values().to_vec())
        };
        let (Some(pops), Some(steps)) = (whole("population"), whole("step")) else {
            continue;
        };
        let rows: Vec<usize> = (0..batch.num_rows())
            .filter(|&r| pops[r] as usize == population && steps[r] as usize == step)
            .collect();
        if rows.is_empty() {
            continue;
        }
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
            if !order.contains(field.name()) {
                order.push(field.name().clone());
            }
            let e = acc.entry(field.name().clone()).or_insert(Running {
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
                ..Running::default()
            });
            for &r in &rows {
                if c.is_valid(r) && c.value(r).is_finite() {
                    let v = c.value(r);
                    e.n += 1;
                    e.sum += v;
                    e.min = e.min.min(v);
                    e.max = e.max.max(v);
                }
            }
        }
    }
    order
        .into_iter()
        .filter_map(|name| {
            let r = acc.remove(&name)?;
            let some = r.n > 0;
            Some(ColumnSummary {
                column: name,
                agents: r.n,
                mean: some.then(|| r.sum / r.n as f64),
                min: some.then_some(r.min),
                max: some.then_some(r.max),
            })
        })
        .collect()
}

fn aggregates(dir: &Path, population: usize, step: usize) -> Vec<AggregateRow> {
    let Ok(mut reader) = csv::Reader::from_path(dir.join(AGGREGATES)) else {
        return Vec::new();
    };
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
