//! The end of a run: how it ended recorded in its manifest (paused, or finished with its
//! engines' totals), what it reused, and its report.

use super::error::{Context, RunError};
use super::job::{Job, Opened};
use super::steps::Ran;
use super::{Outcome, stores};
use crate::record::{self, Manifest, Status};
use crate::reuse::Reuse;
use crate::sim::policy::Llm;
use crate::sim::runner::Ended;
use std::sync::atomic::Ordering;

/// Records how the run ended; a finished run's report is written unless it was not asked.
pub fn finish(
    job: &Job,
    opened: &mut Opened,
    llm: Option<&Llm>,
    reuse: &Reuse,
    ran: Ran,
) -> Result<Outcome, RunError> {
    let root = job.ranks.is_root();
    let dir = opened.dir.clone();
    let mut outcome = Outcome {
        dir: dir.clone(),
        ended: ran.ended,
        steps_done: ran.steps_done,
        // Without `stop_after`, only a signal (to this rank or another) pauses a run.
        by_signal: ran.stop.load(Ordering::SeqCst) || job.options.stop_after.is_none(),
        ranks: job.ranks.size(),
        root,
        report: None,
        program: job.options.program.clone(),
    };
    if !root {
        return Ok(outcome);
    }
    let manifest = &mut opened.manifest;
    record_reuse(reuse, &dir, manifest);
    if ran.ended == Ended::Paused {
        manifest.status = Status::Paused;
        record::write_json_atomic(&dir.join(record::MANIFEST), &*manifest)?;
        return Ok(outcome);
    }
    manifest.status = Status::Finished;
    manifest.finished_unix = Some(record::now_unix());
    manifest.peak_rss_bytes = record::peak_rss_bytes();
    if let Some(llm) = llm {
        record_engines(llm, manifest, ran.began);
    }
    record::write_json_atomic(&dir.join(record::MANIFEST), &*manifest)?;
    // An extension that finished, in this process or in a resume of it, holds every record
    // and decision of the run as it was.
    super::extend::finished(&dir, manifest);
    if job.options.report {
        let text = job.registry.report(&dir).context("writing the report")?;
        outcome.report = Some(text);
    }
    Ok(outcome)
}

/// What the run took from earlier runs, in its manifest, with the store's warnings.
fn record_reuse(reuse: &Reuse, dir: &std::path::Path, manifest: &mut Manifest) {
    for warning in reuse.warnings() {
        eprintln!("throng: warning: --reuse {warning}");
    }
    // A run that read no earlier run has nothing to say of reuse.
    manifest.reuse = reuse
        .source_dirs()
        .next()
        .is_some()
        .then(|| stores::record(reuse, dir));
    if let Some(r) = &manifest.reuse {
        eprintln!(
            "throng: reused {} of {} decisions from {} (about {:.1} s of model time saved)",
            r.reused,
            manifest.counters.decisions,
            r.sources.join(", "),
            r.saved_seconds
        );
    }
}

/// Each engine's summary on standard error, and over every model's engine the prefix cache's
/// hits over queries and the preemptions, in the manifest.
fn record_engines(llm: &Llm, manifest: &mut Manifest, began: std::time::Instant) {
    let (mut hit, mut queried, mut preemptions) = (0u64, 0u64, 0u64);
    for (name, engine) in llm.engines() {
        let t = engine.totals();
        hit += t.cache.hit_tokens;
        queried += t.cache.queried_tokens;
        preemptions += t.preemptions;
        if let Some(name) = name {
            eprintln!("throng: model {name}:");
        }
        eprintln!("{}", crate::engine::summary(engine, began.elapsed()));
    }
    manifest.prefix_hit_rate = Some(hit as f64 / queried.max(1) as f64);
    manifest.preemptions = Some(preemptions);
}
