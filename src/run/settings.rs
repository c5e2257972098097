//! Where and how to load a model and run its engine: settings of the library, which the
//! command line's flags and the Python package's keyword arguments become.

use super::error::{Context, RunError, refuse};
use crate::engine::{Engine, EngineConfig, KvPolicy};
use crate::model::{KvFormat, LoadOptions, WeightFormat, loader};
use crate::sim::experiment::Experiment;
use std::path::PathBuf;

/// How to load a model and run its engine, whichever model it is.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSettings {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Format weights are converted to at load.
    pub weights: WeightFormat,
    /// A tokenizer.json to use instead of the model's own.
    pub tokenizer: Option<PathBuf>,
    /// Bytes for the KV cache (default: derived from the device).
    pub kv_memory: Option<u64>,
    /// How the KV cache stores keys and values.
    pub kv_format: KvFormat,
    /// Tokens per forward pass (default: 512 on CPU, 8192 on GPU).
    pub max_batch_tokens: Option<usize>,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// Whether prompts share cached KV blocks of their common prefixes.
    pub prefix_caching: bool,
    /// Which cached KV blocks go first when the cache is full.
    pub kv_policy: KvPolicy,
    /// Read a control token's text inside a message as that control token (see
    /// [`EngineConfig::control_tokens_in_content`]).
    pub control_tokens_in_content: bool,
    /// On a GPU, sample on the host (see [`EngineConfig::host_sampling`]).
    pub host_sampling: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            device: "cpu".into(),
            weights: WeightFormat::Auto,
            tokenizer: None,
            kv_memory: None,
            kv_format: KvFormat::Auto,
            max_batch_tokens: None,
            max_seqs: 256,
            prefix_caching: true,
            kv_policy: KvPolicy::default(),
            control_tokens_in_content: false,
            host_sampling: false,
        }
    }
}

/// A model (a preset, a model folder, a GGUF file or a Hugging Face repo id) and how to load
/// it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSettings {
    pub model: String,
    pub engine: EngineSettings,
}

impl Default for ModelSettings {
    fn default() -> Self {
        Self {
            model: crate::model::DEFAULT_MODEL.into(),
            engine: EngineSettings::default(),
        }
    }
}

/// One model of a run of several, loaded: its name, engine, weights and KV share.
pub struct RunModel {
    pub name: String,
    pub engine: Engine,
    /// What its weights were stored as and became.
    pub weights: String,
    pub kv_bytes: u64,
    /// The LLM agents it decides for (see [`crate::sim::runner::model_agents`]).
    pub agents: u64,
}

/// Each model's part of `total` KV bytes: in proportion to the agents it decides for, and
/// at least an eighth of an even share (so that a model of a few agents still holds their
/// sequences).
pub fn kv_shares(total: u64, agents: &[u64]) -> Vec<u64> {
    let n = agents.len().max(1) as f64;
    let all = agents.iter().sum::<u64>().max(1) as f64;
    let floor = 1.0 / (8.0 * n);
    let weights: Vec<f64> = agents
        .iter()
        .map(|&a| (a as f64 / all).max(floor))
        .collect();
    let sum: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| (total as f64 * w / sum).floor() as u64)
        .collect()
}

/// The device `spec` names: `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(spec: &str) -> Result<candle_core::Device, RunError> {
    if spec == "cpu" {
        return Ok(candle_core::Device::Cpu);
    }
    let Some(ordinal) =
        spec.strip_prefix("cuda:")
            .or(if spec == "cuda" { Some("0") } else { None })
    else {
        refuse!("unknown device `{spec}`: use `cpu` or `cuda:N`");
    };
    let Ok(ordinal) = ordinal.parse::<usize>() else {
        refuse!("device `{spec}`: N in cuda:N must be a number");
    };
    if !candle_core::utils::cuda_is_available() {
        refuse!(
            "device `{spec}`: this throng was built without CUDA; rebuild with `--features cuda`"
        );
    }
    candle_core::Device::new_cuda(ordinal).with_context(|| {
        format!(
            "cannot open CUDA device {ordinal}: is there an NVIDIA GPU with its driver here \
             (`nvidia-smi` lists them)?"
        )
    })
}

/// The model for a config whose `[llm]` names none: the program's choice, not the
/// simulation's.
pub fn default_model() -> Option<String> {
    Some(crate::model::DEFAULT_MODEL.into())
}

/// The model `exp` runs: its config's (`--model` applied), else the default.
pub fn model_of(exp: &Experiment) -> String {
    exp.config
        .llm
        .model
        .clone()
        .unwrap_or_else(|| crate::model::DEFAULT_MODEL.into())
}

/// Every model `exp`'s agents ask, by name (the default for one the config leaves unset),
/// each checked as `--model` is: a name that is neither a preset, nor an existing path, nor
/// a Hub repo id is refused at the line of the config that names it (or at `--model`),
/// before anything is written or loaded.
pub fn models_of(exp: &Experiment) -> Result<Vec<String>, RunError> {
    let names: Vec<String> = exp
        .models()
        .into_iter()
        .map(|m| m.unwrap_or_else(|| model_of(exp)))
        .collect();
    for name in &names {
        if let Err(e) = loader::ModelSource::resolve(name) {
            return Err(exp.model_error(name, e).into());
        }
    }
    Ok(names)
}

