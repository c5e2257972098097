//! What a resumed run takes from its manifest rather than the command line, and the checks
//! that it computes the bits it started with: the same weight format, kind of device, KV
//! format and tokenizer, and the same model (the sha256 of its files, the class of device).
//! A run that differs in any of them would go on with decisions its uninterrupted self would
//! not have made, and nothing in its records would say so.

use super::error::{RunError, refuse};
use super::options::GivenSettings;
use super::settings::ModelSettings;
use crate::engine::Engine;
use crate::model::{KvFormat, ModelIdentity, WeightFormat, loader::ModelSource};
use crate::record::{self, EngineRecord, LoadedModelRecord, Manifest};
use std::path::Path;

/// What a resumed run takes from its manifest rather than the command line.
pub(crate) struct StartedWith {
    pub weights: Option<WeightFormat>,
    pub device: Option<String>,
    /// The KV format and tokenizer asked for, and each model as loaded; `None` for a run
    /// started by a throng that did not record them.
    pub engine: Option<EngineRecord>,
}

impl StartedWith {
    pub fn read(dir: &Path) -> Result<Self, RunError> {
        let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
        let weights = match manifest.weight_format.as_deref() {
            Some(name) => Some(WeightFormat::from_name(name).ok_or_else(|| {
                RunError::Refused(format!(
                    "{}: unknown weight format `{name}` (this throng knows {})",
                    dir.join(record::MANIFEST).display(),
                    WeightFormat::ALL.map(WeightFormat::name).join(", ")
                ))
            })?),
            None => None,
        };
        Ok(Self {
            weights,
            device: manifest.device,
            engine: manifest.engine,
        })
    }

    /// `model` as the run started with it: the KV format and tokenizer of its manifest. A
    /// flag given for either is refused when the manifest records it (a resume computes what
    /// the run started with), and used with a warning when the run predates the record.
    pub(crate) fn apply(
        &self,
        model: &mut ModelSettings,
        given: GivenSettings,
        dir: &Path,
    ) -> Result<(), RunError> {
        let Some(engine) = &self.engine else {
            eprintln!(
                "throng: warning: {} does not record the KV format and tokenizer it started with \
                 (it predates the record): resuming with --kv-format {}{}, which must be the \
                 run's for its resumed steps to be its own",
                dir.display(),
                model.engine.kv_format.name(),
                model
                    .engine
                    .tokenizer
                    .as_ref()
                    .map(|t| format!(" and --tokenizer {}", t.display()))
                    .unwrap_or_default()
            );
            return Ok(());
        };
        let manifest = dir.join(record::MANIFEST);
        let kv_format = KvFormat::from_name(&engine.kv_format).ok_or_else(|| {
            RunError::Refused(format!(
                "{}: unknown KV format `{}` (this throng knows {})",
                manifest.display(),
                engine.kv_format,
                KvFormat::ALL.map(KvFormat::name).join(", ")
            ))
        })?;
        let refused = |flag: &str, started: &str| {
            RunError::Refused(format!(
                "--resume continues a run with the {flag} it started with ({started}, in {}): \
                 drop --{flag}; another computes other bits, so the resumed steps would not be \
                 the run's. To use another, start a new run",
                manifest.display()
            ))
        };
        if given.kv_format && model.engine.kv_format != kv_format {
            return Err(refused("kv-format", &engine.kv_format));
        }
        let tokenizer = engine.tokenizer.as_deref().map(std::path::PathBuf::from);
        let asked = match &model.engine.tokenizer {
            Some(path) => Some(std::path::absolute(path)?),
            None => None,
        };
        if given.tokenizer && asked != tokenizer {
            let started = engine.tokenizer.as_deref().unwrap_or("the model's own");
            return Err(refused("tokenizer", started));
        }
        model.engine.kv_format = kv_format;
        model.engine.tokenizer = tokenizer;
        Ok(())
    }

