//! The routes, the guard every request passes, and the two ways a completion comes back: one
//! JSON reply, or server-sent events as the engine steps.

use super::app::{App, Served};
use super::chat::{self, ChatJob, ChatRequest, Limits, Usage};
use super::error::ApiFailure;
use super::tool_stream::{Delta, Shown};
use super::tools::{Form, ToolMode};
use crate::engine::{KnownReplies, Prompt, RequestError, RequestKey, Response as Reply, Sink};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// The largest body taken: a long conversation with tools fits many times over.
const MAX_BODY: usize = 16 << 20;

pub(super) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/throng/stats", get(stats))
        .route("/v1/throng/expect_calls", post(expect_calls))
        .method_not_allowed_fallback(|request: Request| async move {
            let allowed = match request.uri().path() {
                "/v1/chat/completions" | "/v1/throng/expect_calls" => "POST",
                _ => "GET",
            };
            let mut response = ApiFailure::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "{} is not a method of {}: use {allowed}",
                    request.method(),
                    request.uri().path()
                ),
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allowed));
            response
        })
        .fallback(|request: Request| async move {
            ApiFailure::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint: {} {} (throng api answers POST /v1/chat/completions and \
                     GET /v1/models)",
                    request.method(),
                    request.uri().path()
                ),
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// The credentials of an `Authorization` value in the `Bearer` scheme, whose name is
/// case-insensitive (RFC 7235): `Bearer K`, `bearer K`, `BEARER K`.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Every request names this server in its Host header (a page of another site, its name
/// rebound to this machine, is refused) and carries the API key as OpenAI's clients send it.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if let Err(refusal) = app.access.check_host(headers) {
        return ApiFailure::new(refusal.0, refusal.1).into_response();
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let refused = match given {
        Some(key) if app.access.is_token(key.trim()) => None,
        Some(_) => Some("wrong API key: give the key `throng api` printed (or --api-key)"),
        None => Some(
            "this server needs its API key, sent as `Authorization: Bearer KEY` (api_key= in \
             OpenAI's clients): the key `throng api` printed, or the one given with --api-key",
        ),
    };
    let mut response = match refused {
        Some(words) => ApiFailure::new(StatusCode::UNAUTHORIZED, words)
            .code("invalid_api_key")
            .into_response(),
        None => next.run(request).await,
    };
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn models(State(app): State<Arc<App>>) -> Response {
    let data: Vec<Value> = app.models.iter().map(|m| model_object(&m.name)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(
    State(app): State<Arc<App>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match app.find(&id) {
        Ok(m) => axum::Json(model_object(&m.name)).into_response(),
        Err(f) => f.into_response(),
    }
}

fn model_object(name: &str) -> Value {
    json!({"id": name, "object": "model", "created": 0, "owned_by": "throng"})
}

/// What each engine is doing, and the admission count.
async fn stats(State(app): State<Arc<App>>) -> Response {
    let app2 = Arc::clone(&app);
    let engines = tokio::task::spawn_blocking(move || {
        app2.models
            .iter()
            .map(|m| match m.handle.status() {
                Ok(s) => json!({"model": m.name, "status": s}),
                Err(e) => json!({"model": m.name, "error": e.to_string()}),
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    axum::Json(json!({
        "admitted": app.admitted.load(Ordering::SeqCst),
        "queue": app.queue,
        "reused": app.reused.load(Ordering::SeqCst),
        "spliced": app.spliced.load(Ordering::SeqCst),
        // Replies given and not yet in the `--store` (none without one).
        "store_pending": app.recorder.as_ref().map_or(0, |r| r.pending()),
        "engines": engines,
    }))
    .into_response()
}

/// A framework that knows the order its agents will call in says so: `{"users": [...]}` (the
/// `user` of each agent's requests, in the order of the next round; optionally `"model"`).
/// Under `--kv-policy next-call` a full cache then keeps the histories of the agents called
/// soonest; a wrong announcement costs cache hits, never a different reply.
async fn expect_calls(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let announced = body
        .map_err(|e| ApiFailure::new(e.status(), e.body_text()))
        .and_then(|body| {
            let value: Value = serde_json::from_slice(&body).map_err(|e| {
                ApiFailure::new(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not JSON: {e}"),
                )
            })?;
            ApiFailure::parse::<ExpectCalls>(value)
        });
    let announced = match announced {
        Ok(a) => a,
        Err(f) => return f.into_response(),
    };
    let models: Vec<usize> = match &announced.model {
        Some(name) => match app.index(name) {
            Ok(m) => vec![m],
            Err(f) => return f.into_response(),
        },
        None => (0..app.models.len()).collect(),
    };
    for m in models {
        app.rounds[m].told();
        app.models[m].handle.expect_calls(announced.users.clone());
    }
    axum::Json(json!({"expected": announced.users.len()})).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectCalls {
    users: Vec<String>,
    model: Option<String>,
}

impl App {
    fn find(&self, name: &str) -> Result<&Served, ApiFailure> {
        self.index(name).map(|i| &self.models[i])
    }

    /// The position of the model served as `name`.
    fn index(&self, name: &str) -> Result<usize, ApiFailure> {
        self.models
            .iter()
            .position(|m| m.name == name)
            .ok_or_else(|| {
                let served: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
                ApiFailure::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model {name:?} is not served here; this server serves {} (GET /v1/models)",
                    served.join(", ")
                ),
            )
            .at("model")
            .code("model_not_found")
            })
    }

    /// Admits `n` sequences, or says when to try again.
    fn admit(self: &Arc<Self>, n: usize) -> Result<Slots, ApiFailure> {
        let admitted = self
            .admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now + n <= self.queue).then_some(now + n)
            });
        match admitted {
            Ok(_) => Ok(Slots(Arc::clone(&self.admitted), n)),
            Err(now) => {
                // Seconds until as many finish as are admitted, at the rate they have been.
                let rate = self.finished.load(Ordering::SeqCst) as f64
                    / self.started.elapsed().as_secs_f64().max(1.0);
                let wait = if rate > 0.0 {
                    (now as f64 / rate).ceil() as u64
                } else {
                    1
                };
                let mut f = ApiFailure::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "the server's queue is full ({now} sequences admitted, --queue {}): try \
                         again shortly",
                        self.queue
                    ),
                )
                .code("rate_limit_exceeded");
                f.retry_after = Some(wait.clamp(1, 60));
                Err(f)
            }
        }
    }
}

/// Admitted sequences, given back as each one's sink is dropped (finished, or cancelled).
struct Slots(Arc<AtomicUsize>, usize);

impl Slots {
    fn one(&mut self) -> Slot {
        self.1 -= 1;
        Slot(Arc::clone(&self.0))
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::SeqCst);
    }
}

struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the engine says of one choice.
// A reply (with its log-probabilities) is sent once per choice, text once per token: boxing
// it would save the per-token messages' size for an allocation per reply, and they are few.
#[allow(clippy::large_enum_variant)]
enum Said {
    Text(usize, String),
    Done(usize, Result<Reply, RequestError>),
}

/// One choice's way back: its text and result go down the request's channel; when the
/// handler is gone (the client closed the connection), the channel is closed and the engine
/// drops the sequence.
struct ChannelSink {
    index: usize,
    tx: mpsc::UnboundedSender<Said>,
    finished: Arc<AtomicUsize>,
    _slot: Slot,
}

impl Sink for ChannelSink {
    fn text(&mut self, delta: &str) {
        let _ = self.tx.send(Said::Text(self.index, delta.to_string()));
    }

    fn done(self: Box<Self>, result: Result<Reply, RequestError>) {
        self.finished.fetch_add(1, Ordering::SeqCst);
        let _ = self.tx.send(Said::Done(self.index, result));
    }

    fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // Rendering and tokenizing a long conversation is work for the blocking pool.
    let started = {
        let app = Arc::clone(&app);
        tokio::task::spawn_blocking(move || start(&app, &headers, body)).await
    };
    match started {
        Ok(Ok(turn)) => {
            let id = completion_id();
            if turn.plan.stream {
                stream(app, turn, id).await
            } else {
                whole(app, turn, id).await
            }
        }
        Ok(Err(f)) => f.into_response(),
        Err(e) => ApiFailure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A request on its way: what was asked, of which model, each choice's key, and the channel
/// its choices come back on.
struct Turn {
    plan: ChatJob,
    model: usize,
    keys: Vec<RequestKey>,
    rx: mpsc::UnboundedReceiver<Said>,
}

/// Checks the request, admits it and hands its choices to the engine (or answers them from
/// the stores reused).
fn start(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Turn, ApiFailure> {
    let body = body.map_err(|e| ApiFailure::new(e.status(), e.body_text()))?;
    let mut value: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiFailure::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })?;
    let name = value
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ApiFailure::invalid(
                "model",
                "the request needs a model (GET /v1/models lists them)",
            )
        })?
        .to_string();
    let model = app.index(&name)?;
    let served = &app.models[model];
    if let Some(agent) = headers.get("x-throng-agent").and_then(|v| v.to_str().ok())
        && let Some(o) = value.as_object_mut()
        && !o.contains_key("user")
    {
        o.insert("user".into(), Value::String(agent.to_string()));
    }
    let default_seed = match value.get("seed") {
        Some(s) if !s.is_null() => 0,
        _ => app.seeds.next(&value),
    };
    let request: ChatRequest = ApiFailure::parse(value)?;
    let limits = Limits {
        max_choices: served.max_seqs,
        max_tokens: app.max_tokens,
    };
    let mut plan = request.plan(limits, default_seed, Form::of(&served.encoder))?;
    // Compiled here, on the grammars' own threads, so that the engine finds it ready and a
    // schema it cannot take is this request's 400, not the engine's trouble.
    if let Some(schema) = plan.requests.first().and_then(|r| r.json_schema.as_ref()) {
        served
            .encoder
            .prepare_schema(schema)
            .map_err(|e| ApiFailure::schema(plan.tools.schema_param(), e))?;
    }
    let tokens = app.prompt_tokens(served, &plan)?;
    let keys: Vec<RequestKey> = plan
        .requests
        .iter_mut()
        .map(|request| {
            request.prompt = Prompt::Tokens(tokens.clone());
            served.encoder.key(&tokens, request)
        })
        .collect();
    let mut slots = app.admit(plan.requests.len())?;
    if let Some(user) = plan.requests[0].retention_key.as_deref()
        && let Some(round) = app.rounds[model].called(user)
    {
        served.handle.expect_calls(round);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    for (index, request) in plan.requests.iter().enumerate() {
        let slot = slots.one();
        // A stored reply keeps no log-probabilities: one that asks for them is decoded.
        if let Some(reply) = (request.logits.logprobs.is_none())
            .then(|| app.reused(&keys[index]))
            .flatten()
        {
            drop(slot);
            let _ = tx.send(Said::Text(index, reply.text.clone()));
            let _ = tx.send(Said::Done(index, Ok(reply)));
            continue;
        }
        served.handle.send(
            request.clone(),
            Box::new(ChannelSink {
                index,
                tx: tx.clone(),
                finished: Arc::clone(&app.finished),
                _slot: slot,
            }),
        );
    }
    Ok(Turn {
        plan,
        model,
        keys,
        rx,
    })
}

