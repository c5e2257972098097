//! A run's folder: the resolved config, a manifest, the per-step state of every agent
//! (Parquet for pandas/polars, and CSV), decisions (JSON Lines), step timings, per-step
//! aggregates, the cells' fixed data, and checkpoints. Everything is written as the run goes,
//! so an interrupted run keeps every finished step and can resume from the last one.
//!
//! Plain data: this module knows nothing of scenarios, policies or the engine.

mod cells;
pub mod checkpoint;
pub mod columns;
mod decision;
mod error;
mod folder;
pub mod inputs;
mod json;
mod manifest;
mod names;
pub mod open;
mod read;
mod seal;
pub mod store;
pub mod table;
mod writer;

pub use cells::{CellRecord, read_cells};
pub use decision::{DecisionLog, DecisionRecord};
pub use error::{RecordError, full_disk_at};
pub use folder::{
    FolderError, FolderLock, LOCK, LockHolder, RunFolder, holder, host, lock_for_report,
    lock_state, never_started,
};
pub use json::{pause_at_once, read_json, write_json_atomic};
pub use manifest::{
    CounterfactualRecord, Counters, DefinedIn, EngineRecord, FileSum, LoadedModelRecord, Manifest,
    ModelRecord, ReuseRecord, Status, now_unix, peak_rss_bytes,
};
pub use names::{
    AGGREGATES, CELLS, CONFIG, CONFIG_ORIGINAL, DECISIONS, GROUPS, MANIFEST, PERSONAS, PROMPTS,
    STATE, STATE_CSV, STATE_PARQUET, STEPS,
};
pub use read::{
    CELL_KEYS, Keyed, has_table, read_csv, read_keyed_csv, read_state, read_steps, read_table,
    rows_of,
};
pub use seal::{checksums, record_files, verify};
pub use writer::{
    KeptPrompt, StepRecord, StepWriter, merge_parts, reset as writer_reset, rewind as writer_rewind,
};
