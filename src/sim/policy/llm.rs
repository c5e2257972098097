//! The language model, through the engine. Each cell's system prompt is rendered and
//! tokenized once per step; each agent's own prompt is rendered and tokenized in parallel a
//! wave at a time, as the engine has room, so that memory stays bounded whatever the number
//! of agents.

use super::{AgentTurn, CellView, Decided, LlmTrace, Policy, PolicyError, PolicyTimes};
use crate::engine::{
    ChatTemplate, Client, Engine, Fill, FinishReason, Message, Prompt, PromptCost, Queue, Refused,
    Request, RequestError, Response, SamplingParams, Schema, SharedPrefix, Tokenizer,
};
use crate::sim::population::{PersonaConfig, Population};
use crate::sim::prompt::PromptBook;
use crate::sim::scenario::{CellInfo, Scenario};
use rayon::prelude::*;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Past turns of one agent: (prompt, reply).
type History = VecDeque<(String, String)>;

/// The language model, through the engine.
pub struct Llm {
    engine: Engine,
    prompts: PromptBook,
    /// Turns of history kept per agent.
    keep: usize,
    /// Keyed by `(arm, population, replicate, agent)` so that it survives a restart.
    histories: HashMap<String, History>,
    /// Requests in flight at most.
    wave: usize,
    times: PolicyTimes,
    schemas: Schemas,
}

/// Schemas most remembered; past it they are forgotten together, as the engine's compiled
/// grammars are.
const MAX_SCHEMAS: usize = 64;

/// The engine's form of each scenario schema, by the address of the scenario's `Arc`: turns of
/// one role share one `Arc`, so a step of a million turns makes a handful ready, not a
/// million. Holding the `Arc` keeps its address from naming another schema.
#[derive(Default)]
struct Schemas(HashMap<usize, (Arc<Value>, Schema)>);

impl Schemas {
    fn get(&mut self, value: &Arc<Value>) -> Schema {
        let key = Arc::as_ptr(value) as usize;
        if let Some((_, schema)) = self.0.get(&key) {
            return schema.clone();
        }
        // Schemas that change every step (a cap that follows demand) come in new `Arc`s.
        if self.0.len() >= MAX_SCHEMAS {
            self.0.clear();
        }
        let schema = Schema::new((**value).clone());
        self.0.insert(key, (value.clone(), schema.clone()));
        schema
    }
}

fn history_key(cell: &CellInfo, agent: usize) -> String {
    format!(
        "{}/{}/{}/{}",
        cell.arm, cell.population, cell.replicate, agent
    )
}

/// The name a template file is known by in a [`PromptBook`] (`persona.jinja` -> `persona`).
pub fn template_name(file: &str) -> String {
    std::path::Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.to_string())
}

/// Token counts of prompts, from [`Llm::prompt_sizes`].
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSizes {
    /// Per turn: tokens of its cell's shared system prompt, and of its whole prompt.
    pub turns: Vec<(usize, usize)>,
    /// Tokens of every distinct system prompt.
    pub prefixes: Vec<usize>,
}

/// A turn made ready for the engine.
struct Prepared {
    /// Without its schema: the engine's form of it is looked up as the request is submitted,
    /// one at a time, rather than by the threads that prepare.
    request: Result<Request, RequestError>,
    schema: Arc<Value>,
    user: String,
    hash: String,
    /// The whole prompt, for a turn the decisions log keeps.
    prompt: Option<String>,
    cost: PromptCost,
}

/// What preparing a prompt reads, shared by the threads that prepare a wave.
struct Prep<'a> {
    prompts: &'a PromptBook,
    histories: &'a HashMap<String, History>,
    chat: &'a ChatTemplate,
    tokenizer: &'a Tokenizer,
}

impl Llm {
    pub fn new(engine: Engine, prompts: PromptBook, keep: usize, wave: usize) -> Self {
        Self {
            engine,
            prompts,
            keep,
            histories: HashMap::new(),
            wave: wave.max(1),
            times: PolicyTimes::default(),
            schemas: Schemas::default(),
        }
    }