impl ModelSettings {
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            kv_memory: self.engine.kv_memory.map(|b| b as usize),
            max_batch_tokens: self.engine.max_batch_tokens,
            max_seqs: self.engine.max_seqs,
            prefix_caching: self.engine.prefix_caching,
            kv_format: self.engine.kv_format,
            kv_policy: self.engine.kv_policy,
            control_tokens_in_content: self.engine.control_tokens_in_content,
            host_sampling: self.engine.host_sampling,
            ..EngineConfig::default()
        }
    }

    fn load_options(&self) -> Result<LoadOptions, RunError> {
        Ok(LoadOptions {
            device: parse_device(&self.engine.device)?,
            weights: self.engine.weights,
            tokenizer: self.engine.tokenizer.clone(),
        })
    }

    /// The engine and what its weights were stored as and became (`GGUF (Q4_1) -> Dense(F32)`).
    pub fn load_engine_described(&self) -> Result<(Engine, String), RunError> {
        self.load_engine_with(false)
    }

    /// As [`ModelSettings::load_engine_described`], with per-operation profiling of the
    /// forward pass when `profile` is set (read back through `engine.model().profile()`).
    pub(crate) fn load_engine_with(&self, profile: bool) -> Result<(Engine, String), RunError> {
        let opts = self.load_options()?;
        // The cache is allocated at once, and on the CPU a failed allocation aborts.
        if let (true, Some(kv), Some(host)) = (
            opts.device.is_cpu(),
            self.engine.kv_memory,
            crate::host::HostMemory::here(),
        ) && kv as f64 > host.usable()
        {
            refuse!(
                "--kv-memory {} is more than the {} this machine has available{}: give less, \
                 or leave it out (on the CPU the default is a quarter of the available memory, \
                 at most 16 GiB)",
                bytesize::ByteSize(kv),
                crate::host::human_bytes(host.usable()),
                match &host.limit {
                    Some((limit, source)) if *limit < host.available =>
                        format!(" to it ({source})"),
                    _ => String::new(),
                }
            );
        }
        let started = std::time::Instant::now();
        let mut loaded = loader::load(&self.model, &opts)
            .with_context(|| format!("loading model `{}`", self.model))?;
        if profile {
            loaded.model.enable_profiling();
        }
        eprintln!(
            "throng: loaded {} ({}) in {:.1}s",
            self.model,
            loaded.weights,
            started.elapsed().as_secs_f64()
        );
        let weights = loaded.weights.clone();
        Ok((Engine::new(loaded, self.engine_config())?, weights))
    }

    /// Several models, each loaded once, for the `(name, agents)` of `models`: the weights
    /// first, then the KV memory (`--kv-memory`, else the device's default, measured once
    /// all weights are in) split between them by [`kv_shares`]. A model that fails to load
    /// is named at the line of the config that names it (`exp`).
    pub(crate) fn load_engines(
        &self,
        exp: &Experiment,
        models: &[(String, u64)],
    ) -> Result<Vec<RunModel>, RunError> {
        let opts = self.load_options()?;
        let mut loaded = Vec::with_capacity(models.len());
        for (name, _) in models {
            let started = std::time::Instant::now();
            let model = loader::load(name, &opts)
                .map_err(|e| exp.model_error(name, format!("cannot load `{name}`: {e}")))?;
            eprintln!(
                "throng: loaded {name} ({}) in {:.1}s",
                model.weights,
                started.elapsed().as_secs_f64()
            );
            loaded.push(model);
        }
        let total = self
            .engine
            .kv_memory
            .unwrap_or_else(|| crate::engine::default_kv_memory(&opts.device) as u64);
        let agents: Vec<u64> = models.iter().map(|(_, a)| *a).collect();
        let shares = kv_shares(total, &agents);
        loaded
            .into_iter()
            .zip(models)
            .zip(shares)
            .map(|((model, (name, agents)), kv)| {
                let weights = model.weights.clone();
                let cfg = EngineConfig {
                    kv_memory: Some(kv as usize),
                    ..self.engine_config()
                };
                let engine = Engine::new(model, cfg).with_context(|| {
                    format!(
                        "model `{name}`: its share of the KV memory ({}) cannot hold a sequence: \
                         give more --kv-memory",
                        crate::host::human_bytes(kv as f64)
                    )
                })?;
                Ok(RunModel {
                    name: name.clone(),
                    engine,
                    weights,
                    kv_bytes: kv,
                    agents: *agents,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::kv_shares;

    // Guards the split of the KV memory: in proportion to each model's agents, never more
    // than the whole, and never so little that a model of few agents holds nothing.
    #[test]
    fn kv_memory_follows_each_models_agents() {
        assert_eq!(kv_shares(1000, &[3, 1]), [750, 250]);
        let shares = kv_shares(1 << 30, &[1_000_000, 1]);
        assert!(shares.iter().sum::<u64>() <= 1 << 30);
        assert!(shares[1] >= (1 << 30) / 20, "{shares:?}");
        assert_eq!(kv_shares(900, &[0, 0, 0]), [300, 300, 300]);
    }
}
