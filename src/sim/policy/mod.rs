//! How agents decide: `llm` (the engine, every agent of every cell of a step in one
//! continuous batch) or `scripted` (the scenario's rules of thumb), behind one trait, and
//! which agents use which when a config mixes them.

mod assign;
mod llm;
mod scripted;

pub use crate::reuse::Reuse;
pub use assign::{assign, policies_of, routes};
pub use llm::{Llm, PromptSizes, template_name};
pub use scripted::Scripted;

use super::config::LlmConfig;
use super::population::Population;
use super::prompt::PromptError;
use super::scenario::{CellInfo, Scenario};
use crate::engine::RequestError;
use crate::record::Counters;
use crate::record::store::StoredReply;
use serde_json::Value;
use std::time::Duration;

/// One cell of the step being decided.
pub struct CellView<'a, S: Scenario> {
    pub scenario: &'a S,
    pub world: &'a S::World,
    pub population: &'a Population,
    pub info: &'a CellInfo,
    /// The model and sampling of the cell's arm.
    pub llm: &'a LlmConfig,
    /// Per route of the cell's arm (see [`crate::sim::experiment::Experiment::llm_of`]):
    /// the arm's own, then each policy group's.
    pub llms: &'a [LlmConfig],
    /// Each agent's route; `None`: every agent is on route 0.
    pub route: Option<&'a [u8]>,
    pub step: usize,
}

impl<S: Scenario> CellView<'_, S> {
    /// The model and sampling agent `agent` decides with: its policy group's, if the group
    /// names its own, else its arm's.
    pub fn llm_of(&self, agent: usize) -> &LlmConfig {
        match self.route {
            Some(route) => &self.llms[route[agent] as usize],
            None => self.llm,
        }
    }
}

/// An agent whose turn it is: small, so that a step of a million agents is a small list.
#[derive(Debug, Clone, Copy)]
pub struct AgentTurn {
    /// Index into the cells of the step.
    pub cell: usize,
    pub agent: usize,
    /// Seeds the agent's draws this step (its sampling, or the scripted rules' noise).
    pub seed: u64,
    /// Whether the decisions log keeps this turn: a model then keeps its whole prompt too.
    pub logged: bool,
}

/// The whole prompt of a turn the decisions log keeps, for a reader: each message under its
/// role. The system message is shared with the other turns of its cell rather than copied, so
/// that a step whose every turn is logged holds each turn's own messages only (the system
/// message is most of a prompt).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Transcript {
    system: std::sync::Arc<str>,
    /// The turn's own messages, already under their roles.
    own: String,
}

impl Transcript {
    pub fn new(system: std::sync::Arc<str>, own: &[crate::engine::Message]) -> Self {
        let mut text = String::new();
        for m in own {
            text.push_str(&format!("\n[{}]\n{}\n", m.role, m.content));
        }
        Self { system, own: text }
    }

    /// The prompt as one text.
    pub fn text(&self) -> String {
        format!("[system]\n{}\n{}", self.system, self.own)
    }
}

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
    pub fn stored_reply(&self) -> Option<(crate::engine::RequestKey, StoredReply)> {
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

/// Where a policy's time went during a step, and the most KV memory it held.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PolicyTimes {
    /// Preparing prompts: rendering templates, and tokenizing.
    pub template: Duration,
    pub tokenize: Duration,
    /// In the engine: forward passes, and the constrained decoder's token masks.
    pub forward: Duration,
    pub masks: Duration,
    /// The most KV-cache memory in use at once.
    pub kv_peak_bytes: u64,
    /// Decisions whose reply came from an earlier run's store (`--reuse`), which took no time
    /// in the engine.
    pub reused: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("cannot restore the policy from the checkpoint: {0}")]
    Checkpoint(String),
    #[error("the engine: {0}")]
    Engine(#[from] RequestError),
    #[error(
        "no engine here serves model `{0}`: load every model the config names (a rank loads \
         those of its agents)"
    )]
    NoModel(String),
    #[error("the decision store: {0}")]
    Store(#[from] crate::record::RecordError),
    /// A scripted decision the scenario's check refuses (see
    /// [`Scenario::check_scripted`]); `step` is 1-based, as the progress shows it.
    #[error(
        "the scripted decision of agent {agent} at step {step} (arm `{arm}`, replicate \
         {replicate}) is not one the turn allows: {problem}; fix the scenario's `scripted`"
    )]
    Scripted {
        agent: usize,
        step: usize,
        arm: String,
        replicate: usize,
        problem: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub trait Policy<S: Scenario> {
    /// Decisions for `turns`, in order; `done(n)` reports n more decided as they finish.
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError>;
    /// Where the time went since the last call.
    fn take_times(&mut self) -> PolicyTimes {
        PolicyTimes::default()
    }
    /// State to carry over a restart (chat histories), as bytes.
    fn checkpoint(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&mut self, _state: &[u8]) -> Result<(), PolicyError> {
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Message;

    #[test]
    fn a_transcript_reads_as_the_prompts_messages_under_their_roles() {
        let system: std::sync::Arc<str> = "Guess 2/3 of the average.".into();
        let own = [
            Message::user("Round 1?"),
            Message::assistant("{\"guess\": 33}"),
            Message::user("Round 2?"),
        ];
        let transcript = Transcript::new(system.clone(), &own);
        assert_eq!(
            transcript.text(),
            "[system]\nGuess 2/3 of the average.\n\n[user]\nRound 1?\n\n[assistant]\n\
             {\"guess\": 33}\n\n[user]\nRound 2?\n"
        );
        // Turns of a cell share its system message rather than copy it.
        assert!(std::sync::Arc::ptr_eq(&transcript.system, &system));
        // A transcript crosses ranks whole.
        let bytes = rmp_serde::to_vec_named(&transcript).unwrap();
        let back: Transcript = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back.text(), transcript.text());
    }
}
