//! `POST /v1/chat/completions`: the body OpenAI's clients send, checked field by field, turned
//! into one engine request per choice, and the replies turned back into OpenAI's reply.
//!
//! A field throng does not know is refused (as OpenAI refuses one), and a field it knows but
//! does not implement passes only at the value that changes nothing (`frequency_penalty: 0`,
//! `logprobs: false`): a setting silently ignored would be a reply other than the one asked for.

use super::error::ApiFailure;
use super::memo::{self, Seen};
use super::schema;
use super::tools::{self, ToolMode};
use crate::engine::{
    FinishReason, LogitRules, MAX_TOP_LOGPROBS, Message, Request, Response, SamplingParams,
    Tokenizer,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The body of a chat completion request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatRequest {
    /// The model asked (read from the body before too, to choose the engine).
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI's: keep only the `k` most likely tokens (as vLLM and llama.cpp take it).
    pub top_k: Option<usize>,
    pub seed: Option<i64>,
    pub n: Option<usize>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub response_format: Option<ResponseFormat>,
    pub tools: Option<Vec<tools::Tool>>,
    pub tool_choice: Option<tools::ToolChoice>,
    /// One call per reply is what throng answers; either value is accepted.
    #[allow(dead_code)]
    pub parallel_tool_calls: Option<bool>,
    /// Who is asking: the key under which the engine keeps this caller's history cached for
    /// its next call (the `X-Throng-Agent` header says the same).
    pub user: Option<String>,
    /// OpenAI's newer name for a cache key: the retention key where `user` is not given.
    pub prompt_cache_key: Option<String>,
    /// OpenAI's abuse-tracking id: accepted, not used.
    #[allow(dead_code)]
    pub safety_identifier: Option<String>,
    /// The legacy form of `tools` and `tool_choice`: refused, naming them.
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<Map<String, Value>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// For models that reason before they answer, which throng's do not: accepted (Concordia
    /// sends them) at any of OpenAI's values, and change nothing.
    pub reasoning_effort: Option<String>,
    pub verbosity: Option<String>,
    /// OpenAI's own bookkeeping, which changes nothing of a reply: accepted, not used.
    #[allow(dead_code)]
    pub store: Option<bool>,
    #[allow(dead_code)]
    pub metadata: Option<Value>,
    #[allow(dead_code)]
    pub service_tier: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `name`, `description`: OpenAI's labels; `strict`: every reply is held.
pub(crate) struct JsonSchemaFormat {
    pub name: String,
    pub description: Option<String>,
    pub schema: Option<Value>,
    /// Throng holds every reply to the schema, strict or not.
    pub strict: Option<bool>,
}

/// One message of the conversation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<tools::ToolCall>>,
    pub tool_call_id: Option<String>,
    /// Sent back by clients that echo an assistant reply whole; only `null` carries nothing.
    pub refusal: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

/// What the server answers with, decided from the request before any engine work.
#[derive(Debug)]
pub struct ChatJob {
    /// One per choice, each with the conversation as messages.
    pub requests: Vec<Request>,
    /// The assistant messages of the conversation that may repeat a reply of this server:
    /// their index among the messages, and what a client saw of them (see [`super::memo`]).
    pub seen: SeenTurns,
    pub stream: bool,
    pub include_usage: bool,
    pub tools: ToolMode,
    /// The tools as the chat template lists them, for a template with a tool syntax of its
    /// own (see [`tools`]).
    pub template_tools: Option<Value>,
}

/// Limits the server sets on every request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most `n` (choices) one request may ask for.
    pub max_choices: usize,
    /// The most tokens a reply may have, and what one without `max_tokens` gets.
    pub max_tokens: usize,
}

impl ChatRequest {
    /// The engine requests of this body, one per choice; `seed` is the request's seed when it
    /// gives none (see [`super::seeds`]); calls written in `form`, the served model's.
    pub fn plan(
        self,
        limits: Limits,
        default_seed: u64,
        form: tools::Form,
    ) -> Result<ChatJob, ApiFailure> {
        self.refuse_legacy_functions()?;
        let logits = self.logit_rules()?;
        one_of(
            "reasoning_effort",
            self.reasoning_effort.as_deref(),
            &["none", "minimal", "low", "medium", "high"],
        )?;
        one_of(
            "verbosity",
            self.verbosity.as_deref(),
            &["low", "medium", "high"],
        )?;
        let n = self.choices(limits)?;
        let max_tokens = self.max_tokens(limits)?;
        let (temperature, top_p) = self.sampling_bounds()?;
        let stop = self.stop_strings()?;
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiFailure::invalid(
                "stream_options",
                "stream_options is only for stream: true",
            ));
        }
        let response = response_schema(self.response_format)?;
        let tools = tools::mode(self.tools, self.tool_choice, response.as_ref(), form)?;
        let (messages, seen) = prompt_messages(&self.model, self.messages, &tools)?;
        let schema = tools.schema(response);
        let seed = self.seed.map_or(default_seed, |s| s as u64);
        let retention_key = self
            .user
            .filter(|u| !u.is_empty())
            .or(self.prompt_cache_key.filter(|k| !k.is_empty()));
        let requests = (0..n)
            .map(|i| Request {
                prompt: crate::engine::Prompt::Messages(messages.clone()),
                json_schema: schema.clone(),
                sampling: SamplingParams {
                    temperature,
                    top_k: self.top_k,
                    top_p,
                    seed: if n == 1 {
                        seed
                    } else {
                        crate::seed::derive(seed, &[i as u64])
                    },
                },
                max_tokens,
                stop: stop.clone(),
                logits: logits.clone(),
                tag: None,
                retention_key: retention_key.clone(),
            })
            .collect();
        Ok(ChatJob {
            requests,
            seen,
            stream,
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            template_tools: tools.template_tools(),
            tools,
        })
    }

    fn refuse_legacy_functions(&self) -> Result<(), ApiFailure> {
        for (field, given) in [
            ("functions", self.functions.is_some()),
            ("function_call", self.function_call.is_some()),
        ] {
            if given {
                return Err(ApiFailure::invalid(
                    field,
                    format!(
                        "`{field}` is the legacy form of tools: send each function as \
                         `tools: [{{\"type\": \"function\", \"function\": {{...}}}}]` and \
                         the choice as `tool_choice`"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn choices(&self, limits: Limits) -> Result<usize, ApiFailure> {
        let n = self.n.unwrap_or(1);
        if n == 0 || n > limits.max_choices {
            return Err(ApiFailure::invalid(
                "n",
                format!(
                    "n must be 1 to {} (the sequences this server runs at once)",
                    limits.max_choices
                ),
            ));
        }
        Ok(n)
    }

    fn max_tokens(&self, limits: Limits) -> Result<usize, ApiFailure> {
        let max_tokens = match (self.max_tokens, self.max_completion_tokens) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiFailure::invalid(
                    "max_completion_tokens",
                    format!("max_tokens ({a}) and max_completion_tokens ({b}) differ: give one"),
                ));
            }
            (Some(0), _) | (_, Some(0)) => {
                return Err(ApiFailure::invalid(
                    "max_tokens",
                    "max_tokens must be at least 1",
                ));
            }
            (a, b) => a.or(b).unwrap_or(limits.max_tokens),
        };
        // An upper bound: one above the server's (Concordia asks 5000 for a short choice) is
        // held to the server's, and a reply that reaches it ends with "length".
        Ok(max_tokens.min(limits.max_tokens))
    }

    /// `temperature` and `top_p`, defaulted and checked; `top_k` checked.
    fn sampling_bounds(&self) -> Result<(f32, f32), ApiFailure> {
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiFailure::invalid(
                "temperature",
                "temperature must be between 0 and 2",
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiFailure::invalid(
                "top_p",
                "top_p must be above 0 and at most 1",
            ));
        }
        if self.top_k == Some(0) {
            return Err(ApiFailure::invalid(
                "top_k",
                "top_k must be at least 1 (or left out)",
            ));
        }
        Ok((temperature, top_p))
    }

    fn stop_strings(&self) -> Result<Vec<String>, ApiFailure> {
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return Err(ApiFailure::invalid(
                "stop",
                "stop takes up to 4 strings, none empty",
            ));
        }
        Ok(stop)
    }
}