    /// Refuses to go on when a model loaded for the resume is not the one the run started
    /// with: other weights (replaced in place, or a relative path found from another
    /// folder), or another class of device.
    pub(crate) fn check_models(
        &self,
        dir: &Path,
        engines: &[(String, &Engine)],
    ) -> Result<(), RunError> {
        let Some(started) = &self.engine else {
            return Ok(());
        };
        for (name, engine) in engines {
            // Under `--split models` the first process records only its own models.
            let Some(was) = started.models.get(name) else {
                continue;
            };
            let now = loaded_record(name, engine.identity());
            let differs = if was.weights != now.weights {
                format!(
                    "its files' sha256 was {} and is now {}: the weights, config, tokenizer or \
                     chat template were replaced since, or the name finds other files from here",
                    short(&was.weights),
                    short(&now.weights)
                )
            } else if was.device != now.device {
                format!(
                    "it was computed on a device of class {} and would now be on {}, whose \
                     kernels compute other bits: resume on a machine of the class it started on",
                    was.device, now.device
                )
            } else if was.format != now.format || was.kv != now.kv {
                format!(
                    "it was computed as {} with a {} KV cache and would now be {} with {}",
                    was.format, was.kv, now.format, now.kv
                )
            } else {
                continue;
            };
            refuse!(
                "cannot resume {}: model `{name}` is not the one the run started with: {differs}. \
                 It started with {}, and this resume loads {}. Put the model it started with \
                 back (or resume from the folder the run was started in, if the model's path is \
                 relative), or start a new run",
                dir.display(),
                was.from,
                now.from
            );
        }
        Ok(())
    }
}

fn short(digest: &str) -> &str {
    digest.get(..16).unwrap_or(digest)
}

/// Where model `name` is read from, for the record: the absolute path of a folder or file, or
/// the preset's asset or Hub repository.
fn loaded_from(name: &str) -> String {
    match ModelSource::resolve(name) {
        Ok(ModelSource::HfDir(path) | ModelSource::Gguf(path)) => std::path::absolute(&path)
            .unwrap_or(path)
            .display()
            .to_string(),
        Ok(ModelSource::Hub { repo, revision }) => format!("{repo}@{revision} (Hugging Face)"),
        Ok(ModelSource::Asset { asset, file }) => format!("{file} of the asset {asset}"),
        Err(_) => name.to_string(),
    }
}

fn loaded_record(name: &str, identity: &ModelIdentity) -> LoadedModelRecord {
    LoadedModelRecord {
        from: loaded_from(name),
        weights: identity.weights.clone(),
        format: identity.format.clone(),
        device: identity.device.clone(),
        kv: identity.kv.clone(),
    }
}

/// The record of the engine settings `model` asked for and of `engines` as loaded (each
/// model's name and engine).
pub(crate) fn engine_record(
    model: &ModelSettings,
    engines: &[(String, &Engine)],
) -> Result<EngineRecord, RunError> {
    let tokenizer = match &model.engine.tokenizer {
        Some(path) => Some(std::path::absolute(path)?.display().to_string()),
        None => None,
    };
    Ok(EngineRecord {
        kv_format: model.engine.kv_format.name().to_string(),
        tokenizer,
        models: engines
            .iter()
            .map(|(name, e)| (name.clone(), loaded_record(name, e.identity())))
            .collect(),
    })
}

/// `--resume` runs exactly what the run started with: flags that would change its bits are
/// refused, as the config overrides are. `--device` is checked once the manifest is read (a
/// device of the same kind computes the same bits), `--kv-format` and `--tokenizer` by
/// [`StartedWith::apply`]; `--threads` changes no bits (see docs/src/experiments.md, "Seeds")
/// and is allowed.
pub(crate) fn refuse_flags(given: GivenSettings) -> Result<(), RunError> {
    if given.weights {
        refuse!(
            "--resume continues a run with the weight format it started with (its manifest's \
             `weight_format`): drop --weights; another format computes other bits, so the \
             resumed steps would not be the run's. To use another format, start a new run"
        );
    }
    Ok(())
}
