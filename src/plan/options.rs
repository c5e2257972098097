//! What `throng plan` is asked: the library's typed options.

use crate::run::ModelSettings;
use crate::sim::config::{PolicyKind, Split};
use std::path::PathBuf;

/// What to size: a run of `config`, overridden as `throng run` overrides it, on `devices`.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// The experiment config.
    pub config: PathBuf,
    /// Devices (ranks) the run would use.
    pub devices: usize,
    /// Size for a device's stated figures (h200, h100, a100, l4) instead of this machine.
    pub device_profile: Option<String>,
    /// First-step decisions to make on this device to measure the speed (0: none); `None`:
    /// 16.
    pub sample: Option<usize>,
    /// A step time to reach, in seconds: says how many devices it needs.
    pub target_step: Option<f64>,
    pub agents: Option<Vec<i64>>,
    pub replicates: Option<i64>,
    pub steps: Option<i64>,
    pub policy: Option<PolicyKind>,
    /// How the run's ranks would share it (default: the config's `split`).
    pub split: Option<Split>,
    /// The config's default model (`[llm] model`), if given.
    pub model: Option<String>,
    /// How the model is loaded (its `model` is set from the config's).
    pub settings: ModelSettings,
}
