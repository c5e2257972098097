//! The model phase of a run: the device each rank computes on, its model (or models) loaded
//! with the settings a resumed run started with, and the decisions of earlier runs attached.

use super::error::{RunError, refuse};
use super::job::{Job, Opened};
use super::resume::StartedWith;
use super::settings::{ModelSettings, model_of, models_of};
use super::stores;
use crate::engine::Engine;
use crate::record::{self, Manifest, store::Store};
use crate::reuse::Reuse;
use crate::scenarios::{self, Registry};
use crate::sim::config::Split;
use crate::sim::experiment::Experiment;
use crate::sim::policy::Llm;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The kind of a device spec: `cpu` or `cuda`. Devices of one kind compute the same bits
/// (the same kernels on the same model of GPU); a CPU and a GPU do not.
pub(crate) fn device_kind(spec: &str) -> &str {
    spec.split(':').next().unwrap_or(spec)
}

/// The device this rank takes: its entry of `devices`, else an explicit device, else
/// `cuda:LOCAL_RANK` in a CUDA build, else the CPU. A resumed run (`started_on`: the device
/// its manifest names) stays on its kind of device.
pub(crate) fn device_for(job: &Job, started_on: Option<&str>) -> String {
    let local = job.ranks.topology().local_rank;
    if let Some(devices) = job.options.devices.as_ref().filter(|d| !d.is_empty()) {
        return devices[local % devices.len()].clone();
    }
    let explicit = job.given.device;
    let gpu = match started_on {
        Some(device) => device_kind(device) == "cuda",
        None => candle_core::utils::cuda_is_available(),
    };
    if !explicit && gpu {
        return format!("cuda:{local}");
    }
    if !explicit && let Some(device) = started_on {
        return device.to_string();
    }
    job.engine.device.clone()
}

/// The model (or models) the run asks, loaded, and the settings they were loaded with; none
/// for a run without an LLM policy. Their names, weights and device go in the manifest.
pub fn load(job: &Job, opened: &mut Opened) -> Result<(Option<Llm>, ModelSettings), RunError> {
    let exp = opened.loaded.experiment();
    if !scenarios::needs_model(exp) {
        let model = ModelSettings {
            model: job.options.model.clone().unwrap_or_else(|| model_of(exp)),
            engine: job.engine.clone(),
        };
        return Ok((None, model));
    }
    let (model, names) = settings(job, exp, opened.started.as_ref(), &opened.dir)?;
    let manifest = &mut opened.manifest;
    manifest.device = Some(model.engine.device.clone());
    manifest.weight_format = Some(crate::quality::name(model.engine.weights));
    let llm = match names.len() > 1 {
        true => load_several(job, exp, &model, &names, manifest)?,
        false => load_one(job.registry, exp, &model, manifest)?,
    };
    Ok((Some(llm), model))
}

/// The settings the run's model is loaded with: the device of this rank, and the weight
/// format, KV format and tokenizer a resumed run started with; and the names of the models.
fn settings(
    job: &Job,
    exp: &Experiment,
    started: Option<&StartedWith>,
    dir: &Path,
) -> Result<(ModelSettings, Vec<String>), RunError> {
    let started_on = started.and_then(|s| s.device.as_deref());
    let device = device_for(job, started_on);
    if let Some(was) = started_on
        && device_kind(was) != device_kind(&device)
    {
        refuse!(
            "--resume continues a run on the kind of device it started on ({was}): a {} \
             computes other bits than a {}, so the resumed steps would not be the run's; \
             drop --device/--devices, or start a new run on {device}",
            device_kind(&device),
            device_kind(was)
        );
    }
    let weights = match started.and_then(|s| s.weights) {
        Some(w) => w,
        None if job.options.resume.is_some() => {
            eprintln!(
                "throng: warning: this run's manifest does not say which weight format it \
                 started with (it predates the record); resuming with --weights {}",
                crate::quality::name(job.engine.weights)
            );
            job.engine.weights
        }
        None => job.engine.weights,
    };
    let names = models_of(exp)?;
    let mut model = ModelSettings {
        model: names.first().cloned().unwrap_or_else(|| model_of(exp)),
        engine: super::EngineSettings {
            device,
            weights,
            ..job.engine.clone()
        },
    };
    if let Some(started) = started {
        started.apply(&mut model, job.given, dir)?;
    }
    if let Some(given) = job.options.model.as_ref().filter(|m| !names.contains(m)) {
        eprintln!(
            "throng: warning: --model {given} sets the config's default model ([llm] model), \
             which no agent asks: every arm or policy group of the run names its own ({})",
            names.join(", ")
        );
    }
    Ok((model, names))
}

