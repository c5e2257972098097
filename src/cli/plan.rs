//! `throng plan CONFIG`: sizes a run before it is queued (see `crate::sim::plan`).

use super::ModelArgs;
use crate::scenarios::Registry;
use crate::sim::config::PolicyKind;
use crate::sim::experiment::Overrides;
use crate::sim::plan::{self, Figure, Inputs, Source, Speed};
use crate::sim::policy::Llm;
use anyhow::{Context, Result, bail};
use bytesize::ByteSize;
use std::path::PathBuf;

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
        model: model_given.then(|| args.model.model.clone()),
        default_model: super::default_model(),
        ..Overrides::default()
    };
    let loaded = registry.load(&args.config, &overrides)?;
    let exp = loaded.experiment();
    if !exp.policies.uses(PolicyKind::Llm) {
        bail!(
            "every agent of {} uses the scripted policy, which needs no model: nothing to size",
            args.config.display()
        );
    }
    if args.model.max_seqs == 0 {
        bail!("--max-seqs 0 runs no sequence: give at least 1");
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
    let memory = super::MemoryCheck {
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
    let model = ModelArgs {
        model: super::model_of(exp),
        ..args.model.clone()
    };
    let before = resident_bytes();
    let (engine, weights) = model.load_engine_described()?;
    let after = resident_bytes();
    let cfg = engine.model().config().clone();
    let dtype_bytes = engine.model().dtype().size_in_bytes();
    let parameters = cfg.parameters();
    let (memory, weight_bytes, kv_token, where_) = match profile {
        Some(p) => (
            Figure::new(p.memory_bytes, Source::Assumed),
            Figure::new(parameters as f64 * 2.0, Source::Computed),
            Figure::new(cfg.kv_bytes_per_token(2) as f64, Source::Computed),
            format!("{} (stated figures), bf16 weights and KV cache", p.name),
        ),
        None => (
            Figure::new(
                crate::host::total_memory()
                    .context("reading this machine's memory from /proc/meminfo")?
                    as f64,
                Source::Measured,
            ),
            match (before, after) {
                (Some(b), Some(a)) => Figure::new(a - b, Source::Measured),
                _ => Figure::new(parameters as f64 * dtype_bytes as f64, Source::Computed),
            },
            Figure::new(cfg.kv_bytes_per_token(dtype_bytes) as f64, Source::Computed),
            format!("this machine ({}), weights as {weights}", model.device),
        ),
    };
    let prompts = registry.prompts(exp)?;
    let mut llm = Llm::new(engine, prompts, exp.config.history, exp.config.llm.wave);
    println!(
        "throng plan: {} on {} device{}: {where_}",
        exp.config.name,
        args.devices,
        if args.devices == 1 { "" } else { "s" }
    );
    println!(
        "model {}: {parameters} parameters ({:.1} M) [computed from its config]; weights {} [{}]; KV {} per token [{}]",
        model.model,
        parameters as f64 / 1e6,
        bytes(weight_bytes.value),
        match weight_bytes.source {
            Source::Measured => "measured: memory taken by loading them",
            Source::Computed => "computed: parameters x bytes per weight",
            Source::Assumed => "assumed",
        },
        bytes(kv_token.value),
        tag(kv_token),
    );
    let footprint = loaded.footprint()?;
    println!(
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
    );
    if exp.config.history > 0 {
        println!(
            "note: history = {}: later steps' prompts grow by up to {} turns; this sizes the first step",
            exp.config.history, exp.config.history
        );
    }
    let max_tokens = exp.arms.iter().map(|a| a.llm.max_tokens).max().unwrap_or(0);
    for &size in &exp.config.agents.0 {
        let first = loaded.first_step(&mut llm, size, args.sample)?;
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
        let inputs = Inputs {
            devices: args.devices,
            memory_per_device: memory,
            weight_bytes,
            parameters,
            kv_bytes_per_token: kv_token,
            cells: first.cells,
            decisions: first.decisions,
            prompt_tokens: Figure::new(first.prompt_tokens, Source::Measured),
            shared_tokens: Figure::new(first.shared_tokens, Source::Measured),
            prefixes: first.prefixes.len(),
            prefix_tokens: first.prefixes.iter().sum::<usize>() as f64
                / first.prefixes.len().max(1) as f64,
            reply_tokens: reply,
            max_seqs: model.max_seqs,
            speed,
        };
        let e = inputs.estimate();
        println!(
            "\npopulation {size}: {} cells, {} decisions in the first step",
            first.cells, first.decisions
        );
        println!(
            "  prompt tokens per agent  {:.1} [measured: {} first-step prompts rendered and tokenized]",
            first.prompt_tokens, first.tokenized
        );
        println!(
            "  shared system prompt     {:.1} tokens, {:.0}% of prompt tokens [measured; {} distinct]",
            first.shared_tokens,
            e.shared_share * 100.0,
            first.prefixes.len()
        );
        println!(
            "  reply tokens per agent   {:.1} [{}]",
            reply.value,
            match reply.source {
                Source::Measured => format!(
                    "measured: {} sampled decisions",
                    first.sample.as_ref().map_or(0, |s| s.decisions)
                ),
                _ => format!("assumed: max_tokens = {max_tokens}, an upper bound"),
            }
        );
        println!(
            "  KV per agent             {} (own prompt and reply); system prompts {} per device",
            bytes(e.kv_per_sequence),
            bytes(e.kv_prefixes)
        );
        println!(
            "  KV memory per device     {} free for the cache of {} [{}] (less weights, {:.0}% reserve [assumed]); \
             the whole step at once needs {}",
            bytes(e.kv_memory),
            bytes(memory.value),
            tag(memory),
            plan::RESERVED_SHARE * 100.0,
            bytes(e.kv_whole_step)
        );
        println!(
            "  batch per device         {} sequences of {} decisions (at most --max-seqs {})",
            e.batch, e.decisions_per_device, model.max_seqs
        );
        println!(
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
        );
        println!(
            "  fits                     {}",
            if e.fits {
                "yes".to_string()
            } else {
                "NO: the weights and system prompts leave no room for one agent's KV cache; use a bigger device or a smaller model"
                    .to_string()
            }
        );
        if let Some(target) = args.target_step {
            // More devices than decisions would add none that has work.
            let limit = first.decisions.clamp(1, 4096);
            match inputs.devices_for(target, limit) {
                Some(d) => println!(
                    "  for a {target} s step      {d} device{} (agents split evenly; scaling assumed linear)",
                    if d == 1 { "" } else { "s" }
                ),
                None => println!(
                    "  for a {target} s step      not reachable with up to {limit} device{}{}",
                    if limit == 1 { "" } else { "s" },
                    if limit == first.decisions {
                        " (one per decision of the step)"
                    } else {
                        ""
                    }
                ),
            }
        }
    }
    Ok(())
}
