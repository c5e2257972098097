//! A run's folder: the resolved config, a manifest, the per-step state of every agent
//! (CSV, and Parquet for pandas/polars), every decision (JSON Lines), step timings, the
//! cells' fixed data, and a checkpoint. Everything is written as the run goes, so an
//! interrupted run keeps every finished step and can resume from the last one.

mod writer;

pub use writer::{DecisionRecord, StepRecord, StepWriter, merge_parts, rewind as writer_rewind};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const CONFIG: &str = "config.toml";
pub const MANIFEST: &str = "manifest.json";
pub const CELLS: &str = "cells.json";
pub const STATE_CSV: &str = "state.csv";
pub const STATE_PARQUET: &str = "state.parquet";
pub const STATE_PARTS: &str = "state.parts";
pub const DECISIONS: &str = "decisions.jsonl";
pub const STEPS: &str = "steps.csv";
pub const CHECKPOINT: &str = "checkpoint.json";

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

/// What ran, with what, and how long it took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub scenario: String,
    pub config_file: String,
    pub seed: u64,
    pub policy: String,
    pub model: Option<String>,
    pub weights: Option<String>,
    pub device: Option<String>,
    pub throng_version: String,
    pub arms: Vec<String>,
    pub populations: Vec<usize>,
    pub replicates: usize,
    pub steps: usize,
    /// `running`, `finished` or `interrupted`.
    pub status: String,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    pub seconds: f64,
    pub decisions: u64,
    pub fallbacks: u64,
    pub clamped: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub prefix_hit_rate: Option<f64>,
    pub preemptions: Option<u64>,
}

/// Writes `value` as pretty JSON atomically (a crash leaves the old file or the new one).
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(|e| RecordError::format(path, e))?;
    std::fs::write(&tmp, text).map_err(|e| RecordError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| RecordError::io(path, e))
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|e| RecordError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| RecordError::format(path, e))
}

/// Reads every row of a run's `state.csv`.
pub fn read_state<R: DeserializeOwned>(dir: &Path) -> Result<Vec<R>, RecordError> {
    let path = dir.join(STATE_CSV);
    let mut reader = csv::Reader::from_path(&path).map_err(|e| RecordError::format(&path, e))?;
    reader
        .deserialize()
        .collect::<Result<Vec<R>, _>>()
        .map_err(|e| RecordError::format(&path, e))
}

/// Reads a run's `steps.csv`.
pub fn read_steps(dir: &Path) -> Result<Vec<StepRecord>, RecordError> {
    let path = dir.join(STEPS);
    let mut reader = csv::Reader::from_path(&path).map_err(|e| RecordError::format(&path, e))?;
    reader
        .deserialize()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RecordError::format(&path, e))
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
