//! The model as a plan sizes it: its weights, KV cache and memory, measured by loading it here
//! or computed from a device profile's stated figures and the preset's stated config (when
//! its weights are not on this machine).

use super::device::{self, DeviceProfile, ExpertWeights, Figure, Inputs, Source};
use super::error::PlanError;
use crate::engine::{Engine, EngineConfig};
use crate::model::synthetic::{Shape, random_llama};
use crate::model::{
    LoadedModel, ModelConfig, ModelSource, Preset, PresetSource, Presets, WeightFormat, loader,
};
use crate::run::{ModelSettings, RunError, refuse};
use bytesize::ByteSize;
use std::path::{Path, PathBuf};

/// Resident memory of this process, from /proc (Linux); `None` elsewhere.
fn resident_bytes() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0)
}

pub fn bytes(b: f64) -> String {
    ByteSize(b.max(0.0) as u64).display().si().to_string()
}

pub fn tag(f: Figure) -> &'static str {
    f.source.label()
}

/// What a GPU holds weights as after throng's conversion at load: what a device profile is
/// sized in (`--weights` on CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceFormat {
    Bf16,
    F16,
    F32,
    Q8_0,
}

impl DeviceFormat {
    /// What `--weights` becomes on a GPU (`auto` and `native` of safetensors: bf16).
    pub(crate) fn on_gpu(weights: WeightFormat) -> Result<Self, PlanError> {
        Ok(match weights {
            WeightFormat::Auto | WeightFormat::Native | WeightFormat::Bf16 => DeviceFormat::Bf16,
            WeightFormat::F16 => DeviceFormat::F16,
            WeightFormat::F32 => DeviceFormat::F32,
            WeightFormat::Q8_0 => DeviceFormat::Q8_0,
            WeightFormat::Int8 | WeightFormat::Gguf | WeightFormat::Gguf8 => refuse!(
                "--weights {} runs on the CPU only, and a device profile sizes a GPU: give \
                 --weights auto (bf16) or --weights q8_0",
                weights.name()
            ),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceFormat::Bf16 => "bf16",
            DeviceFormat::F16 => "f16",
            DeviceFormat::F32 => "f32",
            DeviceFormat::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one key or value in the KV cache, and of a vector weight: the activation
    /// dtype, which is f32 under quantized weights (`Llama::load`).
    pub(crate) fn activation_bytes(self) -> usize {
        match self {
            DeviceFormat::Bf16 | DeviceFormat::F16 => 2,
            DeviceFormat::F32 | DeviceFormat::Q8_0 => 4,
        }
    }

    /// Bytes of one weight of a matrix: q8_0 stores 32 weights in 34 bytes.
    fn matrix_bytes(self) -> f64 {
        match self {
            DeviceFormat::Q8_0 => 34.0 / 32.0,
            other => other.activation_bytes() as f64,
        }
    }

    /// The weights of a `cfg` model as throng's loader holds them in this format: every
    /// matrix (the output head included: a tied embedding is held twice, as the table and as
    /// the head) in the format; the embedding table, norms and biases in the activation
    /// dtype; a mixture's routers in f32.
    pub fn weight_bytes(self, cfg: &ModelConfig) -> f64 {
        let (h, layers) = (cfg.hidden_size as f64, cfg.num_layers as f64);
        let table = cfg.vocab_size as f64 * h;
        let biases = if cfg.attention_bias {
            cfg.qkv_width() as f64
        } else {
            0.0
        };
        let vectors = (2.0 * layers + 1.0) * h + layers * biases;
        let routers = cfg.experts.map_or(0.0, |e| layers * e.count as f64 * h);
        let head_copy = if cfg.tie_word_embeddings { table } else { 0.0 };
        let matrices = cfg.parameters() as f64 - table - vectors - routers + head_copy;
        matrices * self.matrix_bytes()
            + (table + vectors) * self.activation_bytes() as f64
            + routers * 4.0
    }

    /// Bytes of one expert's weights over every layer, for a mixture.
    pub(crate) fn expert_bytes(self, cfg: &ModelConfig) -> f64 {
        let (h, i) = (cfg.hidden_size as f64, cfg.intermediate_size as f64);
        cfg.num_layers as f64 * 3.0 * h * i * self.matrix_bytes()
    }

    /// How the weights figure is computed, for its label.
    fn how(self) -> &'static str {
        match self {
            DeviceFormat::Q8_0 => {
                "matrices in q8_0 (34 bytes per 32 weights), embedding and norms in f32"
            }
            DeviceFormat::F32 => "4 bytes a weight (f32)",
            DeviceFormat::Bf16 => "2 bytes a weight (bf16)",
            DeviceFormat::F16 => "2 bytes a weight (f16)",
        }
    }
}

/// Whether the weights `spec` names are on this machine (a path, a cached Hub snapshot or
/// packaged asset); a name that does not resolve is left to the loader to report.
fn weights_here(spec: &str) -> bool {
    match ModelSource::resolve(spec) {
        Ok(ModelSource::Hub { repo, revision }) => loader::hub_snapshot_cached(&repo, &revision),
        Ok(ModelSource::Asset { asset, .. }) => crate::assets::is_cached(&asset),
        Ok(ModelSource::HfDir(_) | ModelSource::Gguf(_)) | Err(_) => true,
    }
}

/// The folder of `preset`'s own tokenizer in the Hugging Face cache, if it is there (a
/// tokenizer is a few MB: it may be cached where the weights are not).
fn cached_tokenizer_dir(preset: &Preset) -> Option<PathBuf> {
    let PresetSource::Hub { hub, revision } = &preset.source else {
        return None;
    };
    let repo = hf_hub::Repo::with_revision(hub.clone(), hf_hub::RepoType::Model, revision.clone());
    let path = hf_hub::Cache::from_env().repo(repo).get("tokenizer.json")?;
    path.parent().map(Path::to_path_buf)
}

/// An engine that renders and tokenizes prompts as `preset`'s model would, without its
/// weights: a tiny random model stands in for them and never runs (nothing is sampled); the
/// tokenizer and chat template are the model's own when the Hugging Face cache has them,
/// else the packaged Llama 3 ones. Returns the engine and the label of its token counts.
fn tokenizer_engine(preset: &Preset, model: &ModelSettings) -> Result<(Engine, String), PlanError> {
    let (dir, counted) = match cached_tokenizer_dir(preset) {
        Some(dir) => (
            dir,
            "measured: counted with the model's own tokenizer and chat template, from the \
             Hugging Face cache"
                .to_string(),
        ),
        None => {
            let path =
                crate::assets::ensure_file("llama3-tokenizer", "tokenizer.json").map_err(|e| {
                    RunError::Refused(format!(
                        "the weights of `{}` are not on this machine, and to count its prompts' \
                         tokens plan needs its tokenizer or the stand-in Llama 3 tokenizer, \
                         neither of which is here ({e}): run `throng fetch` where there is \
                         network and copy {} over",
                        preset.name,
                        crate::assets::cache_dir().display()
                    ))
                })?;
            let dir = path
                .parent()
                .ok_or_else(|| {
                    RunError::Refused("the Llama 3 tokenizer asset has no folder".into())
                })?
                .to_path_buf();
            (
                dir,
                format!(
                    "assumed: counted with the Llama 3 tokenizer and chat template, as {}'s own \
                     are not in the Hugging Face cache",
                    preset.name
                ),
            )
        }
    };
    let (path, counted) = match &model.engine.tokenizer {
        Some(path) => (
            path.clone(),
            format!("measured: counted with --tokenizer {}", path.display()),
        ),
        None => (dir.join("tokenizer.json"), counted),
    };
    let tokenizer = tokenizers::Tokenizer::from_file(&path).map_err(|e| {
        RunError::Refused(format!("cannot read the tokenizer {}: {e}", path.display()))
    })?;
    let chat = loader::read_chat_spec(&dir)?;
    let stand_in = random_llama(Shape::Tiny, WeightFormat::F32, &candle_core::Device::Cpu, 0)?;
    let loaded = LoadedModel {
        name: preset.name.clone(),
        model: stand_in,
        tokenizer,
        chat,
        weights: "none (sized from the preset's stated config)".into(),
        origin: crate::model::Origin::Generated(format!("a stand-in for {}", preset.name)),
    };
    let engine = Engine::new(
        loaded,
        EngineConfig {
            kv_memory: Some(4 << 20),
            max_seqs: model.engine.max_seqs,
            ..EngineConfig::default()
        },
    )?;
    Ok((engine, counted))
}

/// `1.2 B`, `134.5 M`: a parameter count for people.
pub fn count(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1} B", n as f64 / 1e9)
    } else {
        format!("{:.1} M", n as f64 / 1e6)
    }
}