/// The schema `response_format` asks of the reply, checked; `None` for free text.
fn response_schema(format: Option<ResponseFormat>) -> Result<Option<Value>, ApiFailure> {
    Ok(match format {
        None | Some(ResponseFormat::Text) => None,
        Some(ResponseFormat::JsonObject) => Some(json!({"type": "object"})),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            // OpenAI refuses a json_schema format without its schema; answering it as
            // "any JSON" gave a bare number to a client that asked for an object.
            let schema = json_schema.schema.ok_or_else(|| {
                ApiFailure::invalid(
                    "response_format.json_schema.schema",
                    "response_format.json_schema needs its `schema`: the JSON schema the \
                     reply must satisfy (or use {\"type\": \"json_object\"} for any object)",
                )
            })?;
            schema::check(&schema).map_err(|e| {
                ApiFailure::invalid(
                    "response_format",
                    format!("response_format.json_schema.schema: {e}"),
                )
                .code("unsupported_schema_keyword")
            })?;
            Some(schema)
        }
    })
}

impl ChatRequest {
    /// The bias, penalties and log-probabilities asked, each checked as OpenAI bounds it (the
    /// engine checks the token ids against its vocabulary).
    fn logit_rules(&self) -> Result<LogitRules, ApiFailure> {
        let penalty = |field: &str, p: Option<f32>| match p {
            Some(p) if !(-2.0..=2.0).contains(&p) => Err(ApiFailure::invalid(
                field,
                format!("{field} must be between -2 and 2, got {p}"),
            )),
            p => Ok(p.unwrap_or(0.0)),
        };
        let mut bias = Vec::new();
        for (token, value) in self.logit_bias.iter().flatten() {
            let at = format!("logit_bias.{token}");
            let id: u32 = token.parse().map_err(|_| {
                ApiFailure::invalid(&at, "logit_bias is keyed by token ids: `{\"1234\": -100}`")
            })?;
            let b = value
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    ApiFailure::invalid(&at, format!("a bias is between -100 and 100, got {value}"))
                })?;
            bias.push((id, b as f32));
        }
        // In token order, so that the same biases key the same request however they were sent.
        bias.sort_by_key(|&(t, _)| t);
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), top) => {
                let top = top.unwrap_or(0) as usize;
                if top > MAX_TOP_LOGPROBS {
                    return Err(ApiFailure::invalid(
                        "top_logprobs",
                        format!("top_logprobs is 0 to {MAX_TOP_LOGPROBS}, got {top}"),
                    ));
                }
                Some(top)
            }
            (_, Some(top)) if top > 0 => {
                return Err(ApiFailure::invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ));
            }
            _ => None,
        };
        Ok(LogitRules {
            bias,
            frequency_penalty: penalty("frequency_penalty", self.frequency_penalty)?,
            presence_penalty: penalty("presence_penalty", self.presence_penalty)?,
            logprobs,
        })
    }
}

