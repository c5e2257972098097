//! `throng.run`'s keyword arguments as the library's [`RunOptions`]: each checked here, a bad
//! one a `ConfigError` naming it, the value given and what it takes (as a bad flag of
//! `throng run` is a bad run argument).

use crate::args;
use crate::engine::{kv_memory_of, present};
use crate::errors;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};
use std::path::PathBuf;
use std::time::Duration;
use throng::engine::KvPolicy;
use throng::model::{KvFormat, WeightFormat};
use throng::run::{EngineChoices, RunOptions};

/// The keyword arguments of `throng.run`, as given (`None` for one not given).
pub struct Kwargs<'py> {
    pub resume: Option<Bound<'py, PyAny>>,
    pub out: Option<Bound<'py, PyAny>>,
    pub policy: Option<Bound<'py, PyAny>>,
    pub steps: Option<Bound<'py, PyAny>>,
    pub replicates: Option<Bound<'py, PyAny>>,
    pub agents: Option<Bound<'py, PyAny>>,
    pub model: Option<Bound<'py, PyAny>>,
    pub device: Option<Bound<'py, PyAny>>,
    pub weights: Option<Bound<'py, PyAny>>,
    pub no_report: Option<Bound<'py, PyAny>>,
    pub stop_after: Option<Bound<'py, PyAny>>,
    pub reuse: Option<Bound<'py, PyAny>>,
    pub split: Option<Bound<'py, PyAny>>,
    pub devices: Option<Bound<'py, PyAny>>,
    pub rank_timeout: Option<Bound<'py, PyAny>>,
    pub stop_timeout: Option<Bound<'py, PyAny>>,
    pub serve: Option<Bound<'py, PyAny>>,
    pub public: Option<Bound<'py, PyAny>>,
    pub tokenizer: Option<Bound<'py, PyAny>>,
    pub kv_memory: Option<Bound<'py, PyAny>>,
    pub kv_format: Option<Bound<'py, PyAny>>,
    pub max_batch_tokens: Option<Bound<'py, PyAny>>,
    pub max_seqs: Option<Bound<'py, PyAny>>,
    pub no_prefix_cache: Option<Bound<'py, PyAny>>,
    pub kv_policy: Option<Bound<'py, PyAny>>,
    pub threads: Option<Bound<'py, PyAny>>,
}

/// A bad run argument: the `ArgumentError` the checks of [`args`] make, as a `ConfigError`.
fn config_error(py: Python<'_>, e: PyErr) -> PyErr {
    errors::ConfigError::new_err(e.value(py).to_string())
}

/// The options of a run of `config` (or of `resume`), or a `ConfigError` naming the argument
/// that cannot be one.
pub fn of(py: Python<'_>, config: Option<PathBuf>, kw: Kwargs<'_>) -> PyResult<RunOptions> {
    if let Some(threads) = present(kw.threads.as_ref()) {
        // A command sizes its thread pools before any thread exists; this program's pools
        // started with it.
        let n = args::int(&threads).unwrap_or_default();
        return Err(errors::ConfigError::new_err(format!(
            "threads={n}: the threads of a program that embeds throng start with it; set the \
             environment variable RAYON_NUM_THREADS={n} before it starts instead"
        )));
    }
    options(config, kw).map_err(|e| config_error(py, e))
}

fn options(config: Option<PathBuf>, kw: Kwargs<'_>) -> PyResult<RunOptions> {
    let default = RunOptions::default();
    Ok(RunOptions {
        config,
        resume: path(&kw.resume, "resume", "the folder of the run to continue")?,
        out: path(&kw.out, "out", "the folder to write the run into")?,
        policy: named(&kw.policy, "policy")?,
        replicates: signed(&kw.replicates, "replicates")?,
        steps: signed(&kw.steps, "steps")?,
        agents: match present(kw.agents.as_ref()) {
            Some(v) => Some(
                each(&v)
                    .iter()
                    .map(|a| int(a, "agents", "a population size, or a list of them"))
                    .collect::<PyResult<_>>()?,
            ),
            None => None,
        },
        model: text(
            &kw.model,
            "model",
            "a preset, a model folder, a GGUF file or a repo id",
        )?,
        engine: engine(&kw)?,
        reuse: match present(kw.reuse.as_ref()) {
            Some(v) => each(&v)
                .iter()
                .map(|d| args::path(d, "reuse", "an earlier run's folder, or a list of them"))
                .collect::<PyResult<_>>()?,
            None => Vec::new(),
        },
        report: !flag(&kw.no_report, "no_report")?,
        stop_after: match present(kw.stop_after.as_ref()) {
            Some(v) => Some(count(&v, "stop_after", "steps to run before pausing")?),
            None => None,
        },
        split: named(&kw.split, "split")?,
        devices: match present(kw.devices.as_ref()) {
            Some(v) if v.is_instance_of::<PyString>() => Some(
                args::text(&v, "devices", "devices, one per local rank")?
                    .split(',')
                    .map(str::to_string)
                    .collect(),
            ),
            Some(v) => Some(
                each(&v)
                    .iter()
                    .map(|d| args::text(d, "devices", "a device such as 'cuda:0'"))
                    .collect::<PyResult<_>>()?,
            ),
            None => None,
        },
        rank_timeout: seconds(&kw.rank_timeout, "rank_timeout")?.unwrap_or(default.rank_timeout),
        stop_timeout: seconds(&kw.stop_timeout, "stop_timeout")?.unwrap_or(default.stop_timeout),
        serve: serve(&kw.serve)?,
        public: flag(&kw.public, "public")?,
        threads: None,
        catch_signals: false,
        faults: Default::default(),
        // Messages name how to go on from Python (`throng.run(resume=...)`).
        program: throng::host::Program::Python,
    })
}

