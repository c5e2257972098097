//! `throng plan CONFIG`: sizes a run before it is queued (see `crate::sim::plan`).

use super::ModelArgs;
use crate::engine::{Engine, EngineConfig};
use crate::model::synthetic::{Shape, random_llama};
use crate::model::{
    LoadedModel, ModelConfig, ModelSource, Preset, PresetSource, Presets, WeightFormat, loader,
};
use crate::scenarios::Registry;
use crate::sim::config::{PolicyKind, Split};
use crate::sim::experiment::Overrides;
use crate::sim::plan::{
    self, DeviceProfile, ExpertWeights, Figure, Inputs, ModelLoad, Placement, Source, Speed,
};
use crate::sim::policy::Llm;
use anyhow::{Context, Result, anyhow, bail};
use bytesize::ByteSize;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The experiment config.
    pub config: PathBuf,
    /// Devices (ranks) the run would use.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Size for a device's stated figures instead of this machine: h200, h100, a100, l4.
    #[arg(long)]
    pub device_profile: Option<String>,
    /// First-step decisions to make on this device to measure the speed (0: none).
    #[arg(long, default_value_t = 16)]
    pub sample: usize,
    /// A step time to reach, in seconds: says how many devices it needs.
    #[arg(long, value_parser = step_seconds, allow_negative_numbers = true)]
    pub target_step: Option<f64>,
    /// Population sizes, e.g. `20,100` (default: the config's).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub agents: Option<Vec<i64>>,
    #[arg(long, allow_negative_numbers = true)]
    pub replicates: Option<i64>,
    /// Steps (default: the config's).
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<i64>,
    /// The policy, as `throng run --policy` sets it (`scripted` sizes the simulation alone).
    #[arg(long, value_parser = super::choice::PolicyArg::parser())]
    pub policy: Option<PolicyKind>,
    /// How the run's ranks would share it (default: the config's `split`): with several
    /// models, `models` puts each model on devices of its own, as `throng run --split models`.
    #[arg(long, value_parser = super::choice::SplitArg::parser())]
    pub split: Option<Split>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// `--target-step`: a number of seconds above 0 (not NaN, 0, a negative or an infinity).
fn step_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(format!(
            "{text} is not a step time: give the seconds a step may take, a number above 0 (e.g. 30)"
        ));
    }
    Ok(seconds)
}

/// `--devices N` against population `size`'s first step of `decisions`: a device beyond the
/// last decision would have nothing to do, and the estimate would read as a step of no time.
fn check_devices(devices: usize, size: usize, decisions: usize) -> Result<()> {
    if devices > decisions {
        bail!(
            "--devices {devices}: population {size} has {decisions} decisions in its first step, so at most {decisions} devices would have work; plan it with --devices {decisions} or fewer{}",
            if decisions > 0 {
                ""
            } else {
                " (none of its agents acts)"
            }
        );
    }
    Ok(())
}

/// Resident memory of this process, from /proc (Linux); `None` elsewhere.
fn resident_bytes() -> Option<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096.0)
}

fn bytes(b: f64) -> String {
    ByteSize(b.max(0.0) as u64).display().si().to_string()
}

