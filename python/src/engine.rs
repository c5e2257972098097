//! `throng.Engine`: a model loaded once, and lists of prompts decided as one continuous
//! batch, with the interpreter's lock released while the engine works.

use crate::{args, errors};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use throng::engine::{
    Client, Engine, Fill, FinishReason, KvPolicy, Message, Prompt, Queue, Request, RequestError,
    Response, SamplingParams, Schema,
};
use throng::model::{KvFormat, WeightFormat};
use throng::run::{EngineSettings, ModelSettings};

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
    /// The keyword arguments of `decide`, `stream` and `generate`, each checked; each
    /// request's seed is set apart (see [`seeds`]).
    fn new(
        max_tokens: Option<&Bound<'_, PyAny>>,
        temperature: Option<&Bound<'_, PyAny>>,
        top_p: Option<&Bound<'_, PyAny>>,
        top_k: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let max_tokens = match max_tokens {
            Some(m) if !m.is_none() => {
                args::count(m, "max_tokens", "the most tokens a reply may have")?
            }
            _ => 256,
        };
        let temperature = match temperature {
            Some(t) if !t.is_none() => args::number(
                t,
                "temperature",
                |x| x >= 0.0,
                "from 0 up (0: always the likeliest token)",
            )?,
            _ => 0.0,
        };
        let top_p = match top_p {
            Some(p) if !p.is_none() => args::number(
                p,
                "top_p",
                |x| x > 0.0 && x <= 1.0,
                "above 0, at most 1 (1: no nucleus cut)",
            )?,
            _ => 1.0,
        };
        let top_k = args::optional_count(top_k, "top_k", "the likeliest tokens kept; None: all")?;
        Ok(Self {
            max_tokens,
            sampling: SamplingParams {
                temperature,
                top_p,
                top_k,
                seed: 0,
            },
        })
    }
}

/// What `decide` does with a reply cut off before it finished.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnLength {
    Raise,
    Keep,
}

impl OnLength {
    fn of(value: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        match value {
            None => Ok(Self::Raise),
            Some(v) => match args::choice(v, "on_length", &["raise", "none"])?.as_str() {
                "raise" => Ok(Self::Raise),
                _ => Ok(Self::Keep),
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
            errors::argument(
                item.py(),
                format!(
                    "{at}: a prompt given as a list must be messages, {{\"role\": ..., \
                     \"content\": ...}} each: {e}"
                ),
            )
        })?;
        messages.extend(given);
    } else {
        return Err(errors::argument(
            item.py(),
            format!(
                "{at}: a prompt is a string (one user message) or a list of messages, not {}",
                item.get_type().name()?
            ),
        ));
    }
    Ok(Prompt::Messages(messages))
}

/// Each request's seed: `seed` for one request, `derive(seed, [i])` for request `i` of
/// several (as `throng generate --n` seeds its copies), or one per request from a list.
fn seeds(seed: Option<&Bound<'_, PyAny>>, n: usize) -> PyResult<Vec<u64>> {
    let one = |s: u64| match n {
        1 => vec![s],
        _ => (0..n as u64)
            .map(|i| throng::seed::derive(s, &[i]))
            .collect(),
    };
    let Some(seed) = seed.filter(|s| !s.is_none()) else {
        return Ok(one(0));
    };
    let many = args::int(seed).is_none() && !seed.is_instance_of::<PyString>();
    if let (true, Ok(items)) = (many, seed.try_iter()) {
        let each: Vec<u64> = items
            .enumerate()
            .map(|(i, s)| args::seed(&s?, &format!("seed[{i}]")))
            .collect::<PyResult<_>>()?;
        if each.len() != n {
            return Err(args::refuse(
                seed,
                "seed",
                &format!(
                    "{} seeds for {n} prompts: give one per prompt, or a single int",
                    each.len()
                ),
            ));
        }
        return Ok(each);
    }
    args::seed(seed, "seed").map(one)
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

/// The spellings of `device`: `cpu`, `cuda` or `cuda:N`.
fn is_device(spec: &str) -> bool {
    spec == "cpu"
        || spec == "cuda"
        || spec
            .strip_prefix("cuda:")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A keyword argument given, and not None.
pub(crate) fn present<'py>(value: Option<&Bound<'py, PyAny>>) -> Option<Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none()).cloned()
}

