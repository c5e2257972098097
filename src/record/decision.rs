//! One line of `decisions.jsonl`: who decided what, when, and how the model got there.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the decisions log keeps of a decision, beside who and when.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecisionLog {
    pub role: String,
    /// The policy that made it, in runs where groups of agents use different ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The model that made it, in runs where agents ask several models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// SHA-256 (first 16 hex digits) of the rendered prompt, to group identical prompts.
    pub prompt_hash: Option<String>,
    /// The model's raw reply.
    pub text: Option<String>,
    /// The reply as parsed JSON.
    pub value: Option<Value>,
    /// Changes made to fit the rules.
    pub clamps: Vec<String>,
    /// Why the decision fell back to "no change", if it did.
    pub fallback: Option<String>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    pub latency_ms: Option<f64>,
}

/// One decision in `decisions.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub step: usize,
    pub agent: usize,
    #[serde(flatten)]
    pub log: DecisionLog,
    /// The decision as applied (after clamps, or the fallback).
    pub decision: Value,
}
