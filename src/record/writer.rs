//! Appends each finished step to the run's files and flushes them, and remembers their
//! lengths so that a resumed run can cut away a half-written step.

use super::{DECISIONS, RecordError, STATE_CSV, STATE_PARQUET, STATE_PARTS, STEPS};
use serde::{Deserialize, Serialize};
use serde_arrow::schema::{SchemaLike, TracingOptions};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One decision in `decisions.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub step: usize,
    pub agent: usize,
    #[serde(flatten)]
    pub log: crate::sim::policy::DecisionLog,
    /// The decision as applied (after clamps, or the fallback).
    pub decision: serde_json::Value,
}

/// One step of one population in `steps.csv`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub population: usize,
    pub step: usize,
    pub cells: usize,
    pub decisions: usize,
    pub fallbacks: usize,
    pub seconds: f64,
    pub decisions_per_second: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated_tokens: usize,
}

pub struct StepWriter {
    dir: PathBuf,
    state: csv::Writer<BufWriter<File>>,
    decisions: BufWriter<File>,
    steps: csv::Writer<BufWriter<File>>,
}

fn append(path: &Path) -> Result<File, RecordError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| RecordError::io(path, e))
}

/// A CSV writer that writes the header only into an empty file.
fn csv_appender(path: &Path) -> Result<csv::Writer<BufWriter<File>>, RecordError> {
    let fresh = std::fs::metadata(path)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    Ok(csv::WriterBuilder::new()
        .has_headers(fresh)
        .from_writer(BufWriter::new(append(path)?)))
}

impl StepWriter {
    /// Opens the run's files in `dir` for appending.
    pub fn open(dir: &Path) -> Result<Self, RecordError> {
        std::fs::create_dir_all(dir.join(STATE_PARTS)).map_err(|e| RecordError::io(dir, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            state: csv_appender(&dir.join(STATE_CSV))?,
            decisions: BufWriter::new(append(&dir.join(DECISIONS))?),
            steps: csv_appender(&dir.join(STEPS))?,
        })
    }

    /// Writes the state rows of part `part` (CSV and one Parquet file).
    pub fn state<R: Serialize + for<'de> Deserialize<'de>>(
        &mut self,
        part: &str,
        rows: &[R],
    ) -> Result<(), RecordError> {
        let csv_path = self.dir.join(STATE_CSV);
        for row in rows {
            self.state
                .serialize(row)
                .map_err(|e| RecordError::format(&csv_path, e))?;
        }
        self.state
            .flush()
            .map_err(|e| RecordError::io(&csv_path, e))?;
        if rows.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(STATE_PARTS).join(format!("{part}.parquet"));
        let fields = Vec::<arrow_schema::FieldRef>::from_type::<R>(
            TracingOptions::default()
                .allow_null_fields(true)
                .enums_without_data_as_strings(true),
        )
        .map_err(|e| RecordError::format(&path, e))?;
        let batch = serde_arrow::to_record_batch(&fields, &rows)
            .map_err(|e| RecordError::format(&path, e))?;
        let file = File::create(&path).map_err(|e| RecordError::io(&path, e))?;
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None)
            .map_err(|e| RecordError::format(&path, e))?;
        writer
            .write(&batch)
            .map_err(|e| RecordError::format(&path, e))?;
        writer.close().map_err(|e| RecordError::format(&path, e))?;
        Ok(())
    }

    pub fn decisions(&mut self, records: &[DecisionRecord]) -> Result<(), RecordError> {
        let path = self.dir.join(DECISIONS);
        for r in records {
            serde_json::to_writer(&mut self.decisions, r)
                .map_err(|e| RecordError::format(&path, e))?;
            self.decisions
                .write_all(b"\n")
                .map_err(|e| RecordError::io(&path, e))?;
        }
        self.decisions
            .flush()
            .map_err(|e| RecordError::io(&path, e))
    }

    pub fn step(&mut self, record: &StepRecord) -> Result<(), RecordError> {
        let path = self.dir.join(STEPS);
        self.steps
            .serialize(record)
            .map_err(|e| RecordError::format(&path, e))?;
        self.steps.flush().map_err(|e| RecordError::io(&path, e))
    }

    /// The length of every appended file, for the checkpoint.
    pub fn lengths(&self) -> Result<BTreeMap<String, u64>, RecordError> {
        [STATE_CSV, DECISIONS, STEPS]
            .iter()
            .map(|name| {
                let path = self.dir.join(name);
                let len = std::fs::metadata(&path)
                    .map_err(|e| RecordError::io(&path, e))?
                    .len();
                Ok((name.to_string(), len))
            })
            .collect()
    }
}

/// Cuts the appended files back to `lengths` and removes Parquet parts not in `keep`: what a
/// resumed run does to forget a step written after its last checkpoint.
pub fn rewind(
    dir: &Path,
    lengths: &BTreeMap<String, u64>,
    keep: &[String],
) -> Result<(), RecordError> {
    for (name, len) in lengths {
        let path = dir.join(name);
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| RecordError::io(&path, e))?;
        file.set_len(*len).map_err(|e| RecordError::io(&path, e))?;
    }
    let parts = dir.join(STATE_PARTS);
    if let Ok(entries) = std::fs::read_dir(&parts) {
        for entry in entries.flatten() {
            let name = entry
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".parquet")
                .to_string();
            if !keep.contains(&name) {
                std::fs::remove_file(entry.path())
                    .map_err(|e| RecordError::io(&entry.path(), e))?;
            }
        }
    }
    Ok(())
}

/// Joins the Parquet parts, in name order, into one `state.parquet` and removes them.
pub fn merge_parts(dir: &Path) -> Result<(), RecordError> {
    let parts_dir = dir.join(STATE_PARTS);
    let mut parts: Vec<PathBuf> = match std::fs::read_dir(&parts_dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .collect(),
        Err(_) => return Ok(()),
    };
    parts.sort();
    let out_path = dir.join(STATE_PARQUET);
    let mut writer: Option<parquet::arrow::ArrowWriter<File>> = None;
    for part in &parts {
        let file = File::open(part).map_err(|e| RecordError::io(part, e))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| RecordError::format(part, e))?;
        for batch in reader {
            let batch = batch.map_err(|e| RecordError::format(part, e))?;
            if writer.is_none() {
                let file = File::create(&out_path).map_err(|e| RecordError::io(&out_path, e))?;
                writer = Some(
                    parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None)
                        .map_err(|e| RecordError::format(&out_path, e))?,
                );
            }
            let w = writer.as_mut().expect("invariant: created above");
            w.write(&batch)
                .map_err(|e| RecordError::format(&out_path, e))?;
        }
    }
    if let Some(w) = writer {
        w.close().map_err(|e| RecordError::format(&out_path, e))?;
    }
    std::fs::remove_dir_all(&parts_dir).map_err(|e| RecordError::io(&parts_dir, e))
}
