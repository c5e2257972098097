//! `throng run --resume DIR --steps N` (or `--replicates R`): a finished run extended to more
//! steps or replicates, with the records of a run made with those numbers from the start.
//!
//! The run is made again in its own folder, with the numbers changed, taking every decision
//! the finished run recorded from its decision store (`--reuse`): the steps and replicates it
//! had cost the model nothing, and only the new ones ask it. The finished run waits beside
//! the folder (`DIR.before-extension`) until the extended one finishes; an extension that
//! stops before then is resumed as any run is (`--resume DIR`), reading it still.

use super::run::RunArgs;
use crate::record::{self, Manifest, Status};
use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

/// Where a run waits while it is extended.
pub fn previous_of(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".before-extension");
    dir.with_file_name(name)
}

/// Whether `args` extend a finished run rather than resume one.
pub fn asked(args: &RunArgs) -> bool {
    args.resume.is_some() && (args.steps.is_some() || args.replicates.is_some())
}

/// Turns `args` (`--resume DIR` with `--steps` or `--replicates`) into a new run of the
/// finished run's config into `DIR`, with its numbers changed, reusing its decisions and
/// computing on its weight format and kind of device; the finished run is moved aside first.
/// Returns where it went, and the config file it was made from.
pub fn prepare(args: &mut RunArgs, ranks: usize) -> Result<(PathBuf, String)> {
    let dir = args.resume.clone().expect("invariant: `asked` holds");
    let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
    if ranks > 1 {
        bail!(
            "extending a run (--resume with --steps or --replicates) runs in one process: extend \
             {} without mpirun or srun",
            dir.display()
        );
    }
    if args.policy.is_some() || args.agents.is_some() || super::given("model") {
        bail!(
            "extending {} adds steps or replicates to the run as it was configured: drop \
             --policy/--agents/--model",
            dir.display()
        );
    }
    if manifest.status != Status::Finished {
        bail!(
            "--steps and --replicates with --resume extend a finished run, and {} is {}: finish \
             it first (throng run --resume {}), then extend it",
            dir.display(),
            manifest.status,
            dir.display()
        );
    }
    let steps = args.steps.unwrap_or(manifest.steps as i64);
    let replicates = args.replicates.unwrap_or(manifest.replicates as i64);
    if steps < manifest.steps as i64 || replicates < manifest.replicates as i64 {
        bail!(
            "{} has {} steps and {} replicates; extending adds to them (--steps {steps}, \
             --replicates {replicates} would take some away: make a new run for fewer)",
            dir.display(),
            manifest.steps,
            manifest.replicates
        );
    }
    if steps == manifest.steps as i64 && replicates == manifest.replicates as i64 {
        bail!(
            "{} already has {steps} steps and {replicates} replicates: nothing to extend",
            dir.display()
        );
    }
    let previous = previous_of(&dir);
    if previous.exists() {
        bail!(
            "{} is there from an extension of {} that did not clean up: it is the run as it \
             was before; remove it if {} holds what you need, or move it back in its place",
            previous.display(),
            dir.display(),
            dir.display()
        );
    }
    std::fs::rename(&dir, &previous)
        .map_err(|e| anyhow::anyhow!("cannot move {} aside to extend it: {e}", dir.display()))?;
    eprintln!(
        "throng: extending {} to {steps} steps and {replicates} replicates, reusing its \
         decisions (the run as it was waits in {} until the extension finishes)",
        dir.display(),
        previous.display()
    );
    let mut sources = vec![previous.clone()];
    if let Some(r) = &manifest.reuse {
        sources.extend(r.sources.iter().map(PathBuf::from));
    }
    if !super::given("weights")
        && let Some(format) = manifest.weight_format.as_deref()
        && let Some(weights) = crate::model::WeightFormat::from_name(format)
    {
        args.model.weights = weights;
    }
    if !super::given("device")
        && let Some(device) = &manifest.device
    {
        args.model.device = device.clone();
    }
    args.config = Some(previous.join(record::CONFIG));
    args.out = Some(dir);
    args.resume = None;
    args.reuse = sources;
    Ok((previous, manifest.config_file))
}
