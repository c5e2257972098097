//! A run sized before it is queued (`throng plan`): memory, tokens, batch and step time per
//! device, from the config's first step built here and the model sized here or from a
//! device's stated figures (see `crate::sim::plan` for the arithmetic). The command line and
//! any other caller give typed [`PlanOptions`]; the plan is written, line by line, to the
//! caller's writer.
//!
//! [`plan`] goes through its phases in turn: [`check`] the options, [`load`] the config (a
//! scripted one is sized by [`scripted`] alone), [`size_models`], then each population size's
//! first step, estimate and placement ([`population`]).

mod population;
mod scripted;
mod sizing;

pub use sizing::DeviceFormat;

use crate::run::{ModelSettings, RunError, refuse};
use crate::scenarios::{Loaded, Registry};
use crate::sim::config::{PolicyKind, Split};
use crate::sim::experiment::Overrides;
use crate::sim::plan::{self, DeviceProfile, ExpertWeights, Figure, Placement};
use crate::sim::policy::Llm;
use sizing::{Figures, bytes, count, size_model, tag};
use std::io::Write;
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

/// Sample decisions when none are asked.
const DEFAULT_SAMPLE: usize = 16;

/// `writeln!` to the plan's writer, its error a [`RunError`].
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*).map_err(RunError::from)
    };
}
use say;

/// Sizes the run `options` describe, writing the plan to `out`.
pub fn plan(
    registry: &Registry,
    options: &PlanOptions,
    out: &mut dyn Write,
) -> Result<(), RunError> {
    let profile = check(options)?;
    let loaded = load(registry, options)?;
    let exp = loaded.experiment();
    if !exp.policies.uses(PolicyKind::Llm) {
        return scripted::scripted(&options.config, loaded.as_ref(), out);
    }
    let (models, engine) = size_models(options, loaded.as_ref(), profile)?;
    let prompts = registry.prompts(exp)?;
    let llm = Llm::new(engine, prompts, exp.config.history, exp.config.llm.wave);
    let mut plan = Plan::new(options, profile, models, llm, loaded.as_ref());
    plan.header(out)?;
    for &size in &exp.config.agents.0 {
        population::population(&mut plan, size, out)?;
    }
    Ok(())
}

