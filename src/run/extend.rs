//! `throng run --resume DIR --steps N` (or `--replicates R`): a finished run extended to more
//! steps or replicates, with the records of a run made with those numbers from the start.
//!
//! The run is made again in its own folder, with the numbers changed, taking every decision
//! the finished run recorded from its decision store (`--reuse`): the steps and replicates it
//! had cost the model nothing, and only the new ones ask it. The finished run waits beside
//! the folder (`DIR.before-extension`) until the extended one finishes; an extension that
//! stops before then is resumed as any run is (`--resume DIR`), reading it still.

use super::error::{RunError, refuse};
use super::options::{GivenSettings, RunOptions};
use super::settings::EngineSettings;
use crate::record::{self, Manifest, Status};
use std::path::{Path, PathBuf};

/// Where a run waits while it is extended.
pub(crate) fn previous_of(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".before-extension");
    dir.with_file_name(name)
}

/// Whether `args` extend a finished run rather than resume one.
pub fn asked(args: &RunOptions) -> bool {
    args.resume.is_some() && (args.steps.is_some() || args.replicates.is_some())
}

/// An extension, checked and planned: the finished run in `dir` is made again into `dir`
/// with the numbers of `args`, reading its decisions from where it waits (`previous`).
pub struct Extension {
    dir: PathBuf,
    previous: PathBuf,
    config_file: String,
}

/// Checks that `args` (`--resume DIR` with `--steps` or `--replicates`) extend a finished run,
/// and turns them into a new run of its config into `DIR`, with its numbers changed, reusing
/// its decisions and computing on its weight format, kind of device, KV format and tokenizer.
/// Nothing is moved yet: the new run's own checks come first (see [`Extension::move_aside`]).
pub(crate) fn plan(
    args: &mut RunOptions,
    engine: &mut EngineSettings,
    given: GivenSettings,
    ranks: usize,
) -> Result<Extension, RunError> {
    let dir = args.resume.clone().expect("invariant: `asked` holds");
    let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
    check(args, given, ranks, &dir, &manifest)?;
    let previous = previous_of(&dir);
    if previous.exists() {
        refuse!(
            "{} is there from an extension of {} that did not clean up: it is the run as it \
             was before; remove it if {} holds what you need, or move it back in its place",
            previous.display(),
            dir.display(),
            dir.display()
        );
    }
    // Its own decisions, when it asked a model (a scripted run has none to reuse).
    let mut sources: Vec<PathBuf> = [dir.clone()]
        .into_iter()
        .filter(|d| d.join(record::store::STORE).exists())
        .collect();
    if let Some(r) = &manifest.reuse {
        sources.extend(r.sources.iter().map(PathBuf::from));
    }
    if !given.weights
        && let Some(format) = manifest.weight_format.as_deref()
        && let Some(weights) = crate::model::WeightFormat::from_name(format)
    {
        engine.weights = weights;
    }
    if !given.device
        && let Some(device) = &manifest.device
    {
        engine.device = device.clone();
    }
    // The KV format and tokenizer it ran with, or its decisions would not be reused.
    if let Some(record) = &manifest.engine {
        if !given.kv_format
            && let Some(kv) = crate::model::KvFormat::from_name(&record.kv_format)
        {
            engine.kv_format = kv;
        }
        if !given.tokenizer {
            engine.tokenizer = record.tokenizer.as_ref().map(PathBuf::from);
        }
    }
    // Read from where the run is until it is moved.
    args.config = Some(dir.join(record::CONFIG));
    args.out = Some(dir.clone());
    args.resume = None;
    args.reuse = sources;
    Ok(Extension {
        dir,
        previous,
        config_file: manifest.config_file,
    })
}

