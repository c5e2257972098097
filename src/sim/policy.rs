//! How agents decide: `llm` (the engine, every agent of every cell of a step in one
//! continuous batch) or `scripted` (the scenario's rules of thumb). One trait, so that the
//! runner does not care which.

use super::config::LlmConfig;
use super::prompt::{PromptBook, PromptError};
use super::scenario::{CellInfo, Scenario};
use crate::engine::{Engine, FinishReason, Message, Request, SamplingParams};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// One cell of the step being decided.
pub struct CellView<'a, S: Scenario> {
    pub scenario: &'a S,
    pub world: &'a S::World,
    pub info: &'a CellInfo,
    pub step: usize,
}

/// An agent whose turn it is: small, so that a step of a million agents is a small list.
#[derive(Debug, Clone, Copy)]
pub struct AgentTurn {
    /// Index into the cells of the step.
    pub cell: usize,
    pub agent: usize,
    /// Seeds the agent's draws this step (its sampling, or the scripted rules' noise).
    pub seed: u64,
}

/// What the decisions log keeps of a decision, beside who and when.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecisionLog {
    pub role: String,
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

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("cannot restore the policy from the checkpoint: {0}")]
    Checkpoint(String),
}

pub trait Policy<S: Scenario> {
    /// Decisions for `turns`, in order.
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
    ) -> Result<Vec<(S::Decision, DecisionLog)>, PolicyError>;
    /// State to carry over a restart (chat histories).
    fn checkpoint(&self) -> Value {
        Value::Null
    }
    fn restore(&mut self, _state: Value) -> Result<(), PolicyError> {
        Ok(())
    }
}

/// The scenario's deterministic rules.
pub struct Scripted;

impl<S: Scenario> Policy<S> for Scripted {
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
    ) -> Result<Vec<(S::Decision, DecisionLog)>, PolicyError> {
        Ok(turns
            .iter()
            .map(|t| {
                let cell = &cells[t.cell];
                let mut rng = ChaCha8Rng::seed_from_u64(t.seed);
                let decision = cell.scenario.scripted(cell.world, t.agent, &mut rng);
                let log = DecisionLog {
                    role: cell.scenario.role(cell.world, t.agent).to_string(),
                    value: serde_json::to_value(&decision).ok(),
                    ..DecisionLog::default()
                };
                (decision, log)
            })
            .collect())
    }
}

/// Past turns of one agent: (prompt, reply).
type History = VecDeque<(String, String)>;

/// The language model, through the engine.
pub struct Llm {
    engine: Engine,
    prompts: PromptBook,
    cfg: LlmConfig,
    /// Turns of history kept per agent.
    keep: usize,
    /// Keyed by `(arm, population, replicate, agent)` so that it survives a restart.
    histories: HashMap<String, History>,
    /// Requests in flight at most: prompts are rendered as the engine takes them, so a
    /// million agents never sit in memory as a million prompts.
    wave: usize,
}

fn history_key(cell: &CellInfo, agent: usize) -> String {
    format!(
        "{}/{}/{}/{}",
        cell.arm, cell.population, cell.replicate, agent
    )
}

