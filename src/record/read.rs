//! Reading a run's tables back: Parquet tables whole or in parts, CSV files, each checked
//! against the checksums the run left.

use super::error::RecordError;
use super::names::{STATE, STATE_PARQUET, STEPS};
use super::seal::{self, verify};
use super::table;
use super::writer::StepRecord;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Every state batch of a run: `state.parquet` once the run has finished, else the parts
/// written so far, in order.
pub fn read_state(dir: &Path) -> Result<Vec<arrow_array::RecordBatch>, RecordError> {
    read_table(dir, STATE)
}

/// Every batch of the Parquet table `name` of a run (`<name>.parquet`, or its parts while
/// the run has not finished).
pub fn read_table(dir: &Path, name: &str) -> Result<Vec<arrow_array::RecordBatch>, RecordError> {
    let merged = dir.join(format!("{name}.parquet"));
    let sealed = seal::Sealed::read(dir);
    if merged.exists() {
        sealed.verify(&format!("{name}.parquet"))?;
        return table::read_parquet(&merged);
    }
    sealed.verify_table(name)?;
    let parts = dir.join(format!("{name}.parts"));
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&parts) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .collect(),
        Err(_) => {
            return Err(RecordError::format(
                &merged,
                "missing: the run has written none of this table yet",
            ));
        }
    };
    files.sort();
    let mut batches = Vec::new();
    for file in files {
        if let Some(part) = file.file_name() {
            sealed.verify(&format!("{name}.parts/{}", part.to_string_lossy()))?;
        }
        batches.extend(table::read_parquet(&file)?);
    }
    Ok(batches)
}

/// Whether the run in `dir` has written the Parquet table `name`: it is there, joined or in
/// parts, or the manifest's checksums say the run left it (and [`read_table`] then says it is
/// gone).
pub fn has_table(dir: &Path, name: &str) -> bool {
    dir.join(format!("{name}.parquet")).exists()
        || dir.join(format!("{name}.parts")).exists()
        || seal::Sealed::read(dir).lists_table(name)
}

/// Deserialises every row of `batches` into `R` (for scenarios whose rows are structs).
pub fn rows_of<R: DeserializeOwned>(
    batches: &[arrow_array::RecordBatch],
    dir: &Path,
) -> Result<Vec<R>, RecordError> {
    let mut rows = Vec::new();
    for batch in batches {
        let mut part: Vec<R> = serde_arrow::from_record_batch(batch)
            .map_err(|e| RecordError::format(&dir.join(STATE_PARQUET), e))?;
        rows.append(&mut part);
    }
    Ok(rows)
}

/// Reads a CSV file of the run folder into rows, once it has passed its checksum (see
/// [`verify`]).
pub fn read_csv<R: DeserializeOwned>(path: &Path) -> Result<Vec<R>, RecordError> {
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        verify(dir, &name.to_string_lossy())?;
    }
    let mut reader = csv::Reader::from_path(path).map_err(|e| RecordError::format(path, e))?;
    reader
        .deserialize()
        .collect::<Result<Vec<R>, _>>()
        .map_err(|e| RecordError::format(path, e))
}

/// The columns the runner writes first in every row of a per-cell record (`aggregates.csv`):
/// the cell's arm, population size and replicate, and the step. A scenario's rows hold only
/// its own columns.
pub const CELL_KEYS: [&str; 4] = ["arm", "population", "replicate", "step"];

/// A row of a per-cell record as read back: the cell's keys, and the scenario's own columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyed<T> {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub step: usize,
    /// The scenario's own columns.
    pub row: T,
}

/// A keyed row reads as its own columns too (`row.mean` for `row.row.mean`).
impl<T> std::ops::Deref for Keyed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.row
    }
}

/// Reads a per-cell record (`aggregates.csv`), checked as [`read_csv`] checks: the cell's keys
/// of each row, and its own columns as a `T`.
pub fn read_keyed_csv<T: DeserializeOwned>(path: &Path) -> Result<Vec<Keyed<T>>, RecordError> {
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        verify(dir, &name.to_string_lossy())?;
    }
    let mut reader = csv::Reader::from_path(path).map_err(|e| RecordError::format(path, e))?;
    let headers = reader
        .headers()
        .map_err(|e| RecordError::format(path, e))?
        .clone();
    if !headers.iter().take(CELL_KEYS.len()).eq(CELL_KEYS) {
        return Err(RecordError::format(
            path,
            format!(
                "its first columns are not the cell's keys ({}): it was not written by this \
                 throng's runner",
                CELL_KEYS.join(", ")
            ),
        ));
    }
    let own: csv::StringRecord = headers.iter().skip(CELL_KEYS.len()).collect();
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| RecordError::format(path, e))?;
        let line = record.position().map_or(0, |p| p.line());
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            RecordError::format(path, format!("line {line}: {what}: {e}"))
        };
        let count = |i: usize| -> Result<usize, RecordError> {
            record
                .get(i)
                .unwrap_or_default()
                .parse()
                .map_err(|e| bad(CELL_KEYS[i], &e))
        };
        let rest: csv::StringRecord = record.iter().skip(CELL_KEYS.len()).collect();
        rows.push(Keyed {
            arm: record.get(0).unwrap_or_default().to_string(),
            population: count(1)?,
            replicate: count(2)?,
            step: count(3)?,
            row: rest
                .deserialize(Some(&own))
                .map_err(|e| bad("the scenario's columns", &e))?,
        });
    }
    Ok(rows)
}

/// Reads a run's `steps.csv`.
pub fn read_steps(dir: &Path) -> Result<Vec<StepRecord>, RecordError> {
    read_csv(&dir.join(STEPS))
}
