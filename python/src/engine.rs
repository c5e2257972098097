//! `throng.Engine`: a model loaded once, and lists of prompts decided as one continuous
//! batch, with the interpreter's lock released while the engine works.

use crate::errors;
use clap::Parser;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use throng::cli::ModelArgs;
use throng::engine::{
    Client, Engine, Fill, Message, Prompt, Queue, Request, RequestError, Response, SamplingParams,
    Schema,
};

/// The engine's settings, read as `throng generate` reads its flags, so that a value is
/// checked (and refused) with the command line's own words.
#[derive(Parser)]
#[command(name = "throng.Engine", no_binary_name = true)]
struct Settings {
    #[command(flatten)]
    model: ModelArgs,
}

/// A model loaded once, deciding lists of prompts as one continuous batch.
#[pyclass(name = "Engine", module = "throng")]
pub struct PyEngine {
    engine: Arc<Mutex<Engine>>,
    model: String,
    weights: String,
}

/// Sampling settings and limits shared by the requests of one call.
struct Defaults {
    max_tokens: usize,
    sampling: SamplingParams,
}

impl Defaults {
    /// Each request's seed is set apart (see [`seeds`]).
    fn new(max_tokens: usize, temperature: f32, top_p: f32, top_k: Option<usize>) -> Self {
        Self {
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_p,
                top_k,
                seed: 0,
            },
        }
    }
}

/// The engine, unless an earlier call panicked while it held it.
fn lock(engine: &Mutex<Engine>) -> PyResult<std::sync::MutexGuard<'_, Engine>> {
    engine.lock().map_err(|_| {
        errors::ThrongError::new_err(
            "the engine stopped in an earlier call that failed; create a new Engine",
        )
    })
}

/// A prompt of `decide`: a string (one user message) or a list of `{"role", "content"}`.
fn prompt_of(item: &Bound<'_, PyAny>, system: Option<&str>, at: &str) -> PyResult<Prompt> {
    let mut messages: Vec<Message> = system.map(Message::system).into_iter().collect();
    if item.is_instance_of::<PyString>() {
        messages.push(Message::user(item.extract::<String>()?));
    } else if item.is_instance_of::<PyList>() {
        let given: Vec<Message> = pythonize::depythonize(item).map_err(|e| {
            PyTypeError::new_err(format!(
                "{at}: a prompt given as a list must be messages, {{\"role\": ..., \"content\": \
                 ...}} each: {e}"
            ))
        })?;
        messages.extend(given);
    } else {
        return Err(PyTypeError::new_err(format!(
            "{at}: a prompt is a string (one user message) or a list of messages, not {}",
            item.get_type().name()?
        )));
    }
    Ok(Prompt::Messages(messages))
}

/// Each request's seed: `seed` for one request, `derive(seed, [i])` for request `i` of
/// several (as `throng generate --n` seeds its copies), or one per request from a list.
fn seeds(seed: &Bound<'_, PyAny>, n: usize) -> PyResult<Vec<u64>> {
    if let Ok(one) = seed.extract::<u64>() {
        return Ok(match n {
            1 => vec![one],
            _ => (0..n as u64)
                .map(|i| throng::seed::derive(one, &[i]))
                .collect(),
        });
    }
    let each: Vec<u64> = seed.extract().map_err(|_| {
        PyTypeError::new_err("seed is a non-negative int, or a list of them (one per prompt)")
    })?;
    if each.len() != n {
        return Err(PyValueError::new_err(format!(
            "seed gives {} seeds for {n} prompts: give one per prompt, or a single int",
            each.len()
        )));
    }
    Ok(each)
}

/// A response as a dict: the engine's fields (`value`, `text`, `finish_reason`, token counts,
/// `timings`, `tag`) and the generated token ids as `tokens`.
fn response_dict<'py>(py: Python<'py>, r: &Response) -> PyResult<Bound<'py, PyDict>> {
    let dict = pythonize::pythonize(py, r)?.cast_into::<PyDict>()?;
    dict.set_item("tokens", &r.token_ids)?;
    Ok(dict)
}

