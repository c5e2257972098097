//! Appends each finished step to the run's files and flushes them, and remembers their
//! lengths so that a resumed run can cut away a half-written step.

use super::{
    AGGREGATES, CELLS, CellRecord, DECISIONS, DecisionRecord, PROMPTS, RecordError, STATE,
    STATE_CSV, STEPS, table,
};
use arrow_array::RecordBatch;
use arrow_schema::Schema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One step of one population in `steps.csv`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub population: usize,
    pub step: usize,
    pub cells: usize,
    pub decisions: usize,
    pub fallbacks: usize,
    /// Wall time of the step: deciding and resolving, records excluded.
    pub seconds: f64,
    pub decisions_per_second: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Of `seconds`: rendering prompt templates, and tokenizing them.
    #[serde(default)]
    pub template_seconds: f64,
    #[serde(default)]
    pub tokenize_seconds: f64,
    /// Of `seconds`: applying the decisions to the worlds.
    #[serde(default)]
    pub resolve_seconds: f64,
    /// Writing the step's records (state, decisions, checkpoint).
    #[serde(default)]
    pub record_seconds: f64,
    /// Processes that decided the step (1 without MPI).
    #[serde(default = "one")]
    pub ranks: usize,
    /// Of `seconds`: waiting for and exchanging the other ranks' parts of the step.
    #[serde(default)]
    pub exchange_seconds: f64,
    /// Decisions changed to fit the rules.
    #[serde(default)]
    pub clamped: usize,
    /// Of `seconds`: the engine's forward passes, and its constrained decoder's token masks.
    #[serde(default)]
    pub forward_seconds: f64,
    #[serde(default)]
    pub mask_seconds: f64,
    /// The most KV-cache memory the step held at once.
    #[serde(default)]
    pub kv_bytes: u64,
    /// Each rank's own time for the step, space-separated (empty without MPI): a slow rank
    /// stands out against the others.
    #[serde(default)]
    pub rank_seconds: String,
    /// Decisions taken from earlier runs' stores (`--reuse`) instead of the model, over every
    /// rank: kept per step, so that a resumed run counts those of the steps it kept.
    #[serde(default)]
    pub reused: u64,
    /// Of `decisions`: those the LLM policy made (asking the model, or taking a reused
    /// reply), and those a scripted rule made. Rates of the model are of the first alone: a
    /// scripted decision costs nothing. Both 0 in a record written before they were kept.
    #[serde(default)]
    pub model_decisions: usize,
    #[serde(default)]
    pub scripted_decisions: usize,
}

impl StepRecord {
    /// `(model, scripted)` decisions, or `None` for a step recorded before they were kept.
    pub fn split(&self) -> Option<(usize, usize)> {
        let known = self.model_decisions + self.scripted_decisions;
        (known == self.decisions && (known > 0 || self.decisions == 0))
            .then_some((self.model_decisions, self.scripted_decisions))
    }
}

fn one() -> usize {
    1
}

/// One line of `prompts.jsonl`: the whole prompt of a logged decision, by its hash (the
/// `prompt_hash` of `decisions.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptPrompt {
    pub hash: String,
    pub text: String,
}

/// The run's appended files.
pub struct StepWriter {
    dir: PathBuf,
    /// `None`: the run keeps no state CSV (it would be too large; Parquet has it all).
    state: Option<CsvAppender>,
    /// `None`: the scenario keeps no aggregates, and the run has no `aggregates.csv`.
    aggregates: Option<CsvAppender>,
    decisions: BufWriter<File>,
    prompts: BufWriter<File>,
    cells: BufWriter<File>,
    steps: csv::Writer<BufWriter<File>>,
}

/// Every file a run appends to (the Parquet parts aside).
const APPENDED: [&str; 6] = [DECISIONS, PROMPTS, STEPS, AGGREGATES, CELLS, STATE_CSV];

/// A CSV file written from record batches: the header goes into an empty file only.
struct CsvAppender {
    path: PathBuf,
    writer: csv::Writer<BufWriter<File>>,
    needs_header: bool,
}

impl CsvAppender {
    fn open(path: PathBuf) -> Result<Self, RecordError> {
        let needs_header = std::fs::metadata(&path)
            .map(|m| m.len() == 0)
            .unwrap_or(true);
        let writer = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(BufWriter::new(append(&path)?));
        Ok(Self {
            path,
            writer,
            needs_header,
        })
    }

