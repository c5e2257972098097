//! `throng plan CONFIG`: the flags become the library's [`PlanOptions`], and
//! [`crate::plan::plan`] writes the plan to standard output.

use super::{GivenArgs, ModelArgs};
use crate::plan::PlanOptions;
use crate::scenarios::Registry;
use crate::sim::config::{PolicyKind, Split};
use anyhow::Result;
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

impl PlanArgs {
    /// The library's options these flags give.
    pub fn options(self, given: &GivenArgs) -> PlanOptions {
        PlanOptions {
            config: self.config,
            devices: self.devices,
            device_profile: self.device_profile,
            sample: given.has("sample").then_some(self.sample),
            target_step: self.target_step,
            agents: self.agents,
            replicates: self.replicates,
            steps: self.steps,
            policy: self.policy,
            split: self.split,
            model: given.has("model").then(|| self.model.model.clone()),
            settings: self.model.settings(),
        }
    }
}

pub fn run(registry: &Registry, args: PlanArgs, given: &GivenArgs) -> Result<()> {
    let options = args.options(given);
    crate::plan::plan(registry, &options, &mut std::io::stdout().lock())?;
    Ok(())
}