/// Refuses what cannot extend the finished run in `dir` (its `manifest`): several ranks,
/// options that change what the run was, a run not finished, fewer steps or replicates, or
/// the same numbers.
fn check(
    args: &RunOptions,
    given: GivenSettings,
    ranks: usize,
    dir: &Path,
    manifest: &Manifest,
) -> Result<(), RunError> {
    if ranks > 1 {
        refuse!(
            "extending a run (--resume with --steps or --replicates) runs in one process: extend \
             {} without mpirun or srun",
            dir.display()
        );
    }
    if args.policy.is_some() || args.agents.is_some() || given.model {
        refuse!(
            "extending {} adds steps or replicates to the run as it was configured: drop \
             --policy/--agents/--model",
            dir.display()
        );
    }
    if !args.reuse.is_empty() {
        refuse!(
            "extending {} reads the decision stores the run was made with (its own, and its \
             manifest's `reuse`): drop --reuse",
            dir.display()
        );
    }
    if manifest.status != Status::Finished {
        refuse!(
            "--steps and --replicates with --resume extend a finished run, and {} is {}: finish \
             it first ({}), then extend it",
            dir.display(),
            manifest.status,
            args.program.resume_command(dir)
        );
    }
    let steps = args.steps.unwrap_or(manifest.steps as i64);
    let replicates = args.replicates.unwrap_or(manifest.replicates as i64);
    if steps < manifest.steps as i64 || replicates < manifest.replicates as i64 {
        refuse!(
            "{} has {} steps and {} replicates; extending adds to them (--steps {steps}, \
             --replicates {replicates} would take some away: make a new run for fewer)",
            dir.display(),
            manifest.steps,
            manifest.replicates
        );
    }
    if steps == manifest.steps as i64 && replicates == manifest.replicates as i64 {
        refuse!(
            "{} already has {steps} steps and {replicates} replicates: nothing to extend",
            dir.display()
        );
    }
    Ok(())
}

impl Extension {
    /// Moves the finished run aside, once the extended run's checks have passed, and points
    /// `args` at it. The run is moved back if the extension fails before its first step.
    pub(crate) fn move_aside(self, args: &mut RunOptions) -> Result<MovedAside, RunError> {
        if let Err(e) = std::fs::rename(&self.dir, &self.previous) {
            refuse!("cannot move {} aside to extend it: {e}", self.dir.display());
        }
        eprintln!(
            "throng: extending {} to {} steps and {} replicates, reusing its decisions (the run \
             as it was waits in {} until the extension finishes)",
            self.dir.display(),
            args.steps.map_or("its".into(), |s| s.to_string()),
            args.replicates.map_or("its".into(), |r| r.to_string()),
            self.previous.display()
        );
        args.config = Some(self.previous.join(record::CONFIG));
        for source in &mut args.reuse {
            if *source == self.dir {
                *source = self.previous.clone();
            }
        }
        Ok(MovedAside {
            plan: self,
            started: false,
        })
    }
}

/// A finished run moved aside while its extension starts: moved back into its place if the
/// extension fails before its first step, so that nothing is left to undo by hand.
pub(crate) struct MovedAside {
    plan: Extension,
    started: bool,
}

impl MovedAside {
    /// The config file the run was first made from.
    pub(crate) fn config_file(&self) -> &str {
        &self.plan.config_file
    }

    /// Where the run as it was waits.
    pub fn previous(&self) -> &Path {
        &self.plan.previous
    }

    /// The extension's first step starts: from now on it reads the run where it waits, and
    /// a stopped extension is resumed, not undone.
    pub fn started(&mut self) {
        self.started = true;
    }
}

impl Drop for MovedAside {
    fn drop(&mut self) {
        if self.started {
            return;
        }
        let Extension { dir, previous, .. } = &self.plan;
        // The extension's start left nothing in `dir` (its folder was given up), or never
        // made it.
        let _ = std::fs::remove_dir(dir);
        match std::fs::rename(previous, dir) {
            Ok(()) => eprintln!(
                "throng: the extension did not start; {} is back as it was",
                dir.display()
            ),
            Err(e) => eprintln!(
                "throng: the extension did not start, and {} could not be moved back ({e}): \
                 move it back by hand (mv {} {})",
                previous.display(),
                previous.display(),
                dir.display()
            ),
        }
    }
}

/// After the run in `dir` finished: the run as it was before an extension (the manifest's
/// `extends`), which the extended run read its decisions from, is removed, since the
/// extended run holds all of it.
pub fn finished(dir: &Path, manifest: &Manifest) {
    let Some(previous) = manifest.extends.as_ref().map(PathBuf::from) else {
        return;
    };
    if !previous.is_dir() {
        return;
    }
    match std::fs::remove_dir_all(&previous) {
        Ok(()) => eprintln!(
            "throng: the extension finished; the run as it was before it ({}) is removed, since \
             {} holds all of it",
            previous.display(),
            dir.display()
        ),
        Err(e) => eprintln!(
            "throng: warning: the run as it was before its extension is still in {} ({e}); the \
             extended run does not need it",
            previous.display()
        ),
    }
}