/// `kv_memory`: bytes as an int, or a size as text (`"2GiB"`).
pub(crate) fn kv_memory_of(
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<bytesize::ByteSize>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let takes = "give a size such as \"2GiB\" or \"512MiB\", or bytes as an int";
    if value.is_instance_of::<PyString>() {
        let text: String = value.extract()?;
        return text
            .trim()
            .parse::<bytesize::ByteSize>()
            .ok()
            .filter(|b| b.as_u64() > 0)
            .map(Some)
            .ok_or_else(|| args::refuse(value, "kv_memory", takes));
    }
    args::count(value, "kv_memory", takes).map(|n| Some(bytesize::ByteSize::b(n as u64)))
}

/// What a result of `decide` that is not a reply is: a refused or failed request, or a reply
/// cut off before it finished.
enum Failed<'a> {
    Refused(&'a RequestError),
    CutOff,
}

#[pymethods]
impl PyEngine {
    /// Loads `model` (a preset of `throng models`, a model folder, a GGUF file or a Hub repo
    /// id) on `device` (`cpu` or `cuda:N`), its weights converted to `weights` (`auto`,
    /// `native`, `f32`, `f16`, `bf16`, `q8_0`, `int8`, `gguf`, `gguf8`). A bad argument raises
    /// `ArgumentError` naming it; a model that cannot be loaded, `ModelError`.
    #[new]
    #[pyo3(
        signature = (
            model = None,
            *,
            device = None,
            weights = None,
            kv_format = None,
            kv_memory = None,
            max_seqs = None,
            max_batch_tokens = None,
            prefix_cache = None,
            tokenizer = None,
        ),
        text_signature = "(model='smollm2-135m-instruct', *, device='cpu', weights='auto', \
                          kv_format='auto', kv_memory=None, max_seqs=256, \
                          max_batch_tokens=None, prefix_cache=True, tokenizer=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
        weights: Option<&Bound<'_, PyAny>>,
        kv_format: Option<&Bound<'_, PyAny>>,
        kv_memory: Option<&Bound<'_, PyAny>>,
        max_seqs: Option<&Bound<'_, PyAny>>,
        max_batch_tokens: Option<&Bound<'_, PyAny>>,
        prefix_cache: Option<&Bound<'_, PyAny>>,
        tokenizer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let model = match present(model) {
            Some(m) => args::path(
                &m,
                "model",
                "a preset, a model folder, a GGUF file or a Hub repo id",
            )?
            .to_string_lossy()
            .into_owned(),
            None => throng::model::DEFAULT_MODEL.to_string(),
        };
        let device = match present(device) {
            Some(d) => {
                let spec = args::text(&d, "device", "'cpu' or 'cuda:N'")?;
                if !is_device(&spec) {
                    return Err(args::refuse(&d, "device", "give 'cpu' or 'cuda:N'"));
                }
                spec
            }
            None => "cpu".to_string(),
        };
        let weights = match present(weights) {
            Some(w) => {
                let names: Vec<&str> = WeightFormat::ALL.iter().map(|f| f.name()).collect();
                let name = args::choice(&w, "weights", &names)?;
                WeightFormat::ALL[names.iter().position(|n| *n == name).unwrap_or(0)]
            }
            None => WeightFormat::Auto,
        };
        let kv_format = match present(kv_format) {
            Some(k) => {
                let names: Vec<&str> = KvFormat::ALL.iter().map(|f| f.name()).collect();
                let name = args::choice(&k, "kv_format", &names)?;
                KvFormat::ALL[names.iter().position(|n| *n == name).unwrap_or(0)]
            }
            None => KvFormat::Auto,
        };
        let settings = ModelSettings {
            model: model.clone(),
            engine: EngineSettings {
                device,
                weights,
                tokenizer: match present(tokenizer) {
                    Some(t) => Some(args::path(&t, "tokenizer", "a tokenizer.json")?),
                    None => None,
                },
                kv_memory: kv_memory_of(kv_memory)?.map(|b| b.as_u64()),
                kv_format,
                max_batch_tokens: args::optional_count(
                    max_batch_tokens,
                    "max_batch_tokens",
                    "tokens per forward pass; None: 512 on a CPU, 8192 on a GPU",
                )?,
                max_seqs: args::optional_count(max_seqs, "max_seqs", "sequences running at once")?
                    .unwrap_or(256),
                prefix_caching: match present(prefix_cache) {
                    Some(p) => args::flag(&p, "prefix_cache")?,
                    None => true,
                },
                kv_policy: KvPolicy::default(),
                control_tokens_in_content: false,
                host_sampling: false,
            },
        };
        let (engine, described) = py
            .detach(|| settings.load_engine_described())
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

