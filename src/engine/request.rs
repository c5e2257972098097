//! What callers hand the engine and what they get back.

use super::chat::Message;
use super::constraint::{Schema, SchemaError};
use super::logit_rules::{LogitRules, TokenLogprob};
use super::sampler::SamplingParams;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The input of a request: a conversation (rendered with the model's chat template), raw
/// text, or token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    Messages(Vec<Message>),
    Text(String),
    Tokens(Vec<u32>),
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub prompt: Prompt,
    /// A JSON schema the reply must satisfy (constrained decoding).
    pub json_schema: Option<Schema>,
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Strings that end the reply (not included in it). A reply constrained by `json_schema`
    /// ignores them: cut, its JSON would not parse, so the grammar alone ends it.
    pub stop: Vec<String>,
    /// A bias on chosen tokens, penalties on repeated ones, and whether to report
    /// log-probabilities.
    pub logits: LogitRules,
    /// Opaque label returned with the response (agent id, say).
    pub tag: Option<String>,
    /// Who is calling, for KV retention (an agent's history key, say): when the request
    /// finishes, the cached blocks of its prompt and reply are kept for this key's next call,
    /// as [`crate::engine::Engine::expect_calls`] announces it.
    pub retention_key: Option<String>,
}

impl Request {
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            json_schema: None,
            sampling: SamplingParams::default(),
            max_tokens: 256,
            stop: Vec::new(),
            logits: LogitRules::default(),
            tag: None,
            retention_key: None,
        }
    }

    pub fn chat(messages: Vec<Message>) -> Self {
        Self::new(Prompt::Messages(messages))
    }

    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    pub fn with_sampling(mut self, sampling: SamplingParams) -> Self {
        self.sampling = sampling;
        self
    }

    /// Build a [`Schema`] once and pass clones of it when many requests share one.
    pub fn with_schema(mut self, schema: impl Into<Schema>) -> Self {
        self.json_schema = Some(schema.into());
        self
    }

    pub(crate) fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Keys the request for KV retention (see [`Request::retention_key`]).
    pub fn with_retention_key(mut self, key: impl Into<String>) -> Self {
        self.retention_key = Some(key.into());
        self
    }
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-turn token, a stop string, or the grammar's end.
    Stop,
    /// `max_tokens` or the context ran out first.
    Length,
}

/// Where a request's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Waiting before its first forward pass.
    #[serde(with = "secs")]
    pub queue: Duration,
    /// From its first forward pass to its first generated token.
    #[serde(with = "secs")]
    pub prefill: Duration,
    /// From its first generated token to its last.
    #[serde(with = "secs")]
    pub decode: Duration,
}

mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        f64::deserialize(d).map(Duration::from_secs_f64)
    }
}

/// A finished request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub text: String,
    /// The parsed reply, for requests with a JSON schema that finished with `Stop`.
    pub value: Option<serde_json::Value>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Generated ids, end-of-turn token excluded.
    #[serde(skip)]
    pub token_ids: Vec<u32>,
    pub timings: Timings,
    pub tag: Option<String>,
    /// Each generated token's log-probability, when the request asked for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// Why a request was refused; the other requests of the same call go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request has no messages: a chat request needs at least one message")]
    EmptyMessages,
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("message role `{role}` is not one the model's chat template knows ({known})")]
    UnknownRole { role: String, known: String },
    #[error(
        "the prompt is {tokens} tokens, the context holds {limit}: shorten it (fewer history turns, \
         a shorter system prompt) or use a model with a longer context"
    )]
    PromptTooLong { tokens: usize, limit: usize },
    #[error(
        "the prompt's text is {bytes} bytes, at least {tokens} tokens, and the context holds \
         {limit}: shorten it (fewer history turns, a shorter message) or use a model with a \
         longer context"
    )]
    PromptTextTooLong {
        bytes: usize,
        tokens: usize,
        limit: usize,
    },
    #[error(
        "the prompt needs {needed} KV blocks, the cache holds {available}: raise the KV memory \
         budget (--kv-memory) or shorten the prompt"
    )]
    PromptExceedsCache { needed: usize, available: usize },
    #[error("the JSON schema cannot be used: {0}")]
    InvalidSchema(#[from] SchemaError),
    #[error("invalid sampling settings: {0}")]
    InvalidSampling(String),
    #[error("{0}")]
    Template(String),
    #[error("{0}")]
    Tokenizer(String),
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("the engine stopped before finishing the request: {0}")]
    Engine(String),
}