    fn prep(&self) -> Prep<'_> {
        Prep {
            prompts: &self.prompts,
            histories: &self.histories,
            chat: self.engine.chat_template(),
            tokenizer: self.engine.tokenizer(),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn into_engine(self) -> Engine {
        self.engine
    }

    /// One LLM-written persona per agent of `population` (see [`crate::sim::persona`]).
    pub fn personas(
        &mut self,
        cfg: &PersonaConfig,
        model: &str,
        population: &Population,
        seed: u64,
    ) -> Result<Vec<Box<str>>, PolicyError> {
        let cache_dir = crate::assets::cache_dir().join("personas");
        let writer = crate::sim::persona::Writer {
            cfg,
            template: &template_name(&cfg.template),
            model,
            cache_dir: &cache_dir,
        };
        crate::sim::persona::write(&mut self.engine, &self.prompts, &writer, population, seed)
    }

    /// Tokens of the prompts of `turns`, without deciding them (`throng plan`).
    pub fn prompt_sizes<S: Scenario>(
        &self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
    ) -> Result<PromptSizes, PolicyError> {
        let mut systems: Vec<String> = Vec::new();
        let mut prefix_of = Vec::with_capacity(cells.len());
        for c in cells {
            let text = self
                .prompts
                .render("system", &c.scenario.shared_context(c.world, c.step))?;
            let i = systems.iter().position(|s| *s == text).unwrap_or_else(|| {
                systems.push(text);
                systems.len() - 1
            });
            prefix_of.push(i);
        }
        let prefixes: Vec<SharedPrefix> = systems
            .iter()
            .map(|s| SharedPrefix::new(self.engine.chat_template(), self.engine.tokenizer(), s))
            .collect::<Result<_, _>>()?;
        let prep = self.prep();
        let sizes = turns
            .par_iter()
            .map(|t| {
                let prefix = &prefixes[prefix_of[t.cell]];
                let request = prepare(&prep, cells, prefix, t)?.request?;
                let Prompt::Tokens(tokens) = &request.prompt else {
                    unreachable!("invariant: prepared prompts are tokens")
                };
                Ok((prefix.shared_tokens().len(), tokens.len()))
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Ok(PromptSizes {
            turns: sizes,
            prefixes: prefixes.iter().map(|p| p.shared_tokens().len()).collect(),
        })
    }
}

/// Renders and tokenizes one agent's own part of the prompt.
fn prepare<S: Scenario>(
    prep: &Prep<'_>,
    cells: &[CellView<'_, S>],
    prefix: &SharedPrefix,
    t: &AgentTurn,
) -> Result<Prepared, PolicyError> {
    let cell = &cells[t.cell];
    let started = Instant::now();
    let turn = cell
        .scenario
        .turn(cell.world, cell.population, t.agent, cell.step);
    let user = prep
        .prompts
        .render(cell.scenario.role(cell.world, t.agent), &turn.context)?;
    let rendered = started.elapsed();
    let mut own = Vec::new();
    if let Some(history) = prep.histories.get(&history_key(cell.info, t.agent)) {
        for (prompt, reply) in history {
            own.push(Message::user(prompt.clone()));
            own.push(Message::assistant(reply.clone()));
        }
    }
    own.push(Message::user(user.clone()));
    let hash = prefix.hash(&own);
    let prompt = t.logged.then(|| transcript(prefix.system(), &own));
    let tokens = prefix.tokens(prep.chat, prep.tokenizer, &own);
    let mut cost = PromptCost {
        template: rendered,
        ..PromptCost::default()
    };
    let request = tokens.map(|(tokens, c)| {
        cost += c;
        Request::new(Prompt::Tokens(tokens))
            .with_max_tokens(cell.llm.max_tokens)
            .with_sampling(SamplingParams {
                temperature: cell.llm.temperature,
                top_p: cell.llm.top_p,
                top_k: cell.llm.top_k,
                seed: t.seed,
            })
    });
    Ok(Prepared {
        request,
        schema: turn.schema,
        user,
        hash,
        prompt,
        cost,
    })
}

/// A prompt as its messages, for a reader: each under its role.
fn transcript(system: &str, own: &[Message]) -> String {
    let mut out = format!("[system]\n{system}\n");
    for m in own {
        out.push_str(&format!("\n[{}]\n{}\n", m.role, m.content));
    }
    out
}

impl<S: Scenario> Policy<S> for Llm {
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError> {
        // Each cell's system prompt, rendered and tokenized once; cells with the same rules
        // share one.
        let started = Instant::now();
        let mut systems: Vec<String> = Vec::new();
        let mut prefix_of: Vec<usize> = Vec::with_capacity(cells.len());
        for c in cells {
            let text = self
                .prompts
                .render("system", &c.scenario.shared_context(c.world, c.step))?;
            let i = match systems.iter().position(|s| *s == text) {
                Some(i) => i,
                None => {
                    systems.push(text);
                    systems.len() - 1
                }
            };
            prefix_of.push(i);
        }
        let prefixes: Vec<SharedPrefix> = systems
            .iter()
            .map(|s| SharedPrefix::new(self.engine.chat_template(), self.engine.tokenizer(), s))
            .collect::<Result<_, _>>()?;
        self.times.template += started.elapsed();

        let mut step = Step {
            cells,
            turns,
            prefixes,
            prefix_of,
            prompts: &self.prompts,
            histories: &mut self.histories,
            keep: self.keep,
            schemas: &mut self.schemas,
            times: &mut self.times,
            next: 0,
            results: (0..turns.len()).map(|_| None).collect(),
            done,
        };
        let before = self.engine.totals();
        // The step's own peak, not one of earlier work (personas, an earlier policy's step).
        self.engine.take_kv_peak_bytes();
        let ran = self.engine.run(self.wave, &mut step);
        let after = self.engine.totals();
        step.times.forward += after.forward.saturating_sub(before.forward);
        step.times.masks += after.masks.saturating_sub(before.masks);
        let peak = self.engine.take_kv_peak_bytes();
        step.times.kv_peak_bytes = step.times.kv_peak_bytes.max(peak);
        ran?;
        Ok(step
            .results
            .into_iter()
            .map(|r| r.expect("invariant: every turn was decided"))
            .collect())
    }

    fn take_times(&mut self) -> PolicyTimes {
        std::mem::take(&mut self.times)
    }

    fn checkpoint(&self) -> Vec<u8> {
        // Sorted, so that checkpoints of equal states are equal files.
        let sorted: BTreeMap<&String, &History> = self.histories.iter().collect();
        postcard::to_stdvec(&sorted).expect("invariant: histories serialise")
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), PolicyError> {
        if state.is_empty() {
            return Ok(());
        }
        self.histories =
            postcard::from_bytes(state).map_err(|e| PolicyError::Checkpoint(e.to_string()))?;
        Ok(())
    }
}

/// A turn in the engine.
struct InFlight {
    /// Index into the step's turns.
    turn: usize,
    /// The agent's own prompt, for its history.
    user: String,
    prompt_hash: String,
    prompt: Option<String>,
}

/// One step's turns through the engine: prepared a wave at a time as the engine has room, so
/// that memory stays bounded whatever the number of agents.
struct Step<'a, 'c, S: Scenario> {
    cells: &'a [CellView<'c, S>],
    turns: &'a [AgentTurn],
    prefixes: Vec<SharedPrefix>,
    /// Per cell, its system prompt in `prefixes`.
    prefix_of: Vec<usize>,
    prompts: &'a PromptBook,
    histories: &'a mut HashMap<String, History>,
    keep: usize,
    schemas: &'a mut Schemas,
    times: &'a mut PolicyTimes,
    /// Turns before it have been submitted.
    next: usize,
    results: Vec<Option<Decided<S::Decision>>>,
    done: &'a mut dyn FnMut(usize),
}

impl<S: Scenario> Step<'_, '_, S> {
    /// The agent keeps its current decision, for `reason`.
    fn fall_back(&mut self, i: usize, reason: String, trace: LlmTrace) {
        let t = &self.turns[i];
        let cell = &self.cells[t.cell];
        self.results[i] = Some(Decided {
            decision: cell.scenario.no_change(cell.world, t.agent),
            clamps: Vec::new(),
            fallback: Some(reason),
            llm: Some(Box::new(trace)),
        });
    }
}

impl<S: Scenario> Client for Step<'_, '_, S> {
    type Key = InFlight;
    type Error = PolicyError;

    fn fill(&mut self, queue: &mut Queue<'_, InFlight>) -> Result<Fill, PolicyError> {
        let take = queue.room().min(self.turns.len() - self.next);
        if take > 0 {
            let batch = &self.turns[self.next..self.next + take];
            let started = Instant::now();
            let prep = Prep {
                prompts: self.prompts,
                histories: self.histories,
                chat: queue.engine().chat_template(),
                tokenizer: queue.engine().tokenizer(),
            };
            let (cells, prefixes, prefix_of) = (self.cells, &self.prefixes, &self.prefix_of);
            let prepared: Vec<Prepared> = batch
                .par_iter()
                .map(|t| prepare(&prep, cells, &prefixes[prefix_of[t.cell]], t))
                .collect::<Result<_, _>>()?;
            let wall = started.elapsed().as_secs_f64();
            // Wall time, split between templates and the tokenizer as their sums are.
            let (sum_t, sum_k) = prepared.iter().fold((0.0, 0.0), |(a, b), p| {
                (
                    a + p.cost.template.as_secs_f64(),
                    b + p.cost.tokenize.as_secs_f64(),
                )
            });
            let share = if sum_t + sum_k > 0.0 {
                sum_t / (sum_t + sum_k)
            } else {
                1.0
            };
            self.times.template += std::time::Duration::from_secs_f64(wall * share);
            self.times.tokenize += std::time::Duration::from_secs_f64(wall * (1.0 - share));
            for (offset, p) in prepared.into_iter().enumerate() {
                let key = InFlight {
                    turn: self.next + offset,
                    user: p.user,
                    prompt_hash: p.hash,
                    prompt: p.prompt,
                };
                let submitted = match p.request {
                    Ok(request) => {
                        let request = request.with_schema(self.schemas.get(&p.schema));
                        queue.submit(key, request)
                    }
                    Err(error) => Err(Refused { key, error }),
                };
                if let Err(Refused { key, error }) = submitted {
                    let trace = LlmTrace {
                        prompt_hash: key.prompt_hash,
                        prompt: key.prompt,
                        ..LlmTrace::default()
                    };
                    self.fall_back(key.turn, format!("refused: {error}"), trace);
                    (self.done)(1);
                }
            }
            self.next += take;
        }
        Ok(if self.next < self.turns.len() {
            Fill::More
        } else {
            Fill::Done
        })
    }

    fn finished(
        &mut self,
        key: InFlight,
        result: Result<Response, RequestError>,
    ) -> Result<(), PolicyError> {
        let i = key.turn;
        let t = &self.turns[i];
        let cell = &self.cells[t.cell];
        let mut trace = LlmTrace {
            prompt_hash: key.prompt_hash,
            prompt: key.prompt,
            ..LlmTrace::default()
        };
        let parsed = match result {
            Err(e) => Err(format!("failed: {e}")),
            Ok(r) => {
                trace.text = Some(r.text.clone());
                trace.value = r.value.clone();
                trace.prompt_tokens = r.prompt_tokens;
                trace.cached_tokens = r.cached_tokens;
                trace.generated_tokens = r.generated_tokens;
                trace.latency_ms = Some(
                    (r.timings.queue + r.timings.prefill + r.timings.decode).as_secs_f64() * 1e3,
                );
                if self.keep > 0 {
                    let history = self
                        .histories
                        .entry(history_key(cell.info, t.agent))
                        .or_default();
                    history.push_back((key.user, r.text.clone()));
                    while history.len() > self.keep {
                        history.pop_front();
                    }
                }
                match (r.finish_reason, r.value) {
                    (FinishReason::Stop, Some(value)) => cell
                        .scenario
                        .parse(cell.world, t.agent, &value)
                        .map_err(|e| e.to_string()),
                    (FinishReason::Length, _) => Err(format!(
                        "length: no complete decision within {} tokens",
                        cell.llm.max_tokens
                    )),
                    (FinishReason::Stop, None) => Err("stop without a value".to_string()),
                }
            }
        };
        match parsed {
            Ok(p) => {
                self.results[i] = Some(Decided {
                    decision: p.decision,
                    clamps: p.clamps,
                    fallback: None,
                    llm: Some(Box::new(trace)),
                })
            }
            Err(reason) => self.fall_back(i, reason, trace),
        }
        Ok(())
    }

    fn stepped(&mut self, finished: usize) -> Result<(), PolicyError> {
        (self.done)(finished);
        Ok(())
    }
}