/// Queues a list of requests at once and keeps their results in order; between steps it
/// looks for a Ctrl-C, which ends the call.
struct Collect {
    requests: Option<Vec<Request>>,
    results: Vec<Option<Result<Response, RequestError>>>,
}

impl Client for Collect {
    type Key = usize;
    type Error = PyErr;

    fn fill(&mut self, queue: &mut Queue<'_, usize>) -> PyResult<Fill> {
        for (i, request) in self.requests.take().into_iter().flatten().enumerate() {
            if let Err(refused) = queue.submit(i, request) {
                self.results[i] = Some(Err(refused.error));
            }
        }
        Ok(Fill::Done)
    }

    fn finished(&mut self, i: usize, result: Result<Response, RequestError>) -> PyResult<()> {
        self.results[i] = Some(result);
        Ok(())
    }

    fn stepped(&mut self, _finished: usize) -> PyResult<()> {
        Python::attach(|py| py.check_signals())
    }
}

/// Runs `requests` as one batch with the interpreter's lock released.
fn run_all(
    py: Python<'_>,
    engine: &Arc<Mutex<Engine>>,
    requests: Vec<Request>,
) -> PyResult<Vec<Result<Response, RequestError>>> {
    let n = requests.len();
    let engine = engine.clone();
    py.detach(move || {
        let mut engine = lock(&engine)?;
        let mut all = Collect {
            requests: Some(requests),
            results: (0..n).map(|_| None).collect(),
        };
        engine.run(usize::MAX, &mut all)?;
        Ok(all
            .results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(RequestError::Engine("interrupted".into()))))
            .collect())
    })
}

/// Sends each result down a channel as it finishes, for `Engine.stream`; ends the run when
/// the reader has gone.
struct Send {
    requests: Option<Vec<Request>>,
    tx: mpsc::Sender<(usize, Result<Response, RequestError>)>,
}

/// The reader of a stream went away: its requests are dropped.
struct Gone;

impl Client for Send {
    type Key = usize;
    type Error = Gone;

    fn fill(&mut self, queue: &mut Queue<'_, usize>) -> Result<Fill, Gone> {
        for (i, request) in self.requests.take().into_iter().flatten().enumerate() {
            if let Err(refused) = queue.submit(i, request) {
                self.tx.send((i, Err(refused.error))).map_err(|_| Gone)?;
            }
        }
        Ok(Fill::Done)
    }

    fn finished(&mut self, i: usize, result: Result<Response, RequestError>) -> Result<(), Gone> {
        self.tx.send((i, result)).map_err(|_| Gone)
    }
}

