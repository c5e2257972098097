//! A run's folder: the resolved config, a manifest, the per-step state of every agent
//! (Parquet for pandas/polars, and CSV), decisions (JSON Lines), step timings, per-step
//! aggregates, the cells' fixed data, and checkpoints. Everything is written as the run goes,
//! so an interrupted run keeps every finished step and can resume from the last one.
//!
//! Plain data: this module knows nothing of scenarios, policies or the engine.

pub mod checkpoint;
mod decision;
mod folder;
pub mod inputs;
mod manifest;
pub mod open;
mod seal;
pub mod store;
pub mod table;
mod writer;

pub use decision::{DecisionLog, DecisionRecord};
pub use folder::{
    CONFIG_ORIGINAL, FolderError, FolderLock, LOCK, LockHolder, RunFolder, holder, host,
    lock_for_report, lock_state, never_started,
};
pub use manifest::{
    CounterfactualRecord, Counters, EngineRecord, FileSum, LoadedModelRecord, Manifest,
    ModelRecord, ReuseRecord, Status, peak_rss_bytes,
};
pub use seal::{checksums, record_files, verify};
pub use writer::{
    KeptPrompt, StepRecord, StepWriter, merge_parts, reset as writer_reset, rewind as writer_rewind,
};

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

pub const CONFIG: &str = "config.toml";
pub const MANIFEST: &str = "manifest.json";
/// The cells' fixed data (a market's network, a population's make-up), one JSON line per
/// cell, appended as each population size starts.
pub const CELLS: &str = "cells.jsonl";
/// The state table's name: `state.parquet`, written in parts under `state.parts/`.
pub const STATE: &str = "state";
pub const STATE_CSV: &str = "state.csv";
/// The agents' LLM-written personas: `personas.parquet`, one row per agent of each replicate
/// of each population size, written as each population size starts.
pub const PERSONAS: &str = "personas";
/// Each group level's aggregates (`groups.parquet`): per step, per group, its place, size and
/// the mean of every numeric state column over its members. Written only when the config has
/// `[[population.groups]]`.
pub const GROUPS: &str = "groups";
pub const STATE_PARQUET: &str = "state.parquet";
pub const DECISIONS: &str = "decisions.jsonl";
/// The whole prompts of logged model decisions, once per distinct prompt (`{hash, text}`).
pub const PROMPTS: &str = "prompts.jsonl";
pub const STEPS: &str = "steps.csv";
pub const AGGREGATES: &str = "aggregates.csv";

/// One line of `cells.jsonl`: a cell and what its scenario says about it before it runs.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct CellRecord {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub world: serde_json::Value,
}

/// The first `limit` cells of a run's `cells.jsonl` (at 100,000 replicates the file holds
/// gigabytes), once the whole file has passed its checksum (see [`verify`]).
pub fn read_cells(dir: &Path, limit: usize) -> Result<Vec<CellRecord>, RecordError> {
    use std::io::BufRead;
    verify(dir, CELLS)?;
    let path = dir.join(CELLS);
    let file = std::fs::File::open(&path).map_err(|e| RecordError::io(&path, e))?;
    std::io::BufReader::new(file)
        .lines()
        .take(limit)
        .enumerate()
        .map(|(i, line)| {
            let line = line.map_err(|e| RecordError::io(&path, e))?;
            serde_json::from_str(&line)
                .map_err(|e| RecordError::format(&path, format!("line {}: {e}", i + 1)))
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
}

impl RecordError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        RecordError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn format(path: &Path, message: impl ToString) -> Self {
        RecordError::Format {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

/// For tests of a full disk without one: `THRONG_FULL_DISK_AT=POINT` makes a new run's first
/// write at `POINT` (`manifest`, `config`) fail as a full disk does, leaving the file it was
/// writing empty. Does nothing otherwise.
pub fn full_disk_at(point: &str, path: &Path) -> Result<(), RecordError> {
    if std::env::var("THRONG_FULL_DISK_AT").is_ok_and(|p| p == point) {
        let _ = std::fs::File::create(path);
        // ENOSPC, as the kernel reports a full disk.
        return Err(RecordError::io(path, std::io::Error::from_raw_os_error(28)));
    }
    Ok(())
}

/// Held while this process writes a JSON file, so that a run stopped at once (from a thread
/// of its own, see [`pause_at_once`]) never writes the manifest while the run writes it.
static JSON_WRITES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn hold_json_writes() -> std::sync::MutexGuard<'static, ()> {
    JSON_WRITES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `value` as pretty JSON atomically (a crash leaves the old file or the new one).
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let _held = hold_json_writes();
    write_json_via(path, &path.with_extension("json.tmp"), value)
}

fn write_json_via<T: Serialize>(path: &Path, tmp: &Path, value: &T) -> Result<(), RecordError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| RecordError::format(path, e))?;
    let written = std::fs::write(tmp, text)
        .map_err(|e| RecordError::io(tmp, e))
        .and_then(|()| std::fs::rename(tmp, path).map_err(|e| RecordError::io(path, e)));
    if written.is_err() {
        // A full disk leaves a cut-short copy: remove it, the old file is still whole.
        let _ = std::fs::remove_file(tmp);
    }
    written
}

/// For a process about to exit in the middle of a step (a second signal, or a step that did
/// not finish in time): marks the run in `dir` paused if its manifest says it is running,
/// and holds back every later JSON write of this process, so that nothing written after
/// contradicts it. The records end at the last checkpoint, as after a kill, and `--resume`
/// continues from there. Returns the manifest as the folder now has it.
///
/// The manifest is written through a file of this process's own (`manifest.json.<pid>.tmp`),
/// since another rank of the job may mark the same folder at the same moment.
pub fn pause_at_once(dir: &Path) -> Result<Manifest, RecordError> {
    let held = hold_json_writes();
    // Whatever happens next, this process writes no more JSON.
    std::mem::forget(held);
    let path = dir.join(MANIFEST);
    let mut manifest: Manifest = read_json(&path)?;
    if manifest.status == Status::Running {
        manifest.status = Status::Paused;
        let tmp = dir.join(format!("{MANIFEST}.{}.tmp", std::process::id()));
        write_json_via(&path, &tmp, &manifest)?;
    }
    Ok(manifest)
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|e| RecordError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| RecordError::format(path, e))
}

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

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
