//! What ran, with what, and how far it got.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Totals of a run so far: saved in every checkpoint and shown in the manifest, so that a
/// resumed run counts on from where it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub decisions: u64,
    pub fallbacks: u64,
    pub clamped: u64,
    pub prompt_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    pub generated_tokens: u64,
    /// Seconds spent stepping (deciding and resolving), records excluded.
    pub seconds: f64,
}

impl Counters {
    pub fn add(&mut self, other: &Counters) {
        self.decisions += other.decisions;
        self.fallbacks += other.fallbacks;
        self.clamped += other.clamped;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.generated_tokens += other.generated_tokens;
        self.seconds += other.seconds;
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Being written, or stopped without a word (killed): `--resume` continues it.
    #[default]
    Running,
    /// Stopped on request (`--stop-after`, a signal) after a finished step.
    Paused,
    /// Every step of every cell is done.
    Finished,
    /// Stopped by an error; `--resume` continues from the last finished step.
    Failed,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Finished => "finished",
            Status::Failed => "failed",
        })
    }
}

/// One model of a run of several, as the manifest lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// As the config names it (a preset, folder, GGUF file or Hub repo id).
    pub name: String,
    /// What its weights were stored as and became; absent when this process did not load it
    /// (another rank did, under `--split models`).
    pub weights: Option<String>,
    /// The LLM agents it decides for, over the cells of one replicate of the largest
    /// population size (what its share of the KV memory follows).
    pub agents: u64,
    /// Its share of the KV-cache memory, in bytes.
    pub kv_bytes: Option<u64>,
}

/// `manifest.json`: what ran, with what, and how long it took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub scenario: String,
    pub config_file: String,
    pub seed: u64,
    /// The policy, or `mixed` when groups of agents use different ones.
    pub policy: String,
    /// The model (of a run of several, the first the config's agents ask; see `models`).
    pub model: Option<String>,
    /// What the weights were stored as and became, e.g. `GGUF (Q4_1) -> int8`.
    pub weights: Option<String>,
    /// In a run whose agents ask several models: every model, with its weights and its share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelRecord>,
    /// The weight format asked for (`auto`, `int8`, ...), which `--resume` loads again.
    #[serde(default)]
    pub weight_format: Option<String>,
    pub device: Option<String>,
    pub throng_version: String,
    pub arms: Vec<String>,
    pub populations: Vec<usize>,
    pub replicates: usize,
    pub steps: usize,
    pub status: Status,
    /// Steps finished, over all population sizes, out of `populations.len() * steps`.
    #[serde(default)]
    pub steps_done: usize,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    #[serde(flatten)]
    pub counters: Counters,
    pub prefix_hit_rate: Option<f64>,
    pub preemptions: Option<u64>,
    /// The process's peak resident memory, where the platform reports it.
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// Why the run stopped, when it failed.
    #[serde(default)]
    pub error: Option<String>,
    /// The sha256 of every file the run reads (`config.toml`, the prompt templates it copied
    /// under `inputs/`), taken when it started: `--resume` refuses when any has changed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, String>,
    /// The size and SHA-256 of every record file, by its path in the folder, taken when the
    /// run last stopped writing them (finished or paused) and checked by every reader, so that
    /// a damaged file is refused rather than read. `None` while the run writes its records, or
    /// when it was killed or failed before it could take them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<BTreeMap<String, FileSum>>,
    /// Decisions taken from earlier runs' stores (`--reuse`), when the run reads any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse: Option<ReuseRecord>,
    /// The run this one changes (`[counterfactual]`), which its report sets it beside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counterfactual: Option<CounterfactualRecord>,
    /// Where the finished run this one extends waits (`DIR.before-extension`) until this one
    /// finishes and removes it: an extension stopped on the way is resumed reading it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    /// Where the scenario's code is, when it is not the program's own (a Python class): what
    /// a reader of the folder must import to know the scenario.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defined_in: Option<DefinedIn>,
    /// What the run's replies depend on beside its requests, when it asks a model: `--resume`
    /// loads with the same settings and refuses a model that is not the one it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineRecord>,
}

/// The engine settings that change a reply's bits, as a run asked for them, and each model
/// as it was loaded. (Batch size, KV memory and the scheduler's settings change no bits: the
/// engine is batch invariant.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRecord {
    /// `--kv-format` as asked (`auto`, `model`, `f32`, `f16`).
    pub kv_format: String,
    /// `--tokenizer`, as an absolute path, when one replaced the models' own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Each model the run's first process loaded, by the name its config gives.
    pub models: BTreeMap<String, LoadedModelRecord>,
}

/// A model as it was loaded: where from, and what its replies are a function of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedModelRecord {
    /// The file or folder it was read from (absolute), or the preset, asset or Hub repository.
    pub from: String,
    /// The sha256 of the files it was read from (weights, config, tokenizer, chat template),
    /// or how its weights were generated.
    pub weights: String,
    /// What the weights were stored as and became.
    pub format: String,
    /// The class of device computing it (`cpu:avx512`, `cpu:avx2`, `cuda`).
    pub device: String,
    /// The type the KV cache keeps keys and values in.
    pub kv: String,
}

/// The base of a counterfactual run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterfactualRecord {
    /// The base run's folder, as an absolute path.
    pub base: String,
    /// Its arm that each of this run's arms is compared with.
    pub arm: String,
}

/// What a run took from earlier runs instead of the model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReuseRecord {
    /// The run folders read, in the order they are searched.
    pub sources: Vec<String>,
    /// Decisions whose reply came from one of them.
    pub reused: u64,
    /// The model time those decisions took in their runs, estimated from each source's model
    /// seconds per decision (forward passes and masks over its LLM decisions).
    pub saved_seconds: f64,
}

/// A record file as its run left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    pub sha256: String,
}

impl Manifest {
    pub fn planned_steps(&self) -> usize {
        self.populations.len() * self.steps
    }
}

/// The peak resident set size of this process (Linux: `VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Now, in seconds since 1970 (what a manifest records).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The code that defines a scenario outside the program: a Python class, by module and file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefinedIn {
    /// `python`.
    pub language: String,
    /// The module as Python named it (`ultimatum`; `__main__` for a script run as such).
    pub module: String,
    /// The module's file, absolute, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The class.
    pub class: String,
}

impl DefinedIn {
    /// What a reader types to know the scenario: the file for a script (whose module name
    /// `__main__` imports nothing), else the module.
    pub fn importable(&self) -> &str {
        match (&self.file, self.module.as_str()) {
            (Some(file), "__main__") => file,
            _ => &self.module,
        }
    }
}
