//! The language model, through the engine. Each cell's system prompt is rendered and
//! tokenized once per step; each agent's own prompt is rendered and tokenized in parallel a
//! wave at a time, as the engine has room, so that memory stays bounded whatever the number
//! of agents.
//!
//! With history (`history > 0`) each agent's next prompt starts with its previous prompt and
//! reply, and every step calls the agents in the same order. Each request is keyed by its
//! agent's history key and each step's turns are announced to the engine in order
//! ([`Engine::expect_calls`]), so that a KV cache too small for every agent's history keeps
//! those of the agents called soonest, rather than the least recently used (exactly the
//! agents called last). That holds while the system prompt stays the same from step to step
//! (the energy market's does; the guessing game's shows the latest results) and until the
//! history is cut to its last `history` turns: past that the previous prompt is no longer a
//! prefix, and the hints keep blocks that will not be found.

use super::{AgentTurn, CellView, Decided, LlmTrace, Policy, PolicyError, PolicyTimes, Transcript};
use crate::engine::{
    ChatTemplate, Client, Engine, Fill, FinishReason, KnownReplies, Message, Prompt, PromptCost,
    Queue, Refused, Request, RequestError, RequestKey, Response, SamplingParams, Schema,
    SharedPrefix, Tokenizer,
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

/// The language model, through the engine: one engine per model, each agent's request routed
/// to its model's (see [`CellView::llm_of`]), each model's requests one continuous batch.
pub struct Llm {
    /// One per model; the first also writes personas and sizes prompts.
    engines: Vec<Engine>,
    /// The model each engine serves, by the name the config gives it. With one engine, every
    /// agent's requests go to it, whatever its name.
    names: Vec<Option<String>>,
    prompts: PromptBook,
    /// Turns of history kept per agent.
    keep: usize,
    /// Keyed by `(arm, population, replicate, agent)` so that it survives a restart.
    histories: HashMap<String, History>,
    /// Requests in flight at most.
    wave: usize,
    times: PolicyTimes,
    /// Per engine: each has its own compiled grammars.
    schemas: Vec<Schemas>,
    /// Replies taken from earlier runs. While it is set, every request is keyed (its trace
    /// carries the key), so that the run's store can keep its reply for later runs.
    reuse: Option<Box<dyn KnownReplies>>,
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
    /// The agent's own prompt, when agents keep history.
    user: Option<String>,
    hash: String,
    /// The whole prompt, for a turn the decisions log keeps.
    prompt: Option<Transcript>,
    cost: PromptCost,
}

/// What preparing a prompt reads, shared by the threads that prepare a wave.
struct Prep<'a> {
    prompts: &'a PromptBook,
    histories: &'a HashMap<String, History>,
    chat: &'a ChatTemplate,
    tokenizer: &'a Tokenizer,
    /// Whether agents keep history: requests are then keyed by agent for KV retention.
    keyed: bool,
}

impl Llm {
    /// One engine, which decides for every agent.
    pub fn new(engine: Engine, prompts: PromptBook, keep: usize, wave: usize) -> Self {
        Self::with_models(vec![(None, engine)], prompts, keep, wave)
    }

    /// One engine per model, each named as the config names its model (`[llm] model`, an
    /// arm's or a policy group's `llm.model`); an agent's requests go to the engine of its
    /// model. The first engine also writes personas. With one engine, every agent's requests
    /// go to it.
    ///
    /// # Panics
    /// When `engines` is empty.
    pub(crate) fn with_models(
        engines: Vec<(Option<String>, Engine)>,
        prompts: PromptBook,
        keep: usize,
        wave: usize,
    ) -> Self {
        assert!(!engines.is_empty(), "invariant: at least one engine");
        let (names, engines): (Vec<_>, Vec<_>) = engines.into_iter().unzip();
        Self {
            schemas: engines.iter().map(|_| Schemas::default()).collect(),
            engines,
            names,
            prompts,
            keep,
            histories: HashMap::new(),
            wave: wave.max(1),
            times: PolicyTimes::default(),
            reuse: None,
        }
    }

