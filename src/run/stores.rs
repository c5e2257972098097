//! `throng run --reuse RUN_DIR`: the earlier runs whose decisions a run takes instead of
//! asking the model, checked before the run starts, and the run's own store (which its
//! recorder fills).

use super::error::{RunError, refuse};
use crate::engine::Engine;
use crate::model::ModelIdentity;
use crate::record::store::Store;
use crate::record::{self, ReuseRecord};
use crate::reuse::Reuse;
use std::path::{Path, PathBuf};

/// Each model's name and identity.
fn identities<'a>(engines: &'a [(String, &Engine)]) -> Vec<(&'a str, &'a ModelIdentity)> {
    engines
        .iter()
        .map(|(name, e)| (name.as_str(), e.identity()))
        .collect()
}

/// Refuses `--reuse` of what cannot be a source of decisions, before anything is written: a
/// path that is not there, a file, a folder that is not a run, a run that asked no model
/// (a damaged store of a run is found when it is opened, and left out with a warning).
pub(crate) fn check_sources(dirs: &[PathBuf]) -> Result<(), RunError> {
    for dir in dirs {
        let why = match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "there is nothing there",
            Err(_) => "it cannot be read",
            Ok(meta) if !meta.is_dir() => "it is a file, not a run folder",
            Ok(_) if !dir.join(record::MANIFEST).is_file() => {
                "it is not a run folder (it has no manifest.json)"
            }
            Ok(_) if !dir.join(record::store::STORE).exists() => {
                "its run has no decision store (it asked no model, or predates stores)"
            }
            Ok(_) => continue,
        };
        refuse!(
            "--reuse {}: {why}. Give the folder of an earlier run that asked the model (its \
             decisions.redb holds the replies), or drop --reuse",
            dir.display()
        );
    }
    Ok(())
}

/// Opens the stores of `dirs` for a run whose engines are `engines` (each model's name and
/// engine), saying what was left out (see [`crate::reuse::open`]).
pub fn open(dirs: &[PathBuf], engines: &[(String, &Engine)]) -> Result<Reuse, RunError> {
    let opened = crate::reuse::open(dirs, &identities(engines)).map_err(|e| match e {
        crate::reuse::ReuseError::Record(e) => RunError::from(e),
        refused => RunError::Refused(refused.to_string()),
    })?;
    for warning in &opened.warnings {
        eprintln!("throng: warning: {warning}");
    }
    Ok(opened.reuse)
}

/// The decision store of the run in `dir` (created, or a resumed run's own), marked with the
/// identities of the models of `engines`, so that later runs know whose replies it holds.
pub fn store(dir: &Path, engines: &[(String, &Engine)]) -> Result<Store, RunError> {
    let store = Store::open(dir)?;
    for (name, identity) in identities(engines) {
        store.set_model(name, &serde_json::to_string(identity)?)?;
    }
    Ok(store)
}

/// The model seconds one decision took in the run in `dir` (its forward passes and token masks
/// over its decisions), for the time reused decisions save.
fn seconds_per_decision(dir: &Path) -> Option<f64> {
    let steps = record::read_steps(dir).ok()?;
    let (model, decisions) = steps.iter().fold((0.0, 0usize), |(m, d), s| {
        (m + s.forward_seconds + s.mask_seconds, d + s.decisions)
    });
    (decisions > 0).then(|| model / decisions as f64)
}

/// What the run in `dir` took through `reuse`, for the manifest: its sources, the decisions
/// reused (counted from the steps it kept, over every rank, since a resumed process reused
/// only those of its own steps), and the model time they took in their runs (at the sources'
/// mean model seconds per decision).
pub fn record(reuse: &Reuse, dir: &Path) -> ReuseRecord {
    let sources: Vec<&Path> = reuse.source_dirs().collect();
    let rates: Vec<f64> = sources
        .iter()
        .filter_map(|d| seconds_per_decision(d))
        .collect();
    let rate = match rates.len() {
        0 => 0.0,
        n => rates.iter().sum::<f64>() / n as f64,
    };
    let reused = record::read_steps(dir)
        .map(|steps| steps.iter().map(|s| s.reused).sum())
        .unwrap_or(reuse.reused);
    ReuseRecord {
        sources: sources.iter().map(|d| d.display().to_string()).collect(),
        reused,
        saved_seconds: reused as f64 * rate,
    }
}