impl Llm {
    pub fn new(engine: Engine, prompts: PromptBook, cfg: LlmConfig, keep: usize) -> Self {
        Self {
            engine,
            prompts,
            cfg,
            keep,
            histories: HashMap::new(),
            wave: 4096,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn into_engine(self) -> Engine {
        self.engine
    }

    fn request<S: Scenario>(
        &self,
        cells: &[CellView<'_, S>],
        t: &AgentTurn,
        system: &str,
    ) -> Result<(Request, String, String), PromptError> {
        let cell = &cells[t.cell];
        let turn = cell.scenario.turn(cell.world, t.agent, cell.step);
        let user = self
            .prompts
            .render(cell.scenario.role(cell.world, t.agent), &turn.context)?;
        let mut messages = vec![Message::system(system)];
        if let Some(history) = self
            .histories
            .get(&history_key(cells[t.cell].info, t.agent))
        {
            for (prompt, reply) in history {
                messages.push(Message::user(prompt.clone()));
                messages.push(Message::assistant(reply.clone()));
            }
        }
        messages.push(Message::user(user.clone()));
        let mut hasher = Sha256::new();
        for m in &messages {
            hasher.update(m.role.as_bytes());
            hasher.update([0]);
            hasher.update(m.content.as_bytes());
            hasher.update([0]);
        }
        let hash: String = hasher.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let request = Request::chat(messages)
            .with_schema((*turn.schema).clone())
            .with_max_tokens(self.cfg.max_tokens)
            .with_sampling(SamplingParams {
                temperature: self.cfg.temperature,
                top_p: self.cfg.top_p,
                top_k: self.cfg.top_k,
                seed: t.seed,
            });
        Ok((request, user, hash))
    }
}

impl<S: Scenario> Policy<S> for Llm {
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
    ) -> Result<Vec<(S::Decision, DecisionLog)>, PolicyError> {
        // The system prompt depends only on the cell's rules: render it once per arm.
        let mut systems: BTreeMap<String, String> = BTreeMap::new();
        for c in cells {
            if !systems.contains_key(&c.info.arm) {
                systems.insert(
                    c.info.arm.clone(),
                    self.prompts.render("system", &c.scenario.rules_context())?,
                );
            }
        }
        let mut results: Vec<Option<(S::Decision, DecisionLog)>> =
            (0..turns.len()).map(|_| None).collect();
        let mut pending: HashMap<u64, (usize, String, String)> = HashMap::new();
        let mut next = 0;
        while next < turns.len() || self.engine.has_work() {
            while next < turns.len() && pending.len() < self.wave {
                let t = &turns[next];
                let (request, user, hash) =
                    self.request(cells, t, &systems[&cells[t.cell].info.arm])?;
                match self.engine.submit(&request) {
                    Ok(id) => {
                        pending.insert(id, (next, user, hash));
                    }
                    Err(e) => {
                        let cell = &cells[t.cell];
                        let log = DecisionLog {
                            role: cell.scenario.role(cell.world, t.agent).to_string(),
                            prompt_hash: Some(hash),
                            fallback: Some(format!("refused: {e}")),
                            ..DecisionLog::default()
                        };
                        results[next] = Some((cell.scenario.no_change(cell.world, t.agent), log));
                    }
                }
                next += 1;
            }
            if !self.engine.has_work() {
                continue;
            }
            for (id, result) in self.engine.step().finished {
                let (i, user, hash) = pending
                    .remove(&id)
                    .expect("invariant: every finished id was submitted");
                let t = &turns[i];
                let cell = &cells[t.cell];
                let mut log = DecisionLog {
                    role: cell.scenario.role(cell.world, t.agent).to_string(),
                    prompt_hash: Some(hash),
                    ..DecisionLog::default()
                };
                let parsed = match result {
                    Err(e) => Err(format!("failed: {e}")),
                    Ok(r) => {
                        log.text = Some(r.text.clone());
                        log.value = r.value.clone();
                        log.prompt_tokens = r.prompt_tokens;
                        log.cached_tokens = r.cached_tokens;
                        log.generated_tokens = r.generated_tokens;
                        log.latency_ms = Some(
                            (r.timings.queue + r.timings.prefill + r.timings.decode).as_secs_f64()
                                * 1e3,
                        );
                        if self.keep > 0 {
                            let history = self
                                .histories
                                .entry(history_key(cell.info, t.agent))
                                .or_default();
                            history.push_back((user, r.text.clone()));
                            while history.len() > self.keep {
                                history.pop_front();
                            }
                        }
                        match (r.finish_reason, r.value) {
                            (FinishReason::Stop, Some(value)) => {
                                cell.scenario.parse(cell.world, t.agent, &value)
                            }
                            (FinishReason::Length, _) => Err(format!(
                                "length: no complete decision within {} tokens",
                                self.cfg.max_tokens
                            )),
                            (FinishReason::Stop, None) => Err("stop without a value".to_string()),
                        }
                    }
                };
                let decision = match parsed {
                    Ok(p) => {
                        log.clamps = p.clamps;
                        p.decision
                    }
                    Err(reason) => {
                        log.fallback = Some(reason);
                        cell.scenario.no_change(cell.world, t.agent)
                    }
                };
                results[i] = Some((decision, log));
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("invariant: every turn was decided"))
            .collect())
    }

    fn checkpoint(&self) -> Value {
        // Sorted, so that checkpoints of equal states are equal files.
        let sorted: BTreeMap<&String, &History> = self.histories.iter().collect();
        serde_json::to_value(sorted).unwrap_or(Value::Null)
    }

    fn restore(&mut self, state: Value) -> Result<(), PolicyError> {
        if state.is_null() {
            return Ok(());
        }
        self.histories =
            serde_json::from_value(state).map_err(|e| PolicyError::Checkpoint(e.to_string()))?;
        Ok(())
    }
}
