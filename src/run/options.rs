//! What a run is asked to do: typed options, which the command line's flags and the Python
//! package's keyword arguments become.

use super::settings::EngineSettings;
use crate::engine::KvPolicy;
use crate::host::Program;
use crate::model::{KvFormat, WeightFormat};
use crate::sim::config::{PolicyKind, Split};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A run: a new one of `config`, or the one in `resume` continued (or, given more `steps` or
/// `replicates`, extended). Counts are signed so that the config's checks, not the caller's
/// types, refuse a negative one with its own words.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The experiment config.
    pub config: Option<PathBuf>,
    /// Continue the interrupted run in this folder from its last finished step.
    pub resume: Option<PathBuf>,
    /// Where to write the run (default: runs/<name>-<unix time>).
    pub out: Option<PathBuf>,
    pub policy: Option<PolicyKind>,
    pub replicates: Option<i64>,
    pub steps: Option<i64>,
    /// Population sizes.
    pub agents: Option<Vec<i64>>,
    /// The config's default model (`[llm] model`).
    pub model: Option<String>,
    /// How to load the model and run its engine.
    pub engine: EngineChoices,
    /// Earlier runs whose recorded decisions are taken instead of the model's, searched in
    /// turn.
    pub reuse: Vec<PathBuf>,
    /// Write the report at the end.
    pub report: bool,
    /// Stop after this many steps, leaving the run resumable (a batch job's time limit).
    pub stop_after: Option<usize>,
    /// How the ranks of an MPI job share the run (default: the config's `split`).
    pub split: Option<Split>,
    /// Devices of this machine's ranks, one per local rank.
    pub devices: Option<Vec<String>>,
    /// How long a rank waits for another at the end of a step before stopping the job.
    pub rank_timeout: Duration,
    /// How long a first Ctrl-C or SIGTERM waits for the current step to finish.
    pub stop_timeout: Duration,
    /// Serve the run's live page at this address while it runs.
    pub serve: Option<SocketAddr>,
    /// With `serve`: allow an address other machines can reach.
    pub public: bool,
    /// The threads the caller started its thread pool with, if it chose them; else ranks
    /// sharing a machine share its cores.
    pub threads: Option<usize>,
    /// Catch Ctrl-C and SIGTERM (a command does); `false` when the embedding program owns
    /// the signal handlers (the Python package), which stops a run through
    /// [`super::Observer::stop_requested`].
    pub catch_signals: bool,
    /// Crashes, hangs and delays asked on purpose, for tests of recovery; none by default
    /// (the command line reads them from `THRONG_CRASH_AT` and `THRONG_STEP_DELAY_MS`).
    pub faults: crate::sim::runner::Faults,
    /// How messages name the program to run next (`throng run --resume DIR`, or
    /// `throng.run(resume=...)` from Python): by default this process's command.
    pub program: Program,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            config: None,
            resume: None,
            out: None,
            policy: None,
            replicates: None,
            steps: None,
            agents: None,
            model: None,
            engine: EngineChoices::default(),
            reuse: Vec::new(),
            report: true,
            stop_after: None,
            split: None,
            devices: None,
            rank_timeout: crate::cluster::DEFAULT_TIMEOUT,
            stop_timeout: Duration::from_secs(300),
            serve: None,
            public: false,
            threads: None,
            catch_signals: true,
            faults: Default::default(),
            program: Program::this_process(),
        }
    }
}

impl RunOptions {
    /// A new run of `config`, everything else at its default.
    pub fn new(config: impl Into<PathBuf>) -> Self {
        Self {
            config: Some(config.into()),
            ..Self::default()
        }
    }

    /// The run in `dir` continued.
    pub fn resume(dir: impl Into<PathBuf>) -> Self {
        Self {
            resume: Some(dir.into()),
            ..Self::default()
        }
    }
}

/// The engine settings given for a run; one left `None` is the run's to choose: its default,
/// or for a resumed or extended run the one it started with.
#[derive(Clone, Debug, Default)]
pub struct EngineChoices {
    pub device: Option<String>,
    pub weights: Option<WeightFormat>,
    pub tokenizer: Option<PathBuf>,
    pub kv_memory: Option<u64>,
    pub kv_format: Option<KvFormat>,
    pub max_batch_tokens: Option<usize>,
    pub max_seqs: Option<usize>,
    pub prefix_caching: Option<bool>,
    pub kv_policy: Option<KvPolicy>,
}

impl EngineChoices {
    /// The settings, defaults in place of those not given.
    pub fn settings(&self) -> EngineSettings {
        let default = EngineSettings::default();
        EngineSettings {
            device: self.device.clone().unwrap_or(default.device),
            weights: self.weights.unwrap_or(default.weights),
            tokenizer: self.tokenizer.clone(),
            kv_memory: self.kv_memory,
            kv_format: self.kv_format.unwrap_or(default.kv_format),
            max_batch_tokens: self.max_batch_tokens,
            max_seqs: self.max_seqs.unwrap_or(default.max_seqs),
            prefix_caching: self.prefix_caching.unwrap_or(default.prefix_caching),
            kv_policy: self.kv_policy.unwrap_or(default.kv_policy),
            control_tokens_in_content: default.control_tokens_in_content,
            host_sampling: default.host_sampling,
        }
    }
}

/// Which settings the caller gave rather than left to the run: a resumed or extended run
/// takes the others from its manifest.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GivenSettings {
    pub model: bool,
    pub device: bool,
    pub weights: bool,
    pub kv_format: bool,
    pub tokenizer: bool,
}

impl GivenSettings {
    pub fn of(options: &RunOptions) -> Self {
        Self {
            model: options.model.is_some(),
            device: options.engine.device.is_some(),
            weights: options.engine.weights.is_some(),
            kv_format: options.engine.kv_format.is_some(),
            tokenizer: options.engine.tokenizer.is_some(),
        }
    }
}