/// Refuses options that cannot make a plan; the device profile they name, if any.
fn check(options: &PlanOptions) -> Result<Option<DeviceProfile>, RunError> {
    if options.devices == 0 {
        refuse!("--devices must be at least 1");
    }
    let profile = match &options.device_profile {
        None => None,
        Some(name) => Some(*plan::profile(name).ok_or_else(|| {
            RunError::Refused(format!(
                "unknown device profile `{name}` (known: {})",
                plan::PROFILES
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?),
    };
    if profile.is_none() && options.sample == Some(0) {
        refuse!(
            "with --sample 0 nothing measures the speed: give --sample N or --device-profile NAME"
        );
    }
    Ok(profile)
}

/// The config with the overrides, checked as a run checks it: the devices against the first
/// steps' decisions and the first step against this machine's memory (the plan builds it
/// here, as the run would).
fn load(registry: &Registry, options: &PlanOptions) -> Result<Box<dyn Loaded>, RunError> {
    let overrides = Overrides {
        agents: options.agents.clone(),
        replicates: options.replicates,
        steps: options.steps,
        policy: options.policy,
        model: options.model.clone(),
        default_model: crate::run::default_model(),
    };
    let loaded = registry.load(&options.config, &overrides)?;
    let exp = loaded.experiment();
    if !exp.policies.uses(PolicyKind::Llm) {
        return Ok(loaded);
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
        check_devices(options.devices, size, agents)?;
    }
    let memory = crate::run::MemoryCheck {
        processes: 1,
        model_on_cpu: false,
        kv_memory: None,
    };
    if let Err(e) = memory.check(loaded.as_ref()) {
        refuse!(
            "{}: the plan builds the first step here, as the run would, and {e}",
            options.config.display()
        );
    }
    Ok(loaded)
}

/// `--devices N` against population `size`'s first step of `decisions`: a device beyond the
/// last decision would have nothing to do, and the estimate would read as a step of no time.
fn check_devices(devices: usize, size: usize, decisions: usize) -> Result<(), RunError> {
    if devices > decisions {
        refuse!(
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

/// The run's models as sized: the first, which names the figures, and the others, each
/// sized for the placement; each model's share of the agents.
struct Models {
    name: String,
    sized: Figures,
    others: Vec<(String, crate::model::ModelConfig, Figure, Figure)>,
    shares: Vec<u64>,
    placement: Placement,
}

fn size_models(
    options: &PlanOptions,
    loaded: &dyn Loaded,
    profile: Option<DeviceProfile>,
) -> Result<(Models, crate::engine::Engine), RunError> {
    let exp = loaded.experiment();
    // With several models, the first names the figures; the placement sizes each.
    let names = crate::run::models_of(exp)?;
    let name = names
        .first()
        .cloned()
        .unwrap_or_else(|| crate::run::model_of(exp));
    let shares: Vec<u64> = crate::sim::runner::model_agents(exp)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    let mut others = Vec::new();
    for other in names.iter().skip(1) {
        let settings = ModelSettings {
            model: other.clone(),
            ..options.settings.clone()
        };
        let sized = size_model(&settings, profile)?.figures;
        others.push((other.clone(), sized.cfg, sized.weight_bytes, sized.kv_token));
    }
    let placement = match options.split.unwrap_or(exp.config.split) {
        Split::Models => Placement::SplitModels,
        _ => Placement::Everywhere,
    };
    let settings = ModelSettings {
        model: name.clone(),
        ..options.settings.clone()
    };
    let sized = size_model(&settings, profile)?;
    let models = Models {
        name,
        sized: sized.figures,
        others,
        shares,
        placement,
    };
    Ok((models, sized.engine))
}

/// A plan being written: what every population size's part reads.
struct Plan<'a> {
    options: &'a PlanOptions,
    profile: Option<DeviceProfile>,
    loaded: &'a dyn Loaded,
    models: Models,
    llm: Llm,
    experts: Option<ExpertWeights>,
    /// Sample decisions to make: none without the weights.
    sample: usize,
    max_tokens: usize,
}

impl<'a> Plan<'a> {
    fn new(
        options: &'a PlanOptions,
        profile: Option<DeviceProfile>,
        models: Models,
        llm: Llm,
        loaded: &'a dyn Loaded,
    ) -> Self {
        let exp = loaded.experiment();
        let sized = &models.sized;
        let experts = match (sized.cfg.experts, sized.format) {
            (Some(e), Some(f)) => Some(ExpertWeights {
                count: e.count,
                per_token: e.per_token,
                bytes_each: f.expert_bytes(&sized.cfg),
            }),
            _ => None,
        };
        let sample = match sized.stated {
            // Nothing can decide without the weights; the profile gives the speed.
            Some(_) => 0,
            None => options.sample.unwrap_or(DEFAULT_SAMPLE),
        };
        Self {
            options,
            profile,
            loaded,
            models,
            llm,
            experts,
            sample,
            max_tokens: exp.arms.iter().map(|a| a.llm.max_tokens).max().unwrap_or(0),
        }
    }

    /// The plan's first lines: the devices, the model, the simulation, and notes.
    fn header(&self, out: &mut dyn Write) -> Result<(), RunError> {
        let exp = self.loaded.experiment();
        let devices = self.options.devices;
        let s = &self.models.sized;
        say!(
            out,
            "throng plan: {} on {} device{}: {}",
            exp.config.name,
            devices,
            if devices == 1 { "" } else { "s" },
            s.where_
        )?;
        let from = match &s.stated {
            Some(_) => "computed from the preset's stated config",
            None => "computed from its config",
        };
        let kv_tag = match &s.stated {
            Some(_) => "computed from the preset's stated config",
            None => tag(s.kv_token),
        };
        let (parameters, active) = (s.cfg.parameters(), s.cfg.active_parameters());
        let size = match s.cfg.experts {
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
        say!(
            out,
            "model {} ({:?}): {size}; weights {} [{}]; KV {} per token [{kv_tag}]",
            self.models.name,
            s.cfg.family,
            bytes(s.weight_bytes.value),
            s.weight_how,
            bytes(s.kv_token.value),
        )?;
        let footprint = self.loaded.footprint()?;
        say!(
            out,
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
            say!(
                out,
                "note: history = {}: later steps' prompts grow by up to {} turns; this sizes the first step",
                exp.config.history,
                exp.config.history
            )?;
        }
        if let (Some(_), Some(sample)) = (&s.stated, self.options.sample.filter(|&n| n > 0)) {
            say!(
                out,
                "note: --sample {sample} is not used: without the weights nothing decides here; the speed is the profile's",
            )?;
        }
        Ok(())
    }
}