fn tag(f: Figure) -> &'static str {
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
    pub fn on_gpu(weights: WeightFormat) -> Result<Self> {
        Ok(match weights {
            WeightFormat::Auto | WeightFormat::Native | WeightFormat::Bf16 => DeviceFormat::Bf16,
            WeightFormat::F16 => DeviceFormat::F16,
            WeightFormat::F32 => DeviceFormat::F32,
            WeightFormat::Q8_0 => DeviceFormat::Q8_0,
            WeightFormat::Int8 => bail!(
                "--weights int8 runs on the CPU only, and a device profile sizes a GPU: give \
                 --weights auto (bf16) or --weights q8_0"
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
    pub fn activation_bytes(self) -> usize {
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
    pub fn expert_bytes(self, cfg: &ModelConfig) -> f64 {
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
fn tokenizer_engine(preset: &Preset, model: &ModelArgs) -> Result<(Engine, String)> {
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
                    anyhow!(
                        "the weights of `{}` are not on this machine, and to count its prompts' \
                         tokens plan needs its tokenizer or the stand-in Llama 3 tokenizer, \
                         neither of which is here ({e}): run `throng fetch` where there is \
                         network and copy {} over",
                        preset.name,
                        crate::assets::cache_dir().display()
                    )
                })?;
            let dir = path
                .parent()
                .context("the Llama 3 tokenizer asset has no folder")?
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
    let tokenizer = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| anyhow!("cannot read the tokenizer {}: {e}", path.display()))?;
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
fn count(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1} B", n as f64 / 1e9)
    } else {
        format!("{:.1} M", n as f64 / 1e6)
    }
}

/// The smallest change of weight format that makes a model fit one device of `profile`, for
/// a plan whose format does not: `inputs` re-sized in each smaller format throng converts to
/// on a GPU.
fn fitting_format(
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
struct Sized {
    engine: Engine,
    cfg: ModelConfig,
    memory: Figure,
    weight_bytes: Figure,
    weight_how: String,
    kv_token: Figure,
    /// The format on the profile's device, if sizing for one.
    format: Option<DeviceFormat>,
    /// Where the figures of the model come from, for the header.
    where_: String,
    /// Set when sized from the preset's stated config: the label of the token counts.
    stated: Option<String>,
}

fn size_model(model: &ModelArgs, profile: Option<DeviceProfile>) -> Result<Sized> {
    let preset = Presets::builtin().get(&model.model).cloned();
    let format = profile
        .map(|_| DeviceFormat::on_gpu(model.engine.weights))
        .transpose()?;
    let on_profile = |p: DeviceProfile, f: DeviceFormat, cfg: &ModelConfig, stated: bool| {
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
    };
    if let (Some(p), Some(f), Some(preset)) = (profile, format, &preset)
        && !weights_here(&model.model)
    {
        // Planning without the weights: the preset's stated shape, the device's figures.
        let (engine, counted) = tokenizer_engine(preset, model)?;
        let cfg = preset.config.clone();
        let (memory, weight_bytes, weight_how, kv_token) = on_profile(p, f, &cfg, true);
        return Ok(Sized {
            engine,
            cfg,
            memory,
            weight_bytes,
            weight_how,
            kv_token,
            format,
            where_: format!(
                "{} (stated figures), {} weights; the model's weights are not on this machine: \
                 sized from the preset's stated config",
                p.name,
                f.name()
            ),
            stated: Some(counted),
        });
    }
    let before = resident_bytes();
    let (engine, weights) =
        model
            .settings()
            .load_engine_described()
            .map_err(|e| match &preset {
                Some(_) if profile.is_none() && !weights_here(&model.model) => anyhow!(
                    "{}. Or plan it without the weights: with --device-profile NAME ({}) throng \
             sizes it from the preset's stated config",
                    e.one_line(),
                    plan::PROFILES
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => e.into(),
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
                    crate::host::total_memory()
                        .context("reading this machine's memory from /proc/meminfo")?
                        as f64,
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
        cfg,
        memory,
        weight_bytes,
        weight_how,
        kv_token,
        format,
        where_,
        stated: None,
    })
}

pub fn run(registry: &Registry, args: PlanArgs) -> Result<()> {
    if args.devices == 0 {
        bail!("--devices must be at least 1");
    }
    let profile = match &args.device_profile {
        None => None,
        Some(name) => Some(*plan::profile(name).with_context(|| {
            format!(
                "unknown device profile `{name}` (known: {})",
                plan::PROFILES
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?),
    };
    if profile.is_none() && args.sample == 0 {
        bail!(
            "with --sample 0 nothing measures the speed: give --sample N or --device-profile NAME"
        );
    }
    let model_given = super::given("model");
    let overrides = Overrides {
        agents: args.agents.clone(),
        replicates: args.replicates,
        steps: args.steps,
        policy: args.policy,
        model: model_given.then(|| args.model.model.clone()),
        default_model: crate::run::default_model(),
    };
    let loaded = registry.load(&args.config, &overrides)?;
    let exp = loaded.experiment();
    if !exp.policies.uses(PolicyKind::Llm) {
        return scripted(&args.config, loaded.as_ref());
    }
    // Before the model is loaded: no first step has more decisions than agents in its cells.
    let cells = exp.arms.len() * exp.config.replicates.0;
    if let Some((agents, size)) = exp
        .config
        .agents
        .0
        .iter()
        .map(|&size| (size.saturating_mul(cells), size))
        .min()
    {
        check_devices(args.devices, size, agents)?;
    }
    // The plan builds every cell's first step here, as the run would.
    let memory = crate::run::MemoryCheck {
        processes: 1,
        model_on_cpu: false,
        kv_memory: None,
    };
    memory.check(loaded.as_ref()).map_err(|e| {
        anyhow::anyhow!(
            "{}: the plan builds the first step here, as the run would, and {e}",
            args.config.display()
        )
    })?;
    // With several models, the first names the figures below; the placement sizes each.
    let names = crate::run::models_of(exp)?;
    let model = ModelArgs {
        model: names
            .first()
            .cloned()
            .unwrap_or_else(|| crate::run::model_of(exp)),
        ..args.model.clone()
    };
    let shares: Vec<u64> = crate::sim::runner::model_agents(exp)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    let mut others = Vec::new();
    for name in names.iter().skip(1) {
        let other = ModelArgs {
            model: name.clone(),
            ..args.model.clone()
        };
        let sized = size_model(&other, profile)?;
        others.push((name.clone(), sized.cfg, sized.weight_bytes, sized.kv_token));
    }
    let placement = match args.split.unwrap_or(exp.config.split) {
        Split::Models => Placement::SplitModels,
        _ => Placement::Everywhere,
    };
    let Sized {
        engine,
        cfg,
        memory,
        weight_bytes,
        weight_how,
        kv_token,
        format,
        where_,
        stated,
    } = size_model(&model, profile)?;
    let (parameters, active) = (cfg.parameters(), cfg.active_parameters());
    let experts = match (cfg.experts, format) {
        (Some(e), Some(f)) => Some(ExpertWeights {
            count: e.count,
            per_token: e.per_token,
            bytes_each: f.expert_bytes(&cfg),
        }),
        _ => None,
    };
    let sample = match stated {
        // Nothing can decide without the weights; the profile gives the speed.
        Some(_) => 0,
        None => args.sample,
    };
    let prompts = registry.prompts(exp)?;
    let mut llm = Llm::new(engine, prompts, exp.config.history, exp.config.llm.wave);
    out!(
        "throng plan: {} on {} device{}: {where_}",
        exp.config.name,
        args.devices,
        if args.devices == 1 { "" } else { "s" }
    )?;
    let from = match &stated {
        Some(_) => "computed from the preset's stated config",
        None => "computed from its config",
    };
    let kv_tag = match &stated {
        Some(_) => "computed from the preset's stated config",
        None => tag(kv_token),
    };
    let size = match cfg.experts {
        Some(e) => format!(
            "{parameters} parameters ({}) in memory, {active} ({}) multiplied per token \
             ({} of {} experts) [{from}]",
            count(parameters),
            count(active),
            e.per_token,
            e.count
        ),
        None => format!("{parameters} parameters ({}) [{from}]", count(parameters)),
    };
    out!(
        "model {} ({:?}): {size}; weights {} [{weight_how}]; KV {} per token [{kv_tag}]",
        model.model,
        cfg.family,
        bytes(weight_bytes.value),
        bytes(kv_token.value),
    )?;
    let footprint = loaded.footprint()?;
    out!(
        "simulation {} at its largest population ({} agents in each of {} cell{}), the model aside [computed: {}]",
        plan::human_bytes(footprint.bytes()),
        footprint.population,
        footprint.cells,
        if footprint.cells == 1 { "" } else { "s" },
        footprint
            .parts
            .iter()
            .take(2)
            .map(|p| format!("{} {}", p.what, plan::human_bytes(p.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    if exp.config.history > 0 {
        out!(
            "note: history = {}: later steps' prompts grow by up to {} turns; this sizes the first step",
            exp.config.history,
            exp.config.history
        )?;
    }
    if stated.is_some() && args.sample > 0 && super::given("sample") {
        out!(
            "note: --sample {} is not used: without the weights nothing decides here; the speed is the profile's",
            args.sample
        )?;
    }
    let max_tokens = exp.arms.iter().map(|a| a.llm.max_tokens).max().unwrap_or(0);
    for &size in &exp.config.agents.0 {
        let first = loaded.first_step(&mut llm, size, sample)?;
        check_devices(args.devices, size, first.decisions)?;
        let reply = match &first.sample {
            Some(s) if s.decisions > 0 => Figure::new(
                s.generated_tokens as f64 / s.decisions as f64,
                Source::Measured,
            ),
            _ => Figure::new(max_tokens as f64, Source::Assumed),
        };
        let speed = match (profile, &first.sample) {
            (Some(p), _) => Speed::Profile(p),
            (None, Some(s)) => Speed::Measured {
                decisions: s.decisions,
                seconds: s.seconds,
            },
            (None, None) => {
                bail!("nothing measures the speed: give --sample N or --device-profile NAME")
            }
        };
        let tokens = if stated.is_some() {
            Source::Assumed
        } else {
            Source::Measured
        };
        let inputs = Inputs {
            devices: args.devices,
            memory_per_device: memory,
            weight_bytes,
            parameters,
            active_parameters: active,
            experts,
            kv_bytes_per_token: kv_token,
            cells: first.cells,
            decisions: first.decisions,
            prompt_tokens: Figure::new(first.prompt_tokens, tokens),
            shared_tokens: Figure::new(first.shared_tokens, tokens),
            prefixes: first.prefixes.len(),
            prefix_tokens: first.prefixes.iter().sum::<usize>() as f64
                / first.prefixes.len().max(1) as f64,
            reply_tokens: reply,
            max_seqs: model.engine.max_seqs,
            speed,
        };
        let e = inputs.estimate();
        out!(
            "\npopulation {size}: {} cells, {} decisions in the first step",
            first.cells,
            first.decisions
        )?;
        match &stated {
            Some(counted) => out!(
                "  prompt tokens per agent  {:.1} [{counted}; {} first-step prompts rendered]",
                first.prompt_tokens,
                first.tokenized
            )?,
            None => out!(
                "  prompt tokens per agent  {:.1} [measured: {} first-step prompts rendered and tokenized]",
                first.prompt_tokens,
                first.tokenized
            )?,
        }
        out!(
            "  shared system prompt     {:.1} tokens, {:.0}% of prompt tokens [{}; {} distinct]",
            first.shared_tokens,
            e.shared_share * 100.0,
            if stated.is_some() {
                "as counted above"
            } else {
                "measured"
            },
            first.prefixes.len()
        )?;
        out!(
            "  reply tokens per agent   {:.1} [{}]",
            reply.value,
            match reply.source {
                Source::Measured => format!(
                    "measured: {} sampled decisions",
                    first.sample.as_ref().map_or(0, |s| s.decisions)
                ),
                _ => format!("assumed: max_tokens = {max_tokens}, an upper bound"),
            }
        )?;
        out!(
            "  KV per agent             {} (own prompt and reply); system prompts {} per device",
            bytes(e.kv_per_sequence),
            bytes(e.kv_prefixes)
        )?;
        out!(
            "  KV memory per device     {} free for the cache of {} [{}] (less weights, {:.0}% reserve [assumed]); \
             the whole step at once needs {}",
            bytes(e.kv_memory),
            bytes(memory.value),
            tag(memory),
            plan::RESERVED_SHARE * 100.0,
            bytes(e.kv_whole_step)
        )?;
        out!(
            "  batch per device         {} sequences of {} decisions (at most --max-seqs {})",
            e.batch,
            e.decisions_per_device,
            model.engine.max_seqs
        )?;
        if !e.fits {
            out!("  step time                none: it does not fit (see below)")?;
        } else {
            out!(
                "  step time                {:.2} s [{}]",
                e.step_seconds.value,
                match (&speed, &first.sample) {
                    (Speed::Measured { .. }, Some(s)) => format!(
                        "measured: {} decisions took {:.2} s here, scaled to {} per device",
                        s.decisions, s.seconds, e.decisions_per_device
                    ),
                    _ => format!(
                        "assumed: stated bandwidth and FLOP/s at {:.0}% and {:.0}% efficiency",
                        plan::BANDWIDTH_EFFICIENCY * 100.0,
                        plan::FLOPS_EFFICIENCY * 100.0
                    ),
                }
            )?;
        }
        if let (Some(touched), Some(x), true) = (e.experts_touched, experts, e.fits) {
            out!(
                "  experts per decode step  {touched:.1} of {} a layer read from memory at a batch of {} \
                 ({} of {} weights) [assumed: uniform routing]; compute counts the {} routed experts \
                 of each token ({} parameters)",
                x.count,
                e.batch.max(1),
                bytes(e.weights_read),
                bytes(weight_bytes.value),
                x.per_token,
                count(active)
            )?;
        }
        // Where the models go: each with its share of the step's decisions (the run's agents
        // it decides for), the prompts counted once for all (their text is the same).
        let all: u64 = shares.iter().sum::<u64>().max(1);
        let share = |i: usize| {
            let n = shares.get(i).copied().unwrap_or(all);
            (first.decisions as u128 * n as u128 / all as u128) as usize
        };
        let sequence_tokens = (first.prompt_tokens - first.shared_tokens).max(0.0) + reply.value;
        let prefix_tokens = first.prefixes.iter().sum::<usize>() as f64;
        let mut models = vec![ModelLoad {
            name: model.model.clone(),
            weight_bytes: weight_bytes.value,
            kv_bytes_per_token: kv_token.value,
            decisions: if others.is_empty() {
                first.decisions
            } else {
                share(0)
            },
            sequence_tokens,
            prefix_tokens,
            active_parameters: active,
        }];
        for (i, (name, cfg, weights, kv)) in others.iter().enumerate() {
            models.push(ModelLoad {
                name: name.clone(),
                weight_bytes: weights.value,
                kv_bytes_per_token: kv.value,
                decisions: share(i + 1),
                sequence_tokens,
                prefix_tokens,
                active_parameters: cfg.active_parameters(),
            });
        }
        if !others.is_empty() {
            out!(
                "  models                   {} ({}): {}",
                models.len(),
                match placement {
                    Placement::SplitModels => "split across devices, as --split models runs them",
                    Placement::Everywhere => "every device holds every model",
                },
                models
                    .iter()
                    .map(|m| format!(
                        "{} weights {}, {} decisions",
                        m.name,
                        bytes(m.weight_bytes),
                        m.decisions
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            )?;
        }
        let placed = plan::place(&models, args.devices, memory.value, placement)?;
        for line in placed.lines() {
            out!("  {line}")?;
        }
        let fits = if e.fits {
            "yes".to_string()
        } else {
            let usable = memory.value * (1.0 - plan::RESERVED_SHARE);
            let what = if weight_bytes.value > usable {
                format!(
                    "its weights ({}) are more than the {} a device leaves for them and the KV cache",
                    bytes(weight_bytes.value),
                    bytes(usable)
                )
            } else {
                "the weights and system prompts leave no room for one agent's KV cache".to_string()
            };
            let devices = if args.devices > 1 {
                format!(
                    " More devices do not help: each of the {} holds the whole model (throng \
                     splits agents across devices, not a model's layers or tensors).",
                    args.devices
                )
            } else {
                " More devices would not help: each holds the whole model (throng splits \
                 agents across devices, not a model's layers or tensors)."
                    .to_string()
            };
            match (profile, format) {
                (Some(p), Some(f)) => match fitting_format(&cfg, f, &inputs) {
                    (Some((fit, w)), _) => format!(
                        "NO in {}: {what}. It fits with --weights {} ({} of weights; its KV cache \
                         is f32, and attention runs as gathered matmuls rather than paged \
                         FlashAttention).{devices}",
                        f.name(),
                        fit.name(),
                        bytes(w)
                    ),
                    (None, smallest) => format!(
                        "NO: {what}, and no weight format throng converts to on a GPU makes it fit \
                         (q8_0, the smallest, takes {}): not runnable on one {}; use a device \
                         with more memory or a smaller model.{devices}",
                        bytes(smallest),
                        p.name
                    ),
                },
                _ => format!("NO: {what}; use a bigger device or a smaller model"),
            }
        };
        out!("  fits                     {fits}")?;
        if let Some(target) = args.target_step {
            // More devices than decisions would add none that has work.
            let limit = first.decisions.clamp(1, 4096);
            match inputs.devices_for(target, limit) {
                Some(d) => out!(
                    "  for a {target} s step      {d} device{} (agents split evenly; scaling assumed linear)",
                    if d == 1 { "" } else { "s" }
                )?,
                None => out!(
                    "  for a {target} s step      not reachable with up to {limit} device{}{}",
                    if limit == 1 { "" } else { "s" },
                    if limit == first.decisions {
                        " (one per decision of the step)"
                    } else {
                        ""
                    }
                )?,
            }
        }
    }
    Ok(())
}

/// `throng plan` of a config whose agents all follow rules: no model to size, but the
/// simulation's memory, part by part, and whether this machine holds it (the check `throng
/// run` makes before it writes anything).
fn scripted(config: &std::path::Path, loaded: &dyn crate::scenarios::Loaded) -> Result<()> {
    let footprint = loaded.footprint()?;
    out!(
        "{}: every agent follows the scripted policy, so there is no model to size; the \
         simulation needs about {} at its largest population ({} agents in each of {} cell{}):",
        config.display(),
        plan::human_bytes(footprint.bytes()),
        footprint.population,
        footprint.cells,
        if footprint.cells == 1 { "" } else { "s" },
    )?;
    for part in &footprint.parts {
        out!(
            "  {:>10}  {} (lower {})",
            plan::human_bytes(part.bytes),
            part.what,
            part.lower
        )?;
    }
    match crate::sim::plan::HostMemory::here() {
        Some(host) => match footprint.check(&host, 1) {
            Ok(()) => out!(
                "fits this machine, which lets a run use {} of its {} available",
                plan::human_bytes(host.usable()),
                plan::human_bytes(host.available)
            )?,
            Err(e) => out!("does not fit this machine: {e}")?,
        },
        None => out!("this machine does not say how much memory it has")?,
    }
    Ok(())
}
