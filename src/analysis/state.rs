//! A run's state table flattened for the reports: per row its keys, its breakdown labels
//! (coded, so that a million agents' rows hold numbers, not strings) and its numbers.

use super::{ColumnProblem, ReportError};
use crate::record::columns::wholes;
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;

/// Columns that are keys, not measurements.
pub(super) const KEYS: &[&str] = &["population", "replicate", "step", "agent"];

/// A state table's rows flattened: per row its keys, its breakdown labels and its numbers.
#[derive(Default)]
pub(super) struct Table {
    /// Labels coded per column, so that a million agents' rows hold numbers, not strings.
    pub(super) arm: Coded,
    pub(super) population: Vec<u32>,
    pub(super) replicate: Vec<u32>,
    pub(super) step: Vec<u32>,
    /// Breakdowns: (name, labels).
    pub(super) by: Vec<(String, Coded)>,
    /// (column, value per row; NaN where missing).
    pub(super) numbers: Vec<(String, Vec<f64>)>,
}

/// A text column as a code per row into its distinct labels.
#[derive(Default)]
pub(super) struct Coded {
    pub(super) labels: Vec<String>,
    pub(super) codes: Vec<u32>,
    index: std::collections::HashMap<String, u32>,
}

impl Coded {
    fn extend(&mut self, column: &dyn Array) -> Option<()> {
        let utf8 = arrow_cast::cast(column, &DataType::Utf8).ok()?;
        let s = utf8.as_string::<i32>();
        for i in 0..s.len() {
            let label = if s.is_valid(i) { s.value(i) } else { "-" };
            let code = match self.index.get(label) {
                Some(&c) => c,
                None => {
                    let c = self.labels.len() as u32;
                    self.labels.push(label.to_string());
                    self.index.insert(label.to_string(), c);
                    c
                }
            };
            self.codes.push(code);
        }
        Some(())
    }
}

/// Reads the rows of `batches` (one scenario's state table).
pub(super) fn flatten(batches: &[RecordBatch], levels: &[String]) -> Result<Table, ReportError> {
    let mut t = Table::default();
    let Some(first) = batches.first() else {
        return Ok(t);
    };
    let schema = first.schema();
    for name in ["arm", "population", "replicate", "step"] {
        if schema.column_with_name(name).is_none() {
            return Err(ReportError::Column {
                table: "state table",
                column: name.into(),
                problem: ColumnProblem::Missing,
            });
        }
    }
    for field in schema.fields() {
        let name = field.name();
        let dt = field.data_type();
        if name == "arm" || KEYS.contains(&name.as_str()) || levels.contains(name) {
            continue;
        }
        if dt.is_numeric() || dt == &DataType::Boolean {
            t.numbers.push((name.clone(), Vec::new()));
        } else if matches!(
            dt,
            DataType::Dictionary(..) | DataType::Utf8 | DataType::LargeUtf8
        ) {
            t.by.push((name.clone(), Coded::default()));
        }
    }
    let unreadable = |name: &str| ReportError::Column {
        table: "state table",
        column: name.into(),
        problem: ColumnProblem::MissingFromPart,
    };
    for batch in batches {
        let get = |name: &str| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| unreadable(name))
        };
        t.arm.extend(get("arm")?.as_ref());
        for (name, into) in [
            ("population", &mut t.population),
            ("replicate", &mut t.replicate),
            ("step", &mut t.step),
        ] {
            into.extend(
                wholes(get(name)?.as_ref())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|v| v as u32),
            );
        }
        for (name, coded) in &mut t.by {
            coded.extend(get(name)?.as_ref());
        }
        for (name, values) in &mut t.numbers {
            let c = arrow_cast::cast(get(name)?.as_ref(), &DataType::Float64).map_err(|e| {
                ReportError::Column {
                    table: "state table",
                    column: name.clone(),
                    problem: ColumnProblem::Unreadable(e),
                }
            })?;
            let c = c.as_primitive::<Float64Type>();
            values.extend((0..c.len()).map(|i| if c.is_valid(i) { c.value(i) } else { f64::NAN }));
        }
    }
    // Breakdowns with one label (nothing to compare) or a label per agent (names) say
    // nothing as means: keep those with 2 to 24 labels.
    t.by.retain(|(_, coded)| (2..=24).contains(&coded.labels.len()));
    Ok(t)
}

/// A run's aggregates table (`aggregates.csv`, a row per cell and step) as a [`Table`]: its
/// keys, and every column whose values are all numbers or booleans (an empty field is
/// missing). It has no breakdowns.
pub(super) fn aggregates(path: &std::path::Path) -> Result<Table, ReportError> {
    let failed = |e: csv::Error| ReportError::Message(format!("{}: {e}", path.display()));
    let mut reader = csv::Reader::from_path(path).map_err(failed)?;
    let headers = reader.headers().map_err(failed)?.clone();
    let column = |name: &str| headers.iter().position(|h| h == name);
    let (Some(arm), Some(population), Some(replicate), Some(step)) = (
        column("arm"),
        column("population"),
        column("replicate"),
        column("step"),
    ) else {
        return Err(ReportError::Message(format!(
            "{}: an aggregates table needs the columns arm, population, replicate and step",
            path.display()
        )));
    };
    let mut t = Table::default();
    let mut values: Vec<Option<Vec<f64>>> = headers.iter().map(|_| Some(Vec::new())).collect();
    let mut arms = Vec::new();
    for record in reader.records() {
        let record = record.map_err(failed)?;
        let whole = |i: usize| {
            record
                .get(i)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        arms.push(record.get(arm).unwrap_or("-").to_string());
        t.population.push(whole(population));
        t.replicate.push(whole(replicate));
        t.step.push(whole(step));
        for (i, kept) in values.iter_mut().enumerate() {
            let Some(column) = kept else { continue };
            let field = record.get(i).unwrap_or("");
            let value = match field {
                "" => Some(f64::NAN),
                "true" => Some(1.0),
                "false" => Some(0.0),
                v => v.parse::<f64>().ok(),
            };
            match value {
                Some(v) => column.push(v),
                None => *kept = None,
            }
        }
    }
    let arms = arrow_array::StringArray::from(arms);
    t.arm.extend(&arms);
    t.numbers = headers
        .iter()
        .zip(values)
        .filter(|(name, _)| *name != "arm" && !KEYS.contains(name))
        .filter_map(|(name, v)| Some((name.to_string(), v?)))
        .collect();
    Ok(t)
}