impl App {
    /// The prompt's token ids: the conversation rendered, with each assistant turn that
    /// repeats a reply remembered here, word for word, as the ids the model wrote it in.
    fn prompt_tokens(&self, served: &Served, plan: &ChatJob) -> Result<Vec<u32>, ApiFailure> {
        let Some(Prompt::Messages(messages)) = plan.requests.first().map(|r| &r.prompt) else {
            return Err(ApiFailure::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "invariant: a chat request has messages",
            ));
        };
        // A remembered reply stands in only for exactly its own text: what this request
        // renders for the turn. A reply written otherwise (an answer generated as
        // `{"content": ...}` under `tools`, a call the client sends back as its parts) is
        // rendered from what the client sent, so that the prompt's text never depends on
        // what other clients were answered.
        let written: Vec<_> = plan
            .seen
            .iter()
            .filter_map(|(at, seen)| Some((*at, self.memo.get(seen)?)))
            .filter(|(at, w)| messages.get(*at).is_some_and(|m| m.content == w.text))
            .collect();
        let replies: Vec<(usize, &[u32])> = written
            .iter()
            .map(|(at, w)| (*at, w.ids.as_slice()))
            .collect();
        let spliced = served
            .encoder
            .spliced_tokens(messages, plan.template_tools.as_ref(), &replies)
            .map_err(ApiFailure::from)?;
        if spliced.spliced > 0 {
            self.spliced.fetch_add(1, Ordering::SeqCst);
        }
        Ok(spliced.tokens)
    }

    /// The reply a store reused holds for `key`, if any.
    fn reused(&self, key: &RequestKey) -> Option<Reply> {
        let reply = self
            .sources
            .as_ref()?
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lookup(key)?;
        self.reused.fetch_add(1, Ordering::SeqCst);
        Some(reply)
    }

    /// Keeps what a choice answered: remembered for the conversations that repeat it, and
    /// stored (with `--store`).
    fn keep(&self, turn_model: usize, key: &RequestKey, tools: &ToolMode, reply: &Reply) {
        let served = &self.models[turn_model];
        let seen = chat::seen_of(&served.name, reply, tools);
        self.memo.remember(seen, &served.encoder, reply);
        if let Some(recorder) = &self.recorder {
            recorder.keep(*key, reply);
        }
    }
}

