//! The steps of a run: its folder kept from here on, signals watched, progress told, and a
//! run that stops on an error marked failed with what to do next.

use super::error::RunError;
use super::job::{Job, Opened};
use super::observe::Observer;
use super::signals;
use crate::host::Program;
use crate::record::{self, Manifest, Status, store::Store};
use crate::sim::policy::Llm;
use crate::sim::runner::{self, Ended, Progress};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// How the steps ended.
pub struct Ran {
    pub ended: Ended,
    /// The steps this process ran.
    pub steps_done: u64,
    /// Set when a stop was asked (a signal, or the observer).
    pub stop: Arc<AtomicBool>,
    /// When the steps began.
    pub began: Instant,
}

/// Runs the steps. An error stops the run: rank 0 marks it failed in its manifest, and the
/// error says how to go on (fix a template and start again, or resume). A panic marks it
/// failed (or paused) and goes on (see [`signals::halted`]).
pub(crate) fn run_steps(
    job: &Job,
    opened: &mut Opened,
    mut llm: Option<&mut Llm>,
    store: Option<Store>,
    observer: &mut dyn Observer,
) -> Result<Ran, RunError> {
    let root = job.ranks.is_root();
    let dir = opened.dir.clone();
    let exp = opened.loaded.experiment();
    observer.started(planned(exp), root);
    if root {
        eprintln!(
            "throng: running {} into {}{}",
            exp.config.name,
            dir.display(),
            match job.ranks.size() {
                1 => String::new(),
                n => format!(" on {n} ranks"),
            }
        );
    }
    let stop = match job.options.catch_signals {
        true => signals::stop_on_signal(
            job.ranks.rank(),
            &dir,
            job.options.stop_timeout,
            job.options.program.clone(),
        ),
        false => Arc::new(AtomicBool::new(false)),
    };
    // From here the run writes records: its folder is kept whatever happens.
    let starting = std::mem::replace(&mut opened.starting, super::folder::Starting(None));
    opened.kept = starting.started().or(opened.resumed_folder.take());
    if let Some(extension) = &mut opened.extension {
        extension.started();
    }
    let options = runner::SimOptions {
        resume: opened.resume,
        stop_after: job.options.stop_after,
        stop: Some(stop.clone()),
        ranks: job.ranks.clone(),
        split: job.options.split,
        store,
        faults: job.options.faults.clone(),
    };
    let began = Instant::now();
    let mut steps_done = 0u64;
    // A panic out of the scenario's code (a Python class's exception, see `Halt`) marks the
    // run failed, then goes on to the caller.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let manifest = &mut opened.manifest;
        opened
            .loaded
            .run(llm.as_deref_mut(), &dir, manifest, &options, &mut |p| {
                if !stop.load(Ordering::SeqCst) && observer.stop_requested() {
                    stop.store(true, Ordering::SeqCst);
                    observer.stopping();
                }
                if let Progress::Step { .. } = p {
                    steps_done += 1;
                }
                observer.progress(&p);
            })
    }));
    let ended = match ran {
        Ok(ended) => ended,
        Err(payload) => {
            observer.ended(false);
            signals::halted(root, &dir, payload)
        }
    };
    match ended {
        Ok(ended) => {
            observer.ended(true);
            Ok(Ran {
                ended,
                steps_done,
                stop,
                began,
            })
        }
        Err(e) if !root => Err(e.into()),
        Err(e) => {
            observer.ended(false);
            Err(failed(&dir, &mut opened.manifest, e, &job.options.program))
        }
    }
}

/// The decisions the run plans: agents times cells times steps, over its population sizes.
fn planned(exp: &crate::sim::experiment::Experiment) -> u64 {
    // Sizes that overflow were refused by the footprint's check; saturating all the same.
    let cells = exp.arms.len().saturating_mul(exp.config.replicates.0);
    exp.config
        .agents
        .0
        .iter()
        .map(|&n| n.saturating_mul(cells).saturating_mul(exp.config.steps.0) as u64)
        .fold(0, u64::saturating_add)
}

/// Marks the run in `dir` failed with `e`, and says how to go on: a template's error is fixed
/// in the template and the run started again (a resume would render it as it is); any other
/// is resumed once its cause is fixed.
fn failed(dir: &Path, manifest: &mut Manifest, e: runner::SimError, program: &Program) -> RunError {
    manifest.status = Status::Failed;
    manifest.error = Some(e.to_string());
    let _ = record::write_json_atomic(&dir.join(record::MANIFEST), &*manifest);
    let advice = match e.template() {
        // --resume would render the same template again: the fix is in the template.
        Some(template) => format!(
            "the run stopped at a prompt template, which --resume would render again as it is: \
             fix {} where it is (the run reads its templates from there) and start a new run: \
             throng run {}; {}",
            template.display(),
            // A template of the run folder's own copies is read through its config.
            match manifest.config_file.as_str() {
                _ if template.starts_with(dir) =>
                    format!("{} --out NEW_FOLDER", dir.join(record::CONFIG).display()),
                "" => dir.join(record::CONFIG).display().to_string(),
                file => file.to_string(),
            },
            match manifest.steps_done {
                0 => format!("{} has no finished step, delete it", dir.display()),
                n => format!(
                    "{} keeps the {n} step{} finished before it, made with the template as it was",
                    dir.display(),
                    if n == 1 { "" } else { "s" }
                ),
            }
        ),
        None if manifest.steps_done == 0 => format!(
            "the run stopped before it finished a step; once the cause is fixed, {} \
             starts it from the beginning",
            program.resume_command(dir)
        ),
        None => format!(
            "the run stopped; its {} finished step{} kept: {}",
            manifest.steps_done,
            if manifest.steps_done == 1 {
                " is"
            } else {
                "s are"
            },
            program.resume_command(dir)
        ),
    };
    RunError::context(advice, e)
}