/// The engine's keyword arguments.
fn engine(kw: &Kwargs<'_>) -> PyResult<EngineChoices> {
    Ok(EngineChoices {
        device: text(&kw.device, "device", "'cpu' or 'cuda:N'")?,
        weights: match present(kw.weights.as_ref()) {
            Some(w) => {
                let names = WeightFormat::ALL.map(WeightFormat::name);
                WeightFormat::from_name(&args::choice(&w, "weights", &names)?)
            }
            None => None,
        },
        tokenizer: path(&kw.tokenizer, "tokenizer", "a tokenizer.json")?,
        kv_memory: kv_memory_of(kw.kv_memory.as_ref())?.map(|b| b.as_u64()),
        kv_format: match present(kw.kv_format.as_ref()) {
            Some(k) => {
                let names = KvFormat::ALL.map(KvFormat::name);
                KvFormat::from_name(&args::choice(&k, "kv_format", &names)?)
            }
            None => None,
        },
        max_batch_tokens: args::optional_count(
            kw.max_batch_tokens.as_ref(),
            "max_batch_tokens",
            "tokens per forward pass",
        )?,
        max_seqs: args::optional_count(kw.max_seqs.as_ref(), "max_seqs", "sequences at once")?,
        prefix_caching: Some(!flag(&kw.no_prefix_cache, "no_prefix_cache")?),
        kv_policy: match present(kw.kv_policy.as_ref()) {
            Some(p) => {
                let names = KvPolicy::ALL.map(KvPolicy::name);
                let name = args::choice(&p, "kv_policy", &names)?;
                KvPolicy::ALL.into_iter().find(|k| k.name() == name)
            }
            None => None,
        },
    })
}

/// The items of a list or tuple, or the value alone.
fn each<'py>(value: &Bound<'py, PyAny>) -> Vec<Bound<'py, PyAny>> {
    match value.cast::<PyList>() {
        Ok(list) => list.iter().collect(),
        Err(_) => match value.cast::<PyTuple>() {
            Ok(tuple) => tuple.iter().collect(),
            Err(_) => vec![value.clone()],
        },
    }
}

fn path(value: &Option<Bound<'_, PyAny>>, name: &str, takes: &str) -> PyResult<Option<PathBuf>> {
    present(value.as_ref())
        .map(|v| args::path(&v, name, takes))
        .transpose()
}

fn text(value: &Option<Bound<'_, PyAny>>, name: &str, takes: &str) -> PyResult<Option<String>> {
    present(value.as_ref())
        .map(|v| args::text(&v, name, takes))
        .transpose()
}

fn flag(value: &Option<Bound<'_, PyAny>>, name: &str) -> PyResult<bool> {
    present(value.as_ref()).map_or(Ok(false), |v| args::flag(&v, name))
}

/// A whole number, of any sign (the config's checks refuse a bad count in their words).
fn int(value: &Bound<'_, PyAny>, name: &str, takes: &str) -> PyResult<i64> {
    args::int(value)
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| args::refuse(value, name, &format!("give an int ({takes})")))
}

fn signed(value: &Option<Bound<'_, PyAny>>, name: &str) -> PyResult<Option<i64>> {
    present(value.as_ref())
        .map(|v| int(&v, name, "a count"))
        .transpose()
}

/// A whole number from 0 up.
fn count(value: &Bound<'_, PyAny>, name: &str, takes: &str) -> PyResult<usize> {
    args::int(value)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| args::refuse(value, name, &format!("give a non-negative int ({takes})")))
}

fn seconds(value: &Option<Bound<'_, PyAny>>, name: &str) -> PyResult<Option<Duration>> {
    present(value.as_ref())
        .map(|v| count(&v, name, "seconds").map(|s| Duration::from_secs(s as u64)))
        .transpose()
}

/// A choice of the library's, by its name (`policy="scripted"`).
fn named<T: serde::de::DeserializeOwned>(
    value: &Option<Bound<'_, PyAny>>,
    name: &str,
) -> PyResult<Option<T>> {
    let Some(v) = present(value.as_ref()) else {
        return Ok(None);
    };
    let given = args::text(&v, name, "a name")?;
    serde_json::from_value(serde_json::Value::String(given))
        .map(Some)
        .map_err(|e| args::refuse(&v, name, &e.to_string()))
}

/// `serve=True` (the default address) or `serve="127.0.0.1:8787"`.
fn serve(value: &Option<Bound<'_, PyAny>>) -> PyResult<Option<std::net::SocketAddr>> {
    let Some(v) = present(value.as_ref()) else {
        return Ok(None);
    };
    let takes = "give True, or an address such as \"127.0.0.1:8787\"";
    let addr = match v.is_instance_of::<pyo3::types::PyBool>() {
        true if args::flag(&v, "serve")? => throng::run::DEFAULT_LIVE_ADDR.to_string(),
        true => return Ok(None),
        false => args::text(&v, "serve", takes)?,
    };
    addr.parse()
        .map(Some)
        .map_err(|_| args::refuse(&v, "serve", takes))
}