fn one_of(field: &str, given: Option<&str>, values: &[&str]) -> Result<(), ApiFailure> {
    match given {
        Some(v) if !values.contains(&v) => Err(ApiFailure::invalid(
            field,
            format!("{field} {v:?}: use one of {}", values.join(", ")),
        )),
        _ => Ok(()),
    }
}

/// Assistant turns by their index among the messages, with what a client saw of each.
type SeenTurns = Vec<(usize, Seen)>;

/// The conversation as the engine renders it: text content, `developer` as `system`, and tool
/// calls and results for the template to write in its own syntax, or written out as text
/// (see [`tools`]); with what a client saw of each assistant turn that may be a reply of
/// `model`'s.
fn prompt_messages(
    model: &str,
    messages: Vec<ChatMessage>,
    tools: &ToolMode,
) -> Result<(Vec<Message>, SeenTurns), ApiFailure> {
    if messages.is_empty() {
        return Err(ApiFailure::invalid(
            "messages",
            "messages is empty: give at least one",
        ));
    }
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut seen = Vec::new();
    let mut call_names: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        if m.refusal.as_ref().is_some_and(|r| !r.is_null()) {
            return Err(ApiFailure::invalid(
                at("refusal"),
                "a refusal cannot be sent back as history",
            ));
        }
        let text = content_text(i, m.content)?;
        match m.role.as_str() {
            "system" | "developer" => out.push(Message::system(text)),
            "user" => out.push(Message::user(text)),
            "assistant" => {
                let calls = m.tool_calls.unwrap_or_default();
                for call in &calls {
                    call_names.push((call.id.clone(), call.function.name.clone()));
                }
                match calls.as_slice() {
                    [] => seen.push((out.len(), memo::seen_text(model, &text))),
                    [call] if text.is_empty() => seen.push((
                        out.len(),
                        memo::seen_call(model, &call.function.name, &call.function.arguments),
                    )),
                    _ => {}
                }
                out.push(tools.assistant(text, &calls, &at("tool_calls"))?);
            }
            "tool" => {
                let id = m.tool_call_id.ok_or_else(|| {
                    ApiFailure::invalid(
                        at("tool_call_id"),
                        "a tool message needs the tool_call_id it answers",
                    )
                })?;
                let name = call_names
                    .iter()
                    .rev()
                    .find(|(c, _)| *c == id)
                    .map(|(_, n)| n.clone())
                    .or(m.name)
                    .ok_or_else(|| {
                        ApiFailure::invalid(
                            at("tool_call_id"),
                            format!("no assistant message before it made the tool call {id:?}"),
                        )
                    })?;
                out.push(tools.result(&name, &id, text));
            }
            other => {
                return Err(ApiFailure::invalid(
                    at("role"),
                    format!("role {other:?}: use system, developer, user, assistant or tool"),
                ));
            }
        }
    }
    if let Some(instructions) = tools.instructions() {
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{instructions}", first.content);
            }
            _ => {
                out.insert(0, Message::system(instructions));
                for (at, _) in &mut seen {
                    *at += 1;
                }
            }
        }
    }
    Ok((out, seen))
}

