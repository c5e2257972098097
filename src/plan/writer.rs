//! A plan being written: what every population size's part reads, and the way it writes.

use super::device::{DeviceProfile, ExpertWeights, Figure, Placement};
use super::error::PlanError;
use super::options::PlanOptions;
use super::sizing::{Figures, bytes, count, tag};
use crate::run::refuse;
use crate::scenarios::Loaded;
use crate::sim::policy::Llm;
use std::io::Write;

/// Sample decisions when none are asked.
const DEFAULT_SAMPLE: usize = 16;

/// `writeln!` to the plan's writer, its error a [`PlanError`].
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        writeln!($out, $($arg)*).map_err($crate::plan::error::PlanError::from)
    };
}
pub(super) use say;

/// `--devices N` against population `size`'s first step of `decisions`: a device beyond the
/// last decision would have nothing to do, and the estimate would read as a step of no time.
pub(super) fn check_devices(
    devices: usize,
    size: usize,
    decisions: usize,
) -> Result<(), PlanError> {
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
pub(super) struct Models {
    pub(super) name: String,
    pub(super) sized: Figures,
    pub(super) others: Vec<(String, crate::model::ModelConfig, Figure, Figure)>,
    pub(super) shares: Vec<u64>,
    pub(super) placement: Placement,
}

/// A plan being written: what every population size's part reads.
pub(super) struct Draft<'a> {
    pub(super) options: &'a PlanOptions,
    pub(super) profile: Option<DeviceProfile>,
    pub(super) loaded: &'a dyn Loaded,
    pub(super) models: Models,
    pub(super) llm: Llm,
    pub(super) experts: Option<ExpertWeights>,
    /// Sample decisions to make: none without the weights.
    pub(super) sample: usize,
    pub(super) max_tokens: usize,
}

impl<'a> Draft<'a> {
    pub(super) fn new(
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
    pub(super) fn header(&self, out: &mut dyn Write) -> Result<(), PlanError> {
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
            crate::host::human_bytes(footprint.bytes()),
            footprint.population,
            footprint.cells,
            if footprint.cells == 1 { "" } else { "s" },
            footprint
                .parts
                .iter()
                .take(2)
                .map(|p| format!("{} {}", p.what, crate::host::human_bytes(p.bytes)))
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