    /// Opens `path` for rows of `schema`, writing the header now into an empty file, so that
    /// the file reads as a table (of no rows) before its first rows come.
    fn open_with_header(path: PathBuf, schema: &Schema) -> Result<Self, RecordError> {
        let mut appender = Self::open(path)?;
        if appender.needs_header {
            let empty = RecordBatch::new_empty(Arc::new(schema.clone()));
            table::write_csv(&mut appender.writer, &empty, true, &appender.path)?;
            appender.needs_header = false;
            appender
                .writer
                .flush()
                .map_err(|e| RecordError::io(&appender.path, e))?;
        }
        Ok(appender)
    }

    fn write(&mut self, batches: &[RecordBatch]) -> Result<(), RecordError> {
        for batch in batches.iter().filter(|b| b.num_rows() > 0) {
            table::write_csv(&mut self.writer, batch, self.needs_header, &self.path)?;
            self.needs_header = false;
        }
        self.writer
            .flush()
            .map_err(|e| RecordError::io(&self.path, e))
    }
}

fn append(path: &Path) -> Result<File, RecordError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| RecordError::io(path, e))
}

impl StepWriter {
    /// Opens the run's files in `dir` for appending; `state_csv` says whether the state is
    /// also written as CSV, `aggregates` the columns of `aggregates.csv` (`None`: the scenario
    /// keeps none, and the file is not written).
    pub fn open(
        dir: &Path,
        state_csv: bool,
        aggregates: Option<&Schema>,
    ) -> Result<Self, RecordError> {
        let steps_path = dir.join(STEPS);
        let fresh = std::fs::metadata(&steps_path)
            .map(|m| m.len() == 0)
            .unwrap_or(true);
        Ok(Self {
            dir: dir.to_path_buf(),
            state: state_csv
                .then(|| CsvAppender::open(dir.join(STATE_CSV)))
                .transpose()?,
            aggregates: aggregates
                .map(|schema| CsvAppender::open_with_header(dir.join(AGGREGATES), schema))
                .transpose()?,
            decisions: BufWriter::new(append(&dir.join(DECISIONS))?),
            prompts: BufWriter::new(append(&dir.join(PROMPTS))?),
            cells: BufWriter::new(append(&dir.join(CELLS))?),
            steps: csv::WriterBuilder::new()
                .has_headers(fresh)
                .from_writer(BufWriter::new(append(&steps_path)?)),
        })
    }

    /// Writes the state of part `part` (one Parquet file, and CSV rows): the batches of
    /// one step, one per cell, concatenated.
    pub fn state(&mut self, part: &str, batches: &[RecordBatch]) -> Result<(), RecordError> {
        if let Some(csv) = self.state.as_mut() {
            csv.write(batches)?;
        }
        self.table(STATE, part, batches)
    }

    /// Writes part `part` of the Parquet table `name` (`state`, or a scenario's own).
    pub fn table(
        &mut self,
        name: &str,
        part: &str,
        batches: &[RecordBatch],
    ) -> Result<(), RecordError> {
        let batches: Vec<RecordBatch> = batches
            .iter()
            .filter(|b| b.num_rows() > 0)
            .cloned()
            .collect();
        let Some(first) = batches.first() else {
            return Ok(());
        };
        let parts = self.dir.join(format!("{name}.parts"));
        std::fs::create_dir_all(&parts).map_err(|e| RecordError::io(&parts, e))?;
        let path = parts.join(format!("{part}.parquet"));
        let joined = arrow_select::concat::concat_batches(&first.schema(), &batches)
            .map_err(|e| RecordError::format(&path, e))?;
        table::write_parquet(&path, &[joined])
    }

    /// Per-step aggregates of the scenario (one row per cell), to `aggregates.csv`.
    pub fn aggregates(&mut self, batches: &[RecordBatch]) -> Result<(), RecordError> {
        match self.aggregates.as_mut() {
            Some(aggregates) => aggregates.write(batches),
            None if batches.iter().all(|b| b.num_rows() == 0) => Ok(()),
            None => Err(RecordError::format(
                &self.dir.join(AGGREGATES),
                "the scenario wrote aggregates without declaring their columns (Scenario::aggregates_schema)",
            )),
        }
    }

    /// Appends decision records as they are made, one JSON line each, so that a step of
    /// millions of decisions is never held in memory as records.
    pub fn decisions(
        &mut self,
        records: impl IntoIterator<Item = DecisionRecord>,
    ) -> Result<(), RecordError> {
        json_lines(&mut self.decisions, &self.dir.join(DECISIONS), records)
    }