/// The text of message `i`'s content: a string, or text parts joined (throng's models read
/// nothing else).
fn content_text(i: usize, content: Option<Content>) -> Result<String, ApiFailure> {
    let text = match content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiFailure::invalid(
                            format!("messages[{i}].content[{j}].type"),
                            format!(
                                "content part {:?}: throng's models read text only; send text parts",
                                kind.unwrap_or("(none)")
                            ),
                        ));
                    }
                }
            }
            text
        }
    };
    Ok(text)
}

/// What a client sees of `response`, a reply of `model` held to `tools`.
pub(crate) fn seen_of(model: &str, response: &Response, tools: &ToolMode) -> Seen {
    match tools.reply(response, "", 0) {
        Some(call) => memo::seen_call(
            model,
            call["function"]["name"].as_str().unwrap_or_default(),
            call["function"]["arguments"].as_str().unwrap_or_default(),
        ),
        None => memo::seen_text(model, &tools.content(response).unwrap_or_default()),
    }
}

/// How long a reply is, for `usage`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    /// The prompt once (every choice has the same), the replies together.
    pub fn of(responses: &[Response]) -> Self {
        Usage {
            prompt_tokens: responses.first().map_or(0, |r| r.prompt_tokens),
            cached_tokens: responses.first().map_or(0, |r| r.cached_tokens),
            completion_tokens: responses.iter().map(|r| r.generated_tokens).sum(),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// One choice of the reply: its message (text or a tool call), why it ended, and its
/// tokens' log-probabilities when asked (read with `tokenizer`).
pub fn choice(
    index: usize,
    response: &Response,
    tools: &ToolMode,
    id: &str,
    tokenizer: &Tokenizer,
) -> Value {
    let (message, finish) = match tools.reply(response, id, index) {
        Some(call) => (
            json!({"role": "assistant", "content": null, "tool_calls": [call]}),
            "tool_calls",
        ),
        None => (
            json!({"role": "assistant", "content": tools.content(response)}),
            finish_reason(response.finish_reason),
        ),
    };
    let logprobs = response
        .logprobs
        .as_ref()
        .map_or(Value::Null, |l| logprobs(l, tokenizer));
    json!({"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs})
}

/// OpenAI's `logprobs` of a choice: each token's text, log-probability, UTF-8 bytes and
/// likeliest alternatives. A log-probability of minus infinity (a token the grammar did not
/// allow) is written -9999, as OpenAI writes what it does not report.
fn logprobs(entries: &[crate::engine::TokenLogprob], tokenizer: &Tokenizer) -> Value {
    let token = |id: u32, logprob: f32| {
        let text = tokenizer.decode(&[id], false).unwrap_or_default();
        let logprob = if logprob.is_finite() {
            logprob
        } else {
            -9999.0
        };
        json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
    };
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut t = token(e.token, e.logprob);
            t["top_logprobs"] = e.top.iter().map(|&(id, l)| token(id, l)).collect();
            t
        })
        .collect();
    json!({"content": content, "refusal": null})
}

pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}