fn completion_id() -> String {
    let bytes: [u8; 12] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Waits for every choice, then answers once.
async fn whole(app: Arc<App>, turn: Turn, id: String) -> Response {
    let Turn {
        plan,
        model,
        keys,
        mut rx,
    } = turn;
    let name = app.models[model].name.clone();
    let n = plan.requests.len();
    let mut done: Vec<Option<Reply>> = vec![None; n];
    let mut left = n;
    while left > 0 {
        match rx.recv().await {
            Some(Said::Done(i, Ok(reply))) => {
                app.keep(model, &keys[i], &plan.tools, &reply);
                done[i] = Some(reply);
                left -= 1;
            }
            Some(Said::Done(_, Err(e))) => return ApiFailure::from(e).into_response(),
            Some(Said::Text(..)) => {}
            None => return engine_gone().into_response(),
        }
    }
    let replies: Vec<Reply> = done.into_iter().flatten().collect();
    let choices: Vec<Value> = replies
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let tokenizer = app.models[model].encoder.tokenizer();
            chat::choice(i, r, &plan.tools, &id, tokenizer)
        })
        .collect();
    axum::Json(json!({
        "id": format!("chatcmpl-{id}"),
        "object": "chat.completion",
        "created": created(),
        "model": name,
        "choices": choices,
        "usage": Usage::of(&replies).json(),
    }))
    .into_response()
}

fn engine_gone() -> ApiFailure {
    ApiFailure::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine thread stopped: see the server's output, and restart it",
    )
}

