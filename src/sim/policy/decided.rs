//! A decision and how it came about: the model's trace of it, and what it adds to a step's
//! counters.

use super::turn::Transcript;
use crate::record::Counters;
use crate::record::store::StoredReply;
use serde_json::Value;

/// What the model did for one decision, for the decisions log.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LlmTrace {
    pub prompt_hash: String,
    /// The whole prompt, message by message, for a turn the decisions log keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<Transcript>,
    pub text: Option<String>,
    pub value: Option<Value>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    pub latency_ms: Option<f64>,
    /// The key of the request's complete input, when the run keeps its replies: with the
    /// reply's text, token counts and `stopped`, what the run's decision store keeps of it.
    /// It crosses ranks with the decision, so that rank 0 keeps every rank's replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_key: Option<crate::engine::RequestKey>,
    /// Whether the reply ended at a stop (else at its token limit).
    #[serde(default)]
    pub stopped: bool,
}

impl LlmTrace {
    /// What the decision store keeps of the reply, under its request's key: `None` for a
    /// request the engine refused or whose input has no key.
    pub(crate) fn stored_reply(&self) -> Option<(crate::engine::RequestKey, StoredReply)> {
        Some((
            self.request_key?,
            StoredReply {
                text: self.text.clone()?,
                stopped: self.stopped,
                prompt_tokens: self.prompt_tokens as u32,
                generated_tokens: self.generated_tokens as u32,
                token_ids: Vec::new(),
            },
        ))
    }
}

/// A decision and how it came about. A scripted decision carries nothing on the heap, and
/// nothing but the decision crosses between ranks.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Decided<D> {
    pub decision: D,
    /// Changes made to fit the rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamps: Vec<String>,
    /// Why the decision fell back to "no change", if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<Box<LlmTrace>>,
}

impl<D> Decided<D> {
    pub fn plain(decision: D) -> Self {
        Self {
            decision,
            clamps: Vec::new(),
            fallback: None,
            llm: None,
        }
    }
}

/// Adds what `decided` says to the step's counters.
pub fn count<D>(counters: &mut Counters, decided: &Decided<D>) {
    counters.decisions += 1;
    counters.fallbacks += decided.fallback.is_some() as u64;
    counters.clamped += (!decided.clamps.is_empty()) as u64;
    if let Some(t) = &decided.llm {
        counters.prompt_tokens += t.prompt_tokens as u64;
        counters.cached_tokens += t.cached_tokens as u64;
        counters.generated_tokens += t.generated_tokens as u64;
    }
}