/// Every model, loaded once; each agent's requests go to its model's engine. Split by
/// models, a rank loads only its own models, and its KV memory is theirs.
fn load_several(
    job: &Job,
    exp: &Experiment,
    model: &ModelSettings,
    names: &[String],
    manifest: &mut Manifest,
) -> Result<Llm, RunError> {
    let ranks = job.ranks;
    let split = job.options.split.unwrap_or(exp.config.split);
    let all: Vec<(String, u64)> = crate::sim::runner::model_agents(exp)
        .into_iter()
        .zip(names)
        .map(|((_, agents), name)| (name.clone(), agents))
        .collect();
    let agents: Vec<u64> = all.iter().map(|(_, n)| *n).collect();
    let ranks_of = crate::sim::runner::model_ranks(&agents, ranks.size());
    let mine: Vec<(String, u64)> = all
        .iter()
        .zip(&ranks_of)
        .filter(|(_, own)| split != Split::Models || own.contains(&ranks.rank()))
        .map(|(m, _)| m.clone())
        .collect();
    let prompts = job.registry.prompts(exp)?;
    let engines = model.load_engines(exp, &mine)?;
    manifest.model = Some(engines[0].name.clone());
    manifest.weights = Some(engines[0].weights.clone());
    // Models loaded by other ranks are listed without what only their rank knows.
    manifest.models = all
        .iter()
        .map(
            |(name, agents)| match engines.iter().find(|m| &m.name == name) {
                Some(m) => record::ModelRecord {
                    name: m.name.clone(),
                    weights: Some(m.weights.clone()),
                    agents: m.agents,
                    kv_bytes: Some(m.kv_bytes),
                },
                None => record::ModelRecord {
                    name: name.clone(),
                    weights: None,
                    agents: *agents,
                    kv_bytes: None,
                },
            },
        )
        .collect();
    Ok(Llm::with_models(
        engines
            .into_iter()
            .map(|m| (Some(m.name), m.engine))
            .collect(),
        prompts,
        exp.config.history,
        exp.config.llm.wave,
    ))
}

/// The run's one model, loaded.
fn load_one(
    registry: &Registry,
    exp: &Experiment,
    model: &ModelSettings,
    manifest: &mut Manifest,
) -> Result<Llm, RunError> {
    let prompts = registry.prompts(exp)?;
    let (engine, described) = model.load_engine_described()?;
    manifest.model = Some(model.model.clone());
    manifest.weights = Some(described);
    manifest.models.clear();
    Ok(Llm::new(
        engine,
        prompts,
        exp.config.history,
        exp.config.llm.wave,
    ))
}

/// What [`attach_reuse`] gave a run that asks a model.
#[derive(Default)]
pub(crate) struct Attached {
    /// The run's own store of replies, on rank 0.
    pub store: Option<Store>,
    /// The earlier runs' replies, shared with the policy that looks them up; read for the
    /// manifest's counts and warnings when the run ends.
    pub reuse: Arc<Mutex<Reuse>>,
}

/// Earlier runs' decisions, and this run's kept for later ones (see [`reuse`]): the sources
/// opened (a resumed run's from its manifest), checked against the engines, and the run's own
/// store, which rank 0 returns to keep every rank's replies in. A resumed run's models are
/// checked to be the ones it started with; a new run's are recorded.
pub(crate) fn attach_reuse(
    job: &Job,
    opened: &mut Opened,
    llm: Option<&mut Llm>,
    model: &ModelSettings,
) -> Result<Attached, RunError> {
    let Some(llm) = llm else {
        return Ok(Attached::default());
    };
    let dir = &opened.dir;
    let manifest = &mut opened.manifest;
    let sources = sources(job, opened.loaded.experiment(), dir, opened.resume)?;
    let default_name = manifest.model.clone().unwrap_or_default();
    let engines: Vec<(String, &Engine)> = llm
        .engines()
        .map(|(name, e)| (name.map_or_else(|| default_name.clone(), str::to_string), e))
        .collect();
    match &opened.started {
        Some(started) => started.check_models(dir, &engines)?,
        None => manifest.engine = Some(super::resume::engine_record(model, &engines)?),
    }
    let reuse = stores::open(&sources, &engines)?;
    let root = job.ranks.is_root();
    // Rank 0 keeps every rank's replies.
    let store = match root {
        true => Some(stores::store(dir, &engines)?),
        false => None,
    };
    drop(engines);
    if !sources.is_empty() {
        let (reused, saved_seconds) = manifest
            .reuse
            .as_ref()
            .map_or((0, 0.0), |r| (r.reused, r.saved_seconds));
        manifest.reuse = Some(record::ReuseRecord {
            sources: sources.iter().map(|d| d.display().to_string()).collect(),
            reused,
            saved_seconds,
        });
        if root {
            record::write_json_atomic(&dir.join(record::MANIFEST), &*manifest)?;
        }
    }
    let reuse = Arc::new(Mutex::new(reuse));
    llm.set_known_replies(Box::new(Arc::clone(&reuse)));
    Ok(Attached { store, reuse })
}

/// The runs whose decisions this one reads: a resumed run's, from its manifest; a new run's,
/// as given, then a counterfactual's base, searched last.
fn sources(
    job: &Job,
    exp: &Experiment,
    dir: &Path,
    resume: bool,
) -> Result<Vec<PathBuf>, RunError> {
    if resume {
        return Ok(record::read_json::<Manifest>(&dir.join(record::MANIFEST))?
            .reuse
            .map(|r| r.sources.into_iter().map(PathBuf::from).collect())
            .unwrap_or_default());
    }
    let mut sources: Vec<PathBuf> = job
        .options
        .reuse
        .iter()
        .map(std::path::absolute)
        .collect::<Result<_, _>>()?;
    if let Some(cf) = &exp.config.counterfactual {
        let base = std::path::absolute(&cf.get_ref().base)?;
        if !sources.contains(&base) {
            sources.push(base);
        }
    }
    Ok(sources)
}