/// Streams the choices as server-sent events: text as it is generated (a reply held to
/// tools is sent whole when it ends, as a call or as words), a last chunk per choice with
/// why it ended, the usage when asked for, then `[DONE]`. A request the engine refuses at
/// once is answered with its error instead of a stream.
async fn stream(app: Arc<App>, turn: Turn, id: String) -> Response {
    let Turn {
        plan,
        model,
        keys,
        mut rx,
    } = turn;
    let first = match rx.recv().await {
        Some(Said::Done(_, Err(e))) => return ApiFailure::from(e).into_response(),
        Some(said) => said,
        None => return engine_gone().into_response(),
    };
    let chunks = Chunks {
        id: format!("chatcmpl-{id}"),
        call_id: id,
        name: app.models[model].name.clone(),
        app,
        model,
        keys,
        created: created(),
        tools: plan.tools,
        include_usage: plan.include_usage,
        replies: vec![None; plan.requests.len()],
        started: vec![false; plan.requests.len()],
        shown: (0..plan.requests.len()).map(|_| Shown::default()).collect(),
        left: plan.requests.len(),
        failed: false,
    };
    let events = futures_util::stream::unfold(
        (Some(first), rx, chunks, false),
        |(mut pending, mut rx, mut chunks, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let said = match pending.take() {
                    Some(s) => Some(s),
                    None if chunks.left == 0 || chunks.failed => None,
                    None => rx.recv().await,
                };
                let Some(said) = said else {
                    // Every choice ended (or one failed, or the engine went): the usage, then
                    // the end.
                    let mut out = chunks.end();
                    out.push(Event::default().data("[DONE]"));
                    return Some((out, (None, rx, chunks, true)));
                };
                let out = chunks.on(said);
                if !out.is_empty() {
                    return Some((out, (None, rx, chunks, false)));
                }
            }
        },
    );
    let events = futures_util::StreamExt::flat_map(events, |batch| {
        futures_util::stream::iter(batch.into_iter().map(Ok::<_, Infallible>))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

/// The chunks of a streamed completion.
struct Chunks {
    id: String,
    call_id: String,
    name: String,
    app: Arc<App>,
    model: usize,
    keys: Vec<RequestKey>,
    created: u64,
    tools: ToolMode,
    include_usage: bool,
    replies: Vec<Option<Reply>>,
    started: Vec<bool>,
    /// What each choice held to tools has shown of its reply.
    shown: Vec<Shown>,
    left: usize,
    failed: bool,
}

impl Chunks {
    fn chunk(&self, choices: Value) -> Event {
        Event::default().data(self.body(choices).to_string())
    }

    fn body(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.name,
            "choices": choices,
        })
    }

    fn delta(&self, index: usize, delta: Value, finish: Option<&str>) -> Event {
        self.chunk(
            json!([{"index": index, "delta": delta, "finish_reason": finish, "logprobs": null}]),
        )
    }

    /// The chunk of a piece of a reply held to tools (OpenAI's form: a call's first chunk
    /// carries its id, type and name, the next ones pieces of its arguments).
    fn shown_delta(&self, index: usize, delta: Delta) -> Event {
        let call =
            |function: Value| json!({"tool_calls": [json!({"index": 0, "function": function})]});
        let delta = match delta {
            Delta::Call(name) => json!({"tool_calls": [{
                "index": 0,
                "id": format!("call_{}_{index}", self.call_id),
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            Delta::Arguments(arguments) => call(json!({"arguments": arguments})),
            Delta::Content(words) => json!({"content": words}),
        };
        self.delta(index, delta, None)
    }

    /// The role comes first in each choice's first chunk.
    fn opening(&mut self, index: usize, out: &mut Vec<Event>) {
        if !self.started[index] {
            self.started[index] = true;
            out.push(self.delta(index, json!({"role": "assistant", "content": ""}), None));
        }
    }

    fn on(&mut self, said: Said) -> Vec<Event> {
        let mut out = Vec::new();
        match said {
            Said::Text(i, text) => {
                self.opening(i, &mut out);
                if self.tools.is_none() {
                    if !text.is_empty() {
                        out.push(self.delta(i, json!({"content": text}), None));
                    }
                } else {
                    let deltas = self.shown[i].on_text(&text, &self.tools);
                    out.extend(deltas.into_iter().map(|d| self.shown_delta(i, d)));
                }
            }
            Said::Done(i, Ok(reply)) => {
                self.app
                    .keep(self.model, &self.keys[i], &self.tools, &reply);
                self.opening(i, &mut out);
                let tokenizer = self.app.models[self.model].encoder.tokenizer();
                let choice = chat::choice(i, &reply, &self.tools, &self.call_id, tokenizer);
                let message = &choice["message"];
                let finish = choice["finish_reason"]
                    .as_str()
                    .unwrap_or("stop")
                    .to_string();
                if !self.tools.is_none() {
                    let function = &message["tool_calls"][0]["function"];
                    let call = function["name"]
                        .as_str()
                        .zip(function["arguments"].as_str());
                    let deltas = self.shown[i].on_end(call, message["content"].as_str());
                    out.extend(
                        deltas
                            .into_iter()
                            .filter(|d| !matches!(d, Delta::Arguments(a) | Delta::Content(a) if a.is_empty()))
                            .map(|d| self.shown_delta(i, d)),
                    );
                }
                // The choice's log-probabilities, when asked, come whole with its last chunk.
                out.push(
                    self.chunk(json!([{"index": i, "delta": {}, "finish_reason": finish,
                    "logprobs": choice["logprobs"]}])),
                );
                self.replies[i] = Some(reply);
                self.left -= 1;
            }
            Said::Done(_, Err(e)) => {
                self.failed = true;
                out.push(Event::default().data(ApiFailure::from(e).body().to_string()));
            }
        }
        out
    }

    fn end(&mut self) -> Vec<Event> {
        if self.left > 0 && !self.failed {
            // The channel closed with choices unfinished: the engine is gone.
            return vec![Event::default().data(engine_gone().body().to_string())];
        }
        if !self.include_usage || self.failed {
            return Vec::new();
        }
        let replies: Vec<Reply> = self.replies.iter().flatten().cloned().collect();
        let mut last = self.body(json!([]));
        last["usage"] = Usage::of(&replies).json();
        vec![Event::default().data(last.to_string())]
    }
}
