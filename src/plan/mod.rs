//! A run sized before it is queued (`throng plan`): memory, tokens, batch and step time per
//! device, from the config's first step built here and the model sized here or from a
//! device's stated figures (see [`device`] for the arithmetic). The command line and
//! any other caller give typed [`PlanOptions`]; the plan is written, line by line, to the
//! caller's writer.
//!
//! [`plan`] goes through its phases in turn: [`check`] the options, [`load`] the config (a
//! scripted one is sized by [`scripted`] alone), [`size_models`], then each population size's
//! first step, estimate and placement ([`population`]).

pub mod device;
mod error;
mod options;
mod population;
mod scripted;
mod sizing;
mod writer;

pub use error::PlanError;
pub use options::PlanOptions;
pub use sizing::DeviceFormat;

use writer::{Draft, Models, check_devices};

use crate::run::{ModelSettings, RunError, refuse};
use crate::scenarios::{Loaded, Registry};
use crate::sim::config::{PolicyKind, Split};
use crate::sim::experiment::Overrides;
use crate::sim::policy::Llm;
use device::{DeviceProfile, Placement};
use sizing::size_model;
use std::io::Write;

/// Sizes the run `options` describe, writing the plan to `out`.
pub fn plan(
    registry: &Registry,
    options: &PlanOptions,
    out: &mut dyn Write,
) -> Result<(), PlanError> {
    let profile = check(options)?;
    let loaded = load(registry, options)?;
    let exp = loaded.experiment();
    if !exp.uses(PolicyKind::Llm) {
        return scripted::scripted(&options.config, loaded.as_ref(), out);
    }
    let (models, engine) = size_models(options, loaded.as_ref(), profile)?;
    let prompts = registry.prompts(exp)?;
    let llm = Llm::new(engine, prompts, exp.config.history, exp.config.llm.wave);
    let mut plan = Draft::new(options, profile, models, llm, loaded.as_ref());
    plan.header(out)?;
    for &size in &exp.config.agents.0 {
        population::population(&mut plan, size, out)?;
    }
    Ok(())
}

/// Refuses options that cannot make a plan; the device profile they name, if any.
fn check(options: &PlanOptions) -> Result<Option<DeviceProfile>, PlanError> {
    if options.devices == 0 {
        refuse!("--devices must be at least 1");
    }
    let profile = match &options.device_profile {
        None => None,
        Some(name) => Some(*device::profile(name).ok_or_else(|| {
            RunError::Refused(format!(
                "unknown device profile `{name}` (known: {})",
                device::PROFILES
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
fn load(registry: &Registry, options: &PlanOptions) -> Result<Box<dyn Loaded>, PlanError> {
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
    if !exp.uses(PolicyKind::Llm) {
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

fn size_models(
    options: &PlanOptions,
    loaded: &dyn Loaded,
    profile: Option<DeviceProfile>,
) -> Result<(Models, crate::engine::Engine), PlanError> {
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