#[pymethods]
impl PyEngine {
    /// Loads `model` (a preset of `throng models`, a model folder, a GGUF file or a Hub repo
    /// id) on `device` (`cpu` or `cuda:N`), its weights converted to `weights` (`auto`,
    /// `native`, `f32`, `f16`, `bf16`, `int8`).
    #[new]
    #[pyo3(signature = (
        model = throng::model::DEFAULT_MODEL.to_string(),
        *,
        device = "cpu".to_string(),
        weights = "auto".to_string(),
        kv_format = "auto".to_string(),
        kv_memory = None,
        max_seqs = 256,
        max_batch_tokens = None,
        prefix_cache = true,
        tokenizer = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: String,
        device: String,
        weights: String,
        kv_format: String,
        kv_memory: Option<String>,
        max_seqs: usize,
        max_batch_tokens: Option<usize>,
        prefix_cache: bool,
        tokenizer: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let mut argv: Vec<std::ffi::OsString> = [
            "--model",
            &model,
            "--device",
            &device,
            "--weights",
            &weights,
            "--kv-format",
            &kv_format,
            "--max-seqs",
            &max_seqs.to_string(),
        ]
        .iter()
        .map(Into::into)
        .collect();
        if let Some(kv) = &kv_memory {
            argv.extend(["--kv-memory".into(), kv.into()]);
        }
        if let Some(tokens) = max_batch_tokens {
            argv.extend(["--max-batch-tokens".into(), tokens.to_string().into()]);
        }
        if !prefix_cache {
            argv.push("--no-prefix-cache".into());
        }
        if let Some(path) = tokenizer {
            argv.extend(["--tokenizer".into(), path.into()]);
        }
        let settings = Settings::try_parse_from(argv)
            .map_err(|e| PyValueError::new_err(e.render().to_string().trim_end().to_string()))?;
        let (engine, described) = py
            .detach(|| settings.model.load_engine_described())
            .map_err(|e| errors::ModelError::new_err(errors::message(&e)))?;
        Ok(Self {
            engine: Arc::new(Mutex::new(engine)),
            model,
            weights: described,
        })
    }

    /// The model's name, as given.
    #[getter]
    fn model(&self) -> &str {
        &self.model
    }

    /// What the weights were stored as and became (`GGUF (Q8_0) -> Int8`).
    #[getter]
    fn weights(&self) -> &str {
        &self.weights
    }

    /// The longest prompt and reply the model holds, in tokens.
    #[getter]
    fn max_context(&self) -> PyResult<usize> {
        Ok(lock(&self.engine)?.max_context())
    }

    /// Decides every prompt as one continuous batch; one dict per prompt, in order: `value`
    /// (the parsed reply, with a schema), `text`, `finish_reason`, token counts, `tokens` (the
    /// generated ids) and `timings`. A prompt is a string (one user message, after `system`
    /// when given) or a list of messages. `seed` is an int (prompt `i` of several gets a seed
    /// derived from it and `i`) or one per prompt. A refused request raises `SchemaError`,
    /// `PromptTooLongError` or `RequestError` naming it.
    #[pyo3(signature = (
        prompts,
        schema = None,
        *,
        temperature = 0.0,
        seed = None,
        max_tokens = 256,
        top_p = 1.0,
        top_k = None,
        system = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        schema: Option<&Bound<'py, PyAny>>,
        temperature: f32,
        seed: Option<&Bound<'py, PyAny>>,
        max_tokens: usize,
        top_p: f32,
        top_k: Option<usize>,
        system: Option<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        let requests = self.requests(
            prompts,
            schema,
            seed,
            system.as_deref(),
            Defaults::new(max_tokens, temperature, top_p, top_k),
        )?;
        let results = run_all(py, &self.engine, requests)?;
        let out = PyList::empty(py);
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(r) => out.append(response_dict(py, r)?)?,
                Err(e) => return Err(errors::from_request(&format!("prompt {i}"), e)),
            }
        }
        Ok(out)
    }

    /// As `decide`, yielding each result as soon as it finishes (in the order they finish),
    /// with its prompt's `index`; a refused or failed request yields `index` and `error`.
    #[pyo3(signature = (
        prompts,
        schema = None,
        *,
        temperature = 0.0,
        seed = None,
        max_tokens = 256,
        top_p = 1.0,
        top_k = None,
        system = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn stream<'py>(
        &self,
        prompts: &Bound<'py, PyAny>,
        schema: Option<&Bound<'py, PyAny>>,
        temperature: f32,
        seed: Option<&Bound<'py, PyAny>>,
        max_tokens: usize,
        top_p: f32,
        top_k: Option<usize>,
        system: Option<String>,
    ) -> PyResult<Stream> {
        let requests = self.requests(
            prompts,
            schema,
            seed,
            system.as_deref(),
            Defaults::new(max_tokens, temperature, top_p, top_k),
        )?;
        let (tx, rx) = mpsc::channel();
        let engine = self.engine.clone();
        let thread = std::thread::Builder::new()
            .name("throng-stream".into())
            .spawn(move || {
                let Ok(mut engine) = engine.lock() else {
                    return;
                };
                let mut client = Send {
                    requests: Some(requests),
                    tx,
                };
                // A reader that went away ends the run; its requests are dropped.
                let _ = engine.run(usize::MAX, &mut client);
            })
            .map_err(|e| errors::ThrongError::new_err(format!("cannot start a thread: {e}")))?;
        Ok(Stream {
            rx: Mutex::new(rx),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Runs requests given as `throng generate --requests` reads them (dicts, or JSON
    /// strings, with `messages` or `prompt` and the optional `json_schema`, `max_tokens`,
    /// `temperature`, `top_p`, `top_k`, `seed`, `stop`, `tag`), as one batch; returns the
    /// lines it writes, as dicts, in order (`index`, `seed`, the response's fields, or
    /// `error`).
    #[pyo3(signature = (requests, *, max_tokens = 256, temperature = 0.0, top_p = 1.0, top_k = None, seed = 0))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: Option<usize>,
        seed: u64,
    ) -> PyResult<Bound<'py, PyList>> {
        let sampling = SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        };
        let json = py.import("json")?;
        let mut lines: Vec<Option<String>> = Vec::new();
        let mut valid = Vec::new();
        let mut places = Vec::new();
        for (i, item) in requests.try_iter()?.enumerate() {
            let item = item?;
            let text: String = match item.is_instance_of::<PyString>() {
                true => item.extract()?,
                false => json.call_method1("dumps", (&item,))?.extract()?,
            };
            let at = format!("request {i}");
            match throng::cli::generate::request_from_json(&text, i, &at, max_tokens, sampling) {
                Ok(request) => {
                    places.push((i, request.sampling.seed));
                    valid.push(request);
                    lines.push(None);
                }
                Err(e) => {
                    let tag = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v.get("tag").and_then(|t| t.as_str()).map(String::from));
                    lines.push(Some(throng::cli::generate::response_line(
                        i,
                        None,
                        Err((e, tag.as_deref())),
                    )));
                }
            }
        }
        let results = run_all(py, &self.engine, valid)?;
        for ((i, seed), result) in places.into_iter().zip(&results) {
            let result = match result {
                Ok(r) => Ok(r),
                Err(e) => Err((e.to_string(), None)),
            };
            lines[i] = Some(throng::cli::generate::response_line(i, Some(seed), result));
        }
        let out = PyList::empty(py);
        for line in lines.into_iter().flatten() {
            let value: serde_json::Value = serde_json::from_str(&line)
                .map_err(|e| errors::ThrongError::new_err(e.to_string()))?;
            out.append(pythonize::pythonize(py, &value)?)?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "throng.Engine({:?}, weights={:?})",
            self.model, self.weights
        )
    }
}

