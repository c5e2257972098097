//! `[counterfactual] base = "runs/x"`: the finished run that a run changes, checked before the
//! run starts. The run then reads the base's decision store as `--reuse` would, and its report
//! sets each of its arms beside the base's arm, step by step (`analysis::counterfactual`).

use crate::record::{self, CounterfactualRecord, Manifest, Status};
use crate::sim::config::find_field;
use crate::sim::experiment::Experiment;
use anyhow::Result;
use std::path::PathBuf;

/// The base run of `exp`, if it names one, checked: a finished run of the same scenario, with
/// the arm to compare against (the one named, or the base's only arm).
pub fn base_of(exp: &Experiment) -> Result<Option<CounterfactualRecord>> {
    let Some(cf) = &exp.config.counterfactual else {
        return Ok(None);
    };
    let source = &exp.source;
    let at = |field: &str| {
        find_field(&source.text, cf.span(), field, "counterfactual.").or(Some(cf.span()))
    };
    let given = &cf.get_ref().base;
    let base: PathBuf = std::path::absolute(given)?;
    let shown = given.display();
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
                    crate::host::resume_command(given)
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
    if manifest.seed != exp.config.seed {
        eprintln!(
            "throng: warning: [counterfactual] base {shown} ran with seed {}, and this run with \
             seed {}: no decision of it can be reused, and each replicate is compared with one of \
             other draws. Give this config seed = {} to change only the knobs",
            manifest.seed, exp.config.seed, manifest.seed
        );
    }
    Ok(Some(CounterfactualRecord {
        base: base.display().to_string(),
        arm,
    }))
}

fn listed(arms: &[String]) -> String {
    arms.iter()
        .map(|a| format!("`{a}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