    /// What the weights were stored as and became (`GGUF (Q8_0) -> gguf a8`).
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
    /// derived from it and `i`) or one per prompt.
    ///
    /// A prompt that fails raises its error, naming it: `SchemaError`, `PromptTooLongError`
    /// or `RequestError`, and (`on_length="raise"`, the default) `CutOffError` for a reply
    /// that `max_tokens` or the context cut off before it finished (its value None);
    /// `on_length="none"` returns such replies as they are. The exception's `index` is the
    /// prompt's, and its `results` every prompt's result (a failed one has `error`).
    #[pyo3(
        signature = (
            prompts,
            schema = None,
            *,
            temperature = None,
            seed = None,
            max_tokens = None,
            top_p = None,
            top_k = None,
            system = None,
            on_length = None,
        ),
        text_signature = "($self, prompts, schema=None, *, temperature=0.0, seed=None, \
                          max_tokens=256, top_p=1.0, top_k=None, system=None, \
                          on_length='raise')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn decide<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        schema: Option<&Bound<'py, PyAny>>,
        temperature: Option<&Bound<'py, PyAny>>,
        seed: Option<&Bound<'py, PyAny>>,
        max_tokens: Option<&Bound<'py, PyAny>>,
        top_p: Option<&Bound<'py, PyAny>>,
        top_k: Option<&Bound<'py, PyAny>>,
        system: Option<&Bound<'py, PyAny>>,
        on_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let defaults = Defaults::new(max_tokens, temperature, top_p, top_k)?;
        let max_tokens = defaults.max_tokens;
        let on_length = OnLength::of(on_length)?;
        let requests = self.requests(prompts, schema, seed, system, defaults)?;
        let results = run_all(py, &self.engine, requests)?;
        let out = PyList::empty(py);
        let mut failed: Vec<(usize, Failed<'_>, String)> = Vec::new();
        for (i, result) in results.iter().enumerate() {
            let (dict, failure) = match result {
                Ok(r)
                    if r.finish_reason == FinishReason::Length && on_length == OnLength::Raise =>
                {
                    let cause = match r.generated_tokens >= max_tokens {
                        true => format!("at max_tokens={max_tokens}"),
                        false => "at the end of the model's context".to_string(),
                    };
                    let text = format!(
                        "prompt {i}: the reply was cut off {cause} before it finished, so it has \
                         no value: raise max_tokens (or shorten the prompt), or pass \
                         on_length=\"none\" to take cut-off replies as they are (finish_reason \
                         \"length\", value None)"
                    );
                    let dict = response_dict(py, r)?;
                    dict.set_item("error", &text)?;
                    (dict, Some((Failed::CutOff, text)))
                }
                Ok(r) => (response_dict(py, r)?, None),
                Err(e) => {
                    let text = format!("prompt {i}: {e}");
                    let dict = PyDict::new(py);
                    dict.set_item("error", &text)?;
                    (dict, Some((Failed::Refused(e), text)))
                }
            };
            dict.set_item("index", i)?;
            out.append(dict)?;
            if let Some((kind, text)) = failure {
                failed.push((i, kind, text));
            }
        }
        let Some((index, kind, text)) = failed.first() else {
            return Ok(out);
        };
        // The others' results are not lost with the exception: it carries them all.
        let others = match &failed[1..] {
            [] => String::new(),
            rest => format!(
                "; prompt{} {} failed too",
                if rest.len() == 1 { "" } else { "s" },
                rest.iter()
                    .map(|(i, ..)| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let text = format!(
            "{text}{others} (every prompt's result is in this exception's `results`, a failed \
             one with its `error`)"
        );
        let error = match kind {
            Failed::Refused(e) => errors::from_request(e, text),
            Failed::CutOff => errors::CutOffError::new_err(text),
        };
        let value = error.value(py);
        value.setattr("index", index)?;
        value.setattr("results", out)?;
        Err(error)
    }

    /// As `decide`, yielding each result as soon as it finishes (in the order they finish),
    /// with its prompt's `index`; a refused or failed request yields `index` and `error`. A
    /// reply cut off before it finished has `finish_reason` `"length"` and `value` None.
    #[pyo3(
        signature = (
            prompts,
            schema = None,
            *,
            temperature = None,
            seed = None,
            max_tokens = None,
            top_p = None,
            top_k = None,
            system = None,
        ),
        text_signature = "($self, prompts, schema=None, *, temperature=0.0, seed=None, \
                          max_tokens=256, top_p=1.0, top_k=None, system=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn stream<'py>(
        &self,
        prompts: &Bound<'py, PyAny>,
        schema: Option<&Bound<'py, PyAny>>,
        temperature: Option<&Bound<'py, PyAny>>,
        seed: Option<&Bound<'py, PyAny>>,
        max_tokens: Option<&Bound<'py, PyAny>>,
        top_p: Option<&Bound<'py, PyAny>>,
        top_k: Option<&Bound<'py, PyAny>>,
        system: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Stream> {
        let defaults = Defaults::new(max_tokens, temperature, top_p, top_k)?;
        let requests = self.requests(prompts, schema, seed, system, defaults)?;
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
    /// `error`). The keyword arguments are the defaults of the requests that do not set their
    /// own.
    #[pyo3(
        signature = (requests, *, max_tokens = None, temperature = None, top_p = None, top_k = None, seed = None),
        text_signature = "($self, requests, *, max_tokens=256, temperature=0.0, top_p=1.0, \
                          top_k=None, seed=0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
        max_tokens: Option<&Bound<'py, PyAny>>,
        temperature: Option<&Bound<'py, PyAny>>,
        top_p: Option<&Bound<'py, PyAny>>,
        top_k: Option<&Bound<'py, PyAny>>,
        seed: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let Defaults {
            max_tokens,
            mut sampling,
        } = Defaults::new(max_tokens, temperature, top_p, top_k)?;
        sampling.seed = match seed {
            Some(s) if !s.is_none() => args::seed(s, "seed")?,
            _ => 0,
        };
        if requests.is_instance_of::<PyString>() || requests.is_instance_of::<PyDict>() {
            return Err(args::refuse(
                requests,
                "requests",
                "give a list of requests (dicts, or JSON strings): wrap a single one in a list",
            ));
        }
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
            match throng::engine::jsonl::request_from_json(&text, i, &at, max_tokens, sampling) {
                Ok(request) => {
                    places.push((i, request.sampling.seed));
                    valid.push(request);
                    lines.push(None);
                }
                Err(e) => {
                    let tag = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v.get("tag").and_then(|t| t.as_str()).map(String::from));
                    lines.push(Some(throng::engine::jsonl::response_line(
                        i,
                        None,
                        Err((e.to_string(), tag.as_deref())),
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
            lines[i] = Some(throng::engine::jsonl::response_line(i, Some(seed), result));
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
        system: Option<&Bound<'_, PyAny>>,
        defaults: Defaults,
    ) -> PyResult<Vec<Request>> {
        if prompts.is_instance_of::<PyString>() {
            return Err(args::refuse(
                prompts,
                "prompts",
                "give a list of prompts: wrap a single prompt in a list",
            ));
        }
        let system = match system {
            Some(s) if !s.is_none() => Some(args::text(s, "system", "the system message")?),
            _ => None,
        };
        let items: Vec<Bound<'_, PyAny>> = prompts
            .try_iter()
            .map_err(|_| {
                args::refuse(
                    prompts,
                    "prompts",
                    "give a list of prompts (strings, or lists of messages)",
                )
            })?
            .collect::<PyResult<_>>()?;
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
        let seeds = seeds(seed, items.len())?;
        items
            .iter()
            .zip(seeds)
            .enumerate()
            .map(|(i, (item, seed))| {
                let prompt = prompt_of(item, system.as_deref(), &format!("prompt {i}"))?;
                let mut request = Request::new(prompt)
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