    fn prep(&self) -> Prep<'_> {
        Prep {
            prompts: &self.prompts,
            histories: &self.histories,
            chat: self.engines[0].chat_template(),
            tokenizer: self.engines[0].tokenizer(),
            keyed: self.keep > 0,
        }
    }

    /// The first engine (the only one of a run with one model).
    pub fn engine(&self) -> &Engine {
        &self.engines[0]
    }

    /// Every engine, with the name of the model it serves.
    pub fn engines(&self) -> impl Iterator<Item = (Option<&str>, &Engine)> {
        self.names.iter().map(Option::as_deref).zip(&self.engines)
    }

    /// The name of the first engine's model, when it was given one.
    pub(crate) fn first_model(&self) -> Option<&str> {
        self.names[0].as_deref()
    }

    /// The engine that serves `model`: the only one, or the one of that name.
    fn engine_for(&self, model: &Option<String>) -> Option<usize> {
        match self.engines.len() {
            1 => Some(0),
            _ => self.names.iter().position(|n| n == model),
        }
    }

    /// One LLM-written persona per agent of `population` (see [`super::persona`]).
    pub fn personas(
        &mut self,
        cfg: &PersonaConfig,
        model: &str,
        population: &Population,
        seed: u64,
    ) -> Result<Vec<Box<str>>, PolicyError> {
        let cache_dir = crate::assets::cache_dir().join("personas");
        let writer = super::persona::Writer {
            cfg,
            template: &template_name(&cfg.template),
            model,
            cache_dir: &cache_dir,
        };
        super::persona::write(
            &mut self.engines[0],
            &self.prompts,
            &writer,
            population,
            seed,
        )
    }

    /// Tokens of the prompts of `turns`, without deciding them (`throng plan`).
    pub(crate) fn prompt_sizes<S: Scenario>(
        &self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
    ) -> Result<PromptSizes, PolicyError> {
        let (systems, system_of) = self.systems(0, cells)?;
        let prep = self.prep();
        let sizes = turns
            .par_iter()
            .map(|t| {
                let system = &systems[system_of[t.cell]];
                let request = prepare(&prep, cells, system, t)?.request?;
                let Prompt::Tokens(tokens) = &request.prompt else {
                    unreachable!("invariant: prepared prompts are tokens")
                };
                Ok((system.prefix.shared_tokens().len(), tokens.len()))
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Ok(PromptSizes {
            turns: sizes,
            prefixes: systems
                .iter()
                .map(|s| s.prefix.shared_tokens().len())
                .collect(),
        })
    }

    /// Each cell's system prompt, rendered and tokenized once for engine `e`, and which one
    /// each cell has: cells with the same rules share one.
    fn systems<S: Scenario>(
        &self,
        e: usize,
        cells: &[CellView<'_, S>],
    ) -> Result<(Vec<System>, Vec<usize>), PolicyError> {
        let mut texts: Vec<String> = Vec::new();
        let mut system_of = Vec::with_capacity(cells.len());
        for c in cells {
            let text = self
                .prompts
                .render("system", &c.scenario.shared_context(c.world, c.step))?;
            let i = texts.iter().position(|s| *s == text).unwrap_or_else(|| {
                texts.push(text);
                texts.len() - 1
            });
            system_of.push(i);
        }
        let engine = &self.engines[e];
        let systems = texts
            .into_iter()
            .map(|text| {
                Ok(System {
                    prefix: SharedPrefix::new(engine.chat_template(), engine.tokenizer(), &text)?,
                    text: text.into(),
                })
            })
            .collect::<Result<_, PolicyError>>()?;
        Ok((systems, system_of))
    }
}

/// A system prompt of the step: its tokens, shared by the requests of its cells, and its text,
/// shared by the transcripts of their logged turns.
struct System {
    prefix: SharedPrefix,
    text: Arc<str>,
}

/// Renders and tokenizes one agent's own part of the prompt.
fn prepare<S: Scenario>(
    prep: &Prep<'_>,
    cells: &[CellView<'_, S>],
    system: &System,
    t: &AgentTurn,
) -> Result<Prepared, PolicyError> {
    let prefix = &system.prefix;
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
    let key = history_key(cell.info, t.agent);
    if let Some(history) = prep.histories.get(&key) {
        for (prompt, reply) in history {
            own.push(Message::user(prompt.clone()));
            own.push(Message::assistant(reply.clone()));
        }
    }
    // The agent's own prompt outlives the turn only in its history.
    let kept = prep.keyed.then(|| user.clone());
    own.push(Message::user(user));
    let hash = prefix.hash(&own);
    let prompt = t.logged.then(|| Transcript::new(system.text.clone(), &own));
    let tokens = prefix.tokens(prep.chat, prep.tokenizer, &own);
    let mut cost = PromptCost {
        template: rendered,
        ..PromptCost::default()
    };
    let llm = cell.llm_of(t.agent);
    let request = tokens.map(|(tokens, c)| {
        cost += c;
        let request = Request::new(Prompt::Tokens(tokens))
            .with_max_tokens(llm.max_tokens)
            .with_sampling(SamplingParams {
                temperature: llm.temperature,
                top_p: llm.top_p,
                top_k: llm.top_k,
                seed: t.seed,
            });
        if prep.keyed {
            request.with_retention_key(key)
        } else {
            request
        }
    });
    Ok(Prepared {
        request,
        schema: turn.schema,
        user: kept,
        hash,
        prompt,
        cost,
    })
}

impl Llm {
    /// The engine of each turn's model, by cell and route (computed once per cell and route,
    /// not per turn).
    fn engines_of<S: Scenario>(
        &self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
    ) -> Result<Vec<usize>, PolicyError> {
        let table: Vec<Vec<Option<usize>>> = cells
            .iter()
            .map(|c| {
                c.llms
                    .iter()
                    .map(|l| self.engine_for(&l.model))
                    .collect::<Vec<_>>()
            })
            .collect();
        turns
            .iter()
            .map(|t| {
                let cell = &cells[t.cell];
                let route = cell.route.map_or(0, |r| r[t.agent] as usize);
                let found = match table[t.cell].get(route) {
                    Some(found) => *found,
                    // A view without routes: the arm's model.
                    None => self.engine_for(&cell.llm.model),
                };
                found.ok_or_else(|| {
                    PolicyError::NoModel(
                        cell.llm_of(t.agent)
                            .model
                            .clone()
                            .unwrap_or_else(|| "(unnamed)".into()),
                    )
                })
            })
            .collect()
    }

    /// Takes the replies `known` holds (earlier runs'; it may hold none) instead of asking
    /// the model, and keys every request so that the run's store can keep its reply.
    pub(crate) fn set_known_replies(&mut self, known: Box<dyn KnownReplies>) {
        self.reuse = Some(known);
    }

    /// The decisions of `turns`, all asking engine `e`.
    fn decide_on<S: Scenario>(
        &mut self,
        e: usize,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError> {
        let started = Instant::now();
        let (systems, system_of) = self.systems(e, cells)?;
        self.times.template += started.elapsed();

        let mut step = Step {
            cells,
            turns,
            systems,
            system_of,
            prompts: &self.prompts,
            histories: &mut self.histories,
            keep: self.keep,
            schemas: &mut self.schemas[e],
            times: &mut self.times,
            next: 0,
            results: (0..turns.len()).map(|_| None).collect(),
            done,
            // Shortens the object's lifetime to the step's, which `Option` does not do itself.
            reuse: self
                .reuse
                .as_mut()
                .map(|r| &mut **r as &mut dyn KnownReplies),
        };
        let engine = &mut self.engines[e];
        if self.keep > 0 {
            // Turns are submitted in this order, and the next step's come in the same one.
            engine.expect_calls(
                turns
                    .iter()
                    .map(|t| history_key(cells[t.cell].info, t.agent)),
            );
        }
        let before = engine.totals();
        // The step's own peak, not one of earlier work (personas, an earlier policy's step).
        engine.take_kv_peak_bytes();
        let ran = engine.run(self.wave, &mut step);
        let after = engine.totals();
        step.times.forward += after.forward.saturating_sub(before.forward);
        step.times.masks += after.masks.saturating_sub(before.masks);
        // Each model has its own cache, held beside the others': their peaks add up.
        step.times.kv_peak_bytes += engine.take_kv_peak_bytes();
        ran?;
        Ok(step
            .results
            .into_iter()
            .map(|r| r.expect("invariant: every turn was decided"))
            .collect())
    }
}

impl<S: Scenario> Policy<S> for Llm {
    /// One continuous batch per model, one model after another; a turn's decision does not
    /// depend on the others in its batch (batch invariance), so neither does it on the models
    /// beside its own.
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError> {
        self.decide_all(cells, turns, done)
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

impl Llm {
    /// One continuous batch per model, one model after another.
    fn decide_all<S: Scenario>(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError> {
        if self.engines.len() == 1 {
            return self.decide_on(0, cells, turns, done);
        }
        let engine_of = self.engines_of(cells, turns)?;
        let mut slots: Vec<Option<Decided<S::Decision>>> = (0..turns.len()).map(|_| None).collect();
        for e in 0..self.engines.len() {
            let (index, subset): (Vec<usize>, Vec<AgentTurn>) = turns
                .iter()
                .enumerate()
                .filter(|(i, _)| engine_of[*i] == e)
                .map(|(i, t)| (i, *t))
                .unzip();
            if subset.is_empty() {
                continue;
            }
            let decided = self.decide_on(e, cells, &subset, done)?;
            for (i, d) in index.into_iter().zip(decided) {
                slots[i] = Some(d);
            }
        }
        Ok(slots
            .into_iter()
            .map(|d| d.expect("invariant: every turn has an engine"))
            .collect())
    }
}

/// A turn in the engine.
struct InFlight {
    /// Index into the step's turns.
    turn: usize,
    /// The agent's own prompt, for its history (when agents keep one).
    user: Option<String>,
    prompt_hash: String,
    prompt: Option<Transcript>,
    /// The key of its request's complete input, when the run keeps replies.
    request_key: Option<RequestKey>,
}

/// One step's turns through the engine: prepared a wave at a time as the engine has room, so
/// that memory stays bounded whatever the number of agents.
struct Step<'a, 'c, S: Scenario> {
    cells: &'a [CellView<'c, S>],
    turns: &'a [AgentTurn],
    systems: Vec<System>,
    /// Per cell, its system prompt in `systems`.
    system_of: Vec<usize>,
    prompts: &'a PromptBook,
    histories: &'a mut HashMap<String, History>,
    keep: usize,
    schemas: &'a mut Schemas,
    times: &'a mut PolicyTimes,
    /// Turns before it have been submitted.
    next: usize,
    results: Vec<Option<Decided<S::Decision>>>,
    done: &'a mut dyn FnMut(usize),
    reuse: Option<&'a mut dyn KnownReplies>,
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
                keyed: self.keep > 0,
            };
            let (cells, systems, system_of) = (self.cells, &self.systems, &self.system_of);
            let prepared: Vec<Prepared> = batch
                .par_iter()
                .map(|t| prepare(&prep, cells, &systems[system_of[t.cell]], t))
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
            let mut reused = Vec::new();
            for (offset, p) in prepared.into_iter().enumerate() {
                let mut key = InFlight {
                    turn: self.next + offset,
                    user: p.user,
                    prompt_hash: p.hash,
                    prompt: p.prompt,
                    request_key: None,
                };
                let submitted = match p.request {
                    Ok(request) => {
                        let request = request.with_schema(self.schemas.get(&p.schema));
                        if let Some(reuse) = self.reuse.as_mut() {
                            // A request the engine would refuse has no key; it is refused below.
                            key.request_key = queue.engine().request_key(&request).ok();
                            if let Some(reply) = key.request_key.and_then(|k| reuse.lookup(&k)) {
                                reused.push((key, reply));
                                continue;
                            }
                        }
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
            let n = reused.len();
            self.times.reused += n as u64;
            for (key, reply) in reused {
                self.finished(key, Ok(reply))?;
            }
            if n > 0 {
                (self.done)(n);
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
                trace.request_key = key.request_key;
                trace.stopped = r.finish_reason == FinishReason::Stop;
                trace.text = Some(r.text.clone());
                trace.value = r.value.clone();
                trace.prompt_tokens = r.prompt_tokens;
                trace.cached_tokens = r.cached_tokens;
                trace.generated_tokens = r.generated_tokens;
                trace.latency_ms = Some(
                    (r.timings.queue + r.timings.prefill + r.timings.decode).as_secs_f64() * 1e3,
                );
                // A turn keeps its prompt when agents keep history.
                if let Some(user) = key.user {
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
                    (FinishReason::Stop, Some(value)) => cell
                        .scenario
                        .parse(cell.world, t.agent, &value)
                        .map_err(|e| e.to_string()),
                    (FinishReason::Length, _) => Err(format!(
                        "length: no complete decision within {} tokens",
                        cell.llm_of(t.agent).max_tokens
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
