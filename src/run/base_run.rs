//! `[counterfactual] base = "runs/x"`: the finished run that a run changes, checked before the
//! run starts. The run then reads the base's decision store as `--reuse` would, and its report
//! sets each of its arms beside the base's arm, step by step (`analysis::counterfactual`).

use super::error::RunError;
use crate::host::Program;
use crate::record::{self, CounterfactualRecord, Manifest, Status};
use crate::sim::config::{CounterfactualConfig, find_field};
use crate::sim::experiment::Experiment;
use std::path::PathBuf;

/// The base run of `exp`, if it names one, checked: a finished run of the same scenario, with
/// the arm to compare against (the one named, or the base's only arm).
pub(crate) fn base_of(
    exp: &Experiment,
    program: &Program,
) -> Result<Option<CounterfactualRecord>, RunError> {
    let Some(cf) = &exp.config.counterfactual else {
        return Ok(None);
    };
    let source = &exp.source;
    let at = |field: &str| {
        find_field(&source.text, cf.span(), field, "counterfactual.").or(Some(cf.span()))
    };
    let given = &cf.get_ref().base;
    let shown = given.display();
    let folder = "give the folder of a finished run (relative to the folder throng runs in), \
                  e.g. base = \"runs/market-1712345678\"";
    if given.as_os_str().is_empty() {
        return Err(source
            .error(
                at("base"),
                format!("field `counterfactual.base` is empty: {folder}"),
            )
            .into());
    }
    let base: PathBuf = std::path::absolute(given).map_err(|e| {
        source.error(
            at("base"),
            format!("field `counterfactual.base`: {shown}: {e}; {folder}"),
        )
    })?;
    let manifest: Manifest = match record::read_json(&base.join(record::MANIFEST)) {
        Ok(m) => m,
        Err(e) => {
            return Err(source
                .error(
                    at("base"),
                    format!(
                        "field `counterfactual.base`: {shown} is not a run folder throng can read \
                         ({e}): give the folder of a finished run (relative to the folder throng \
                         runs in)"
                    ),
                )
                .into());
        }
    };
    if manifest.status != Status::Finished {
        return Err(source
            .error(
                at("base"),
                format!(
                    "field `counterfactual.base`: {shown} has not finished (it is {} after {} \
                     steps): finish it first with `{}`",
                    manifest.status,
                    manifest.steps_done,
                    program.resume_command(given)
                ),
            )
            .into());
    }
    if manifest.scenario != exp.scenario {
        return Err(source
            .error(
                at("base"),
                format!(
                    "field `counterfactual.base`: {shown} is a run of the {} scenario, and this \
                     config runs {}: a counterfactual changes knobs of the same scenario",
                    manifest.scenario, exp.scenario
                ),
            )
            .into());
    }
    let arm = arm_of(exp, cf, &manifest, &shown.to_string())?;
    // Cells are set beside the base's of the same population size, replicate and step: with
    // no size in common, nothing could be (and a report said "does not diverge in the 0 steps
    // both ran").
    let sizes = &exp.config.agents.0;
    if !sizes.iter().any(|n| manifest.populations.contains(n)) {
        return Err(source
            .error(
                at("base"),
                format!(
                    "field `counterfactual.base`: {shown} ran populations of {} agents and this \
                     config runs {}: no size in common, so no cell of this run could be set \
                     beside one of the base; run a size the base ran (agents = {})",
                    numbers(&manifest.populations),
                    numbers(sizes),
                    manifest.populations.first().copied().unwrap_or_default()
                ),
            )
            .into());
    }
    warn_of_differences(&manifest, exp, &shown.to_string());
    Ok(Some(CounterfactualRecord {
        base: base.display().to_string(),
        arm,
    }))
}

/// The base's arm to compare with: the one the config names, or the base's only arm.
fn arm_of(
    exp: &Experiment,
    cf: &toml::Spanned<CounterfactualConfig>,
    manifest: &Manifest,
    shown: &str,
) -> Result<String, RunError> {
    let source = &exp.source;
    let at = |field: &str| {
        find_field(&source.text, cf.span(), field, "counterfactual.").or(Some(cf.span()))
    };
    let arm = match &cf.get_ref().arm {
        Some(arm) if manifest.arms.contains(arm) => arm.clone(),
        Some(arm) => {
            return Err(source
                .error(
                    at("arm"),
                    format!(
                        "field `counterfactual.arm`: {shown} has no arm `{arm}`; its arms are {}",
                        listed(&manifest.arms)
                    ),
                )
                .into());
        }
        None => match manifest.arms.as_slice() {
            [only] => only.clone(),
            arms => {
                return Err(source
                    .error(
                        at("base"),
                        format!(
                            "field `counterfactual.base`: {shown} has {} arms ({}): name the one \
                             to compare with, e.g. arm = \"{}\"",
                            arms.len(),
                            listed(arms),
                            arms.first().map_or("", String::as_str)
                        ),
                    )
                    .into());
            }
        },
    };
    Ok(arm)
}

/// Warns of what of the run will not be set beside its base `shown` (its `base` manifest):
/// cells, replicates or steps it lacks, and another seed.
fn warn_of_differences(base: &Manifest, exp: &Experiment, shown: &str) {
    for line in uncompared(base, exp) {
        eprintln!("throng: warning: [counterfactual] base {shown}: {line}");
    }
    if base.seed != exp.config.seed {
        eprintln!(
            "throng: warning: [counterfactual] base {shown} ran with seed {}, and this run with \
             seed {}: no decision of it can be reused, and each replicate is compared with one of \
             other draws. Give this config seed = {} to change only the knobs",
            base.seed, exp.config.seed, base.seed
        );
    }
}

/// What of the run `exp` configures has no counterpart in its base (`base`'s manifest), and
/// so will not be set beside it: said before the run starts, as the report says it after.
fn uncompared(base: &Manifest, exp: &Experiment) -> Vec<String> {
    let c = &exp.config;
    let mut out = Vec::new();
    let extra: Vec<usize> = c
        .agents
        .0
        .iter()
        .copied()
        .filter(|n| !base.populations.contains(n))
        .collect();
    if !extra.is_empty() {
        out.push(format!(
            "it ran no population of {} agents, so those cells of this run are not compared",
            numbers(&extra)
        ));
    }
    if c.replicates.0 > base.replicates {
        out.push(format!(
            "it ran {} replicates and this run {}: only the first {} are compared",
            base.replicates, c.replicates.0, base.replicates
        ));
    }
    if c.steps.0 > base.steps {
        out.push(format!(
            "it ran {} steps and this run {}: steps {} to {} are not compared",
            base.steps,
            c.steps.0,
            base.steps + 1,
            c.steps.0
        ));
    }
    out
}

fn numbers(values: &[usize]) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn listed(arms: &[String]) -> String {
    arms.iter()
        .map(|a| format!("`{a}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