/// The smallest change of weight format that makes a model fit one device of `profile`, for
/// a plan whose format does not: `inputs` re-sized in each smaller format throng converts to
/// on a GPU.
pub(crate) fn fitting_format(
    cfg: &ModelConfig,
    current: DeviceFormat,
    inputs: &Inputs,
) -> (Option<(DeviceFormat, f64)>, f64) {
    let mut smallest = current.weight_bytes(cfg);
    for format in [DeviceFormat::Bf16, DeviceFormat::Q8_0] {
        let weights = format.weight_bytes(cfg);
        if weights >= current.weight_bytes(cfg) {
            continue;
        }
        smallest = smallest.min(weights);
        let resized = Inputs {
            weight_bytes: Figure::new(weights, Source::Computed),
            kv_bytes_per_token: Figure::new(
                cfg.kv_bytes_per_token(format.activation_bytes()) as f64,
                Source::Computed,
            ),
            experts: inputs.experts.map(|e| ExpertWeights {
                bytes_each: format.expert_bytes(cfg),
                ..e
            }),
            ..inputs.clone()
        };
        if resized.estimate().fits {
            return (Some((format, weights)), smallest);
        }
    }
    (None, smallest)
}

/// The model as the plan sizes it.
pub(crate) struct Sized {
    pub engine: Engine,
    pub figures: Figures,
}