impl PyEngine {
    fn requests(
        &self,
        prompts: &Bound<'_, PyAny>,
        schema: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        system: Option<&str>,
        defaults: Defaults,
    ) -> PyResult<Vec<Request>> {
        if prompts.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "prompts is a list of prompts: wrap a single prompt in a list",
            ));
        }
        let items: Vec<Bound<'_, PyAny>> = prompts.try_iter()?.collect::<PyResult<_>>()?;
        let schema = match schema {
            None => None,
            Some(s) if s.is_none() => None,
            Some(s) => {
                let value: serde_json::Value = pythonize::depythonize(s).map_err(|e| {
                    errors::SchemaError::new_err(format!("the schema is not JSON: {e}"))
                })?;
                Some(Schema::new(value))
            }
        };
        let seeds = match seed {
            Some(s) if !s.is_none() => seeds(s, items.len())?,
            _ => seeds(&0u64.into_pyobject(prompts.py())?.into_any(), items.len())?,
        };
        items
            .iter()
            .zip(seeds)
            .enumerate()
            .map(|(i, (item, seed))| {
                let mut request = Request::new(prompt_of(item, system, &format!("prompt {i}"))?)
                    .with_max_tokens(defaults.max_tokens)
                    .with_sampling(SamplingParams {
                        seed,
                        ..defaults.sampling
                    });
                request.json_schema = schema.clone();
                Ok(request)
            })
            .collect()
    }
}

/// The results of `Engine.stream`, as they finish.
#[pyclass(module = "throng")]
pub struct Stream {
    rx: Mutex<mpsc::Receiver<(usize, Result<Response, RequestError>)>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let next = py.detach(|| match self.rx.lock() {
            Ok(rx) => rx.recv().ok(),
            Err(_) => None,
        });
        let Some((i, result)) = next else {
            if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
                py.detach(|| thread.join())
                    .map_err(|_| errors::ThrongError::new_err("the engine's thread failed"))?;
            }
            return Ok(None);
        };
        let dict = match &result {
            Ok(r) => response_dict(py, r)?,
            Err(e) => {
                let d = PyDict::new(py);
                d.set_item("error", e.to_string())?;
                d
            }
        };
        dict.set_item("index", i)?;
        Ok(Some(dict))
    }
}