    /// Appends prompts of logged decisions (`prompts.jsonl`), one line each.
    pub fn prompts(
        &mut self,
        prompts: impl IntoIterator<Item = KeptPrompt>,
    ) -> Result<(), RecordError> {
        json_lines(&mut self.prompts, &self.dir.join(PROMPTS), prompts)
    }

    /// Appends the fixed data of cells (`cells.jsonl`), one line each.
    pub fn cells(
        &mut self,
        cells: impl IntoIterator<Item = CellRecord>,
    ) -> Result<(), RecordError> {
        json_lines(&mut self.cells, &self.dir.join(CELLS), cells)
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
        APPENDED
            .iter()
            .filter(|&&name| name != STATE_CSV || self.state.is_some())
            .filter(|&&name| name != AGGREGATES || self.aggregates.is_some())
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

fn json_lines<T: Serialize>(
    out: &mut BufWriter<File>,
    path: &Path,
    items: impl IntoIterator<Item = T>,
) -> Result<(), RecordError> {
    for item in items {
        serde_json::to_writer(&mut *out, &item).map_err(|e| RecordError::format(path, e))?;
        out.write_all(b"\n").map_err(|e| RecordError::io(path, e))?;
    }
    out.flush().map_err(|e| RecordError::io(path, e))
}

/// Empties a run folder's records (appended files and Parquet parts), keeping its config
/// and manifest: a resumed run that never finished a step starts again from nothing.
pub fn reset(dir: &Path) -> Result<(), RecordError> {
    for name in APPENDED {
        let path = dir.join(name);
        if path.exists() {
            std::fs::remove_file(&path).map_err(|e| RecordError::io(&path, e))?;
        }
    }
    for (merged, parts) in part_dirs(dir) {
        std::fs::remove_dir_all(&parts).map_err(|e| RecordError::io(&parts, e))?;
        if merged.exists() {
            std::fs::remove_file(&merged).map_err(|e| RecordError::io(&merged, e))?;
        }
    }
    Ok(())
}

/// The Parquet tables a run folder may hold: `state` and any tables of the scenario's own,
/// each written as `<name>.parts/<part>.parquet` while the run goes and joined into
/// `<name>.parquet` at its end.
fn part_dirs(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.extension().is_some_and(|e| e == "parts"))
        .map(|p| (p.with_extension("parquet"), p))
        .collect();
    found.sort();
    found
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
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| RecordError::io(&path, e))?;
        file.set_len(*len).map_err(|e| RecordError::io(&path, e))?;
    }
    for (_, parts) in part_dirs(dir) {
        for entry in std::fs::read_dir(&parts)
            .map_err(|e| RecordError::io(&parts, e))?
            .flatten()
        {
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

/// Joins every table's Parquet parts, in name order, into `<table>.parquet` and removes
/// them. The joined file is written aside and renamed into place before any part is
/// removed, so a crash at any point leaves either the parts or the whole table.
pub fn merge_parts(dir: &Path) -> Result<(), RecordError> {
    for (out_path, parts_dir) in part_dirs(dir) {
        if !out_path.exists() {
            merge_table(&parts_dir, &out_path)?;
        }
        std::fs::remove_dir_all(&parts_dir).map_err(|e| RecordError::io(&parts_dir, e))?;
    }
    Ok(())
}

fn merge_table(parts_dir: &Path, out_path: &Path) -> Result<(), RecordError> {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(parts_dir)
        .map_err(|e| RecordError::io(parts_dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    parts.sort();
    let tmp = out_path.with_extension("parquet.tmp");
    let mut writer: Option<parquet::arrow::ArrowWriter<File>> = None;
    for part in &parts {
        let file = File::open(part).map_err(|e| RecordError::io(part, e))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| RecordError::format(part, e))?;
        for batch in reader {
            let batch = batch.map_err(|e| RecordError::format(part, e))?;
            if writer.is_none() {
                let file = File::create(&tmp).map_err(|e| RecordError::io(&tmp, e))?;
                writer = Some(
                    parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None)
                        .map_err(|e| RecordError::format(out_path, e))?,
                );
            }
            let w = writer.as_mut().expect("invariant: created above");
            w.write(&batch)
                .map_err(|e| RecordError::format(out_path, e))?;
        }
    }
    if let Some(w) = writer {
        w.close().map_err(|e| RecordError::format(out_path, e))?;
        std::fs::rename(&tmp, out_path).map_err(|e| RecordError::io(out_path, e))?;
    }
    Ok(())
}