/// The figures of a sized model.
pub struct Figures {
    pub cfg: ModelConfig,
    pub memory: Figure,
    pub weight_bytes: Figure,
    pub weight_how: String,
    pub kv_token: Figure,
    /// The format on the profile's device, if sizing for one.
    pub format: Option<DeviceFormat>,
    /// Where the figures of the model come from, for the header.
    pub where_: String,
    /// Set when sized from the preset's stated config: the label of the token counts.
    pub stated: Option<String>,
}

/// The figures of `cfg` on a device of `profile` in `format`: its memory, the weights, how
/// they were computed, and the KV cache per token.
fn on_profile(
    p: DeviceProfile,
    f: DeviceFormat,
    cfg: &ModelConfig,
    stated: bool,
) -> (Figure, Figure, String, Figure) {
    let source = if stated {
        "computed from the preset's stated config"
    } else {
        "computed"
    };
    (
        Figure::new(p.memory_bytes, Source::Assumed),
        Figure::new(f.weight_bytes(cfg), Source::Computed),
        format!("{source}: {}", f.how()),
        Figure::new(
            cfg.kv_bytes_per_token(f.activation_bytes()) as f64,
            Source::Computed,
        ),
    )
}

/// `preset` sized without its weights: its stated config on a device of `p` in `f`, its
/// prompts counted by a stand-in engine (see [`tokenizer_engine`]).
fn stated(
    preset: &Preset,
    model: &ModelSettings,
    p: DeviceProfile,
    f: DeviceFormat,
) -> Result<Sized, PlanError> {
    let (engine, counted) = tokenizer_engine(preset, model)?;
    let cfg = preset.config.clone();
    let (memory, weight_bytes, weight_how, kv_token) = on_profile(p, f, &cfg, true);
    Ok(Sized {
        engine,
        figures: Figures {
            cfg,
            memory,
            weight_bytes,
            weight_how,
            kv_token,
            format: Some(f),
            where_: format!(
                "{} (stated figures), {} weights; the model's weights are not on this machine: \
                 sized from the preset's stated config",
                p.name,
                f.name()
            ),
            stated: Some(counted),
        },
    })
}

/// `model` as the plan sizes it: loaded here and measured (on a device profile, its figures
/// computed for that device), or from its preset's stated config when its weights are not here.
pub(crate) fn size_model(
    model: &ModelSettings,
    profile: Option<DeviceProfile>,
) -> Result<Sized, PlanError> {
    let preset = Presets::builtin().get(&model.model).cloned();
    let format = profile
        .map(|_| DeviceFormat::on_gpu(model.engine.weights))
        .transpose()?;
    if let (Some(p), Some(f), Some(preset)) = (profile, format, &preset)
        && !weights_here(&model.model)
    {
        // Planning without the weights: the preset's stated shape, the device's figures.
        return stated(preset, model, p, f);
    }
    let before = resident_bytes();
    let (engine, weights) = model.load_engine_described().map_err(|e| match &preset {
        Some(_) if profile.is_none() && !weights_here(&model.model) => RunError::Refused(format!(
            "{}. Or plan it without the weights: with --device-profile NAME ({}) throng \
             sizes it from the preset's stated config",
            e.one_line(),
            device::PROFILES
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => e,
    })?;
    let after = resident_bytes();
    let cfg = engine.model().config().clone();
    let dtype_bytes = engine.model().dtype().size_in_bytes();
    let parameters = cfg.parameters();
    let (memory, weight_bytes, weight_how, kv_token, where_) = match (profile, format) {
        (Some(p), Some(f)) => {
            let (memory, weight_bytes, how, kv_token) = on_profile(p, f, &cfg, false);
            let where_ = format!(
                "{} (stated figures), {} weights, KV cache in {}",
                p.name,
                f.name(),
                if f.activation_bytes() == 2 {
                    f.name()
                } else {
                    "f32"
                }
            );
            (memory, weight_bytes, how, kv_token, where_)
        }
        _ => {
            let (weight_bytes, how) = match (before, after) {
                (Some(b), Some(a)) => (
                    Figure::new(a - b, Source::Measured),
                    "measured: memory taken by loading them".to_string(),
                ),
                _ => (
                    Figure::new(parameters as f64 * dtype_bytes as f64, Source::Computed),
                    "computed: parameters x bytes per weight".to_string(),
                ),
            };
            (
                Figure::new(
                    crate::host::total_memory().ok_or_else(|| {
                        RunError::Refused("reading this machine's memory from /proc/meminfo".into())
                    })? as f64,
                    Source::Measured,
                ),
                weight_bytes,
                how,
                Figure::new(
                    cfg.kv_bytes_per_token(engine.kv_cache().dtype().size_in_bytes()) as f64,
                    Source::Computed,
                ),
                format!(
                    "this machine ({}), weights as {weights}",
                    model.engine.device
                ),
            )
        }
    };
    Ok(Sized {
        engine,
        figures: Figures {
            cfg,
            memory,
            weight_bytes,
            weight_how,
            kv_token,
            format,
            where_,
            stated: None,
        },
    })
}
