//! `throng run --reuse RUN_DIR`: the earlier runs whose decisions a run takes instead of
//! asking the model, checked before the run starts, and the run's own store (which its
//! recorder fills).

use crate::engine::Engine;
use crate::model::ModelIdentity;
use crate::record::store::{Source, Store};
use crate::record::{self, ReuseRecord};
use crate::sim::policy::Reuse;
use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

/// Each model's name and identity.
fn identities<'a>(engines: &'a [(String, &Engine)]) -> Vec<(&'a str, &'a ModelIdentity)> {
    engines
        .iter()
        .map(|(name, e)| (name.as_str(), e.identity()))
        .collect()
}

/// Opens the stores of `dirs` for a run whose engines are `engines` (each model's name and
/// engine). A store that is missing or damaged is left out with a warning; one whose replies
/// another weight format or class of device computed is refused, since none of them would be
/// this run's.
pub fn open(dirs: &[PathBuf], engines: &[(String, &Engine)]) -> Result<Reuse> {
    let ours = identities(engines);
    let mut sources = Vec::new();
    for from in dirs {
        let source = match Source::open(from) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "throng: warning: --reuse {}: {e}; none of its decisions are reused",
                    from.display()
                );
                continue;
            }
        };
        let theirs: Vec<(String, ModelIdentity)> = source
            .models
            .iter()
            .filter_map(|(name, json)| Some((name.clone(), serde_json::from_str(json).ok()?)))
            .collect();
        let mut shared = false;
        for (name, identity) in &theirs {
            for (mine, own) in &ours {
                if identity.weights != own.weights {
                    continue;
                }
                if identity.format != own.format || identity.device != own.device {
                    bail!(
                        "--reuse {}: its decisions by {name} were computed as {} on {}, and this \
                         run's by {mine} would be computed as {} on {}, which gives other bits: \
                         none of them would be this run's decisions. Run with the weight format \
                         and kind of device it used (--weights, --device), or drop --reuse {}",
                        from.display(),
                        identity.format,
                        identity.device,
                        own.format,
                        own.device,
                        from.display()
                    );
                }
                shared = true;
            }
        }
        if !shared {
            eprintln!(
                "throng: warning: --reuse {}: its decisions were made by other weights ({}) than \
                 this run's ({}); none of them can be reused",
                from.display(),
                theirs
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                ours.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            );
        }
        sources.push(source);
    }
    Ok(Reuse::new(sources)?)
}

/// The decision store of the run in `dir` (created, or a resumed run's own), marked with the
/// identities of the models of `engines`, so that later runs know whose replies it holds.
pub fn store(dir: &Path, engines: &[(String, &Engine)]) -> Result<Store> {
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
