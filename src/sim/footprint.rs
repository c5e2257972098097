//! What a run of the simulation holds in memory, the model aside: checked by `throng run`
//! (and `--resume`) before it writes anything, so that a run too large for the machine is
//! refused with its size instead of aborting half-way ("memory allocation of ... failed"),
//! and shown by `throng plan`.

use crate::host::{HostMemory, MemoryPart, human_bytes};
use crate::sim::experiment::Experiment;
use crate::sim::policy::{AgentTurn, Decided, LlmTrace};
use crate::sim::population::Attribute;
use crate::sim::scenario::Scenario;

/// What the process holds whatever the run: the program, its runtime and buffers (measured
/// at 25 to 75 MB for small runs), with room to spare.
pub(crate) const BASE_BYTES: f64 = 96.0 * 1024.0 * 1024.0;
/// Bytes of text per token of a model's reply or persona (English averages about 4).
pub(crate) const BYTES_PER_TOKEN: f64 = 8.0;
/// No model throng runs holds more tokens in one sequence than this: a bound on the text
/// `max_tokens` can ask for.
pub(crate) const LONGEST_CONTEXT: f64 = 131_072.0;
/// A request in flight: its rendered prompt, token ids and sequence (assumed).
pub(crate) const REQUEST_BYTES: f64 = 16.0 * 1024.0;
/// A turn an agent remembers (`history`): its own prompt, besides the reply (assumed).
pub(crate) const HISTORY_TURN_BYTES: f64 = 4.0 * 1024.0;
/// What the runner holds per cell whatever its size: the cell's record rows of a step as
/// Arrow arrays of their own (a dozen small allocations each, before the step's rows are
/// joined), its aggregates row, its RNG and bookkeeping, and what the allocator keeps around
/// them. Measured at 14 KB a cell in peak resident memory (the guessing game, 3 agents a
/// cell, 10,000 to 100,000 cells; the energy market, 20 agents, 2,000 cells): a run of many
/// small cells is dominated by it.
pub(crate) const CELL_BYTES: f64 = 16.0 * 1024.0;

/// What a run holds in memory at its largest population size, the model aside: the agents'
/// attributes and personas, every cell's world, and one step's turns, decisions, prompts in
/// flight and records as they are built. An estimate from the sizes of throng's own types
/// and, for what a scenario builds, figures measured on its runs; `tests/sizes.rs` holds it
/// between the peak memory of real runs and a small multiple of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// The population size it is largest at, and the cells (arms x replicates) of each size.
    pub population: usize,
    pub cells: usize,
    /// Largest first.
    pub parts: Vec<MemoryPart>,
}

/// A run too large to count or to hold, in words that say what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SizeError(pub String);

impl Footprint {
    /// Everything, with [`BASE_BYTES`].
    pub fn bytes(&self) -> f64 {
        BASE_BYTES + self.parts.iter().map(|p| p.bytes).sum::<f64>()
    }

    /// Adds `part` (a part the caller knows of, such as the model's KV cache on the CPU).
    pub fn add(&mut self, part: MemoryPart) {
        self.parts.push(part);
        self.parts.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
    }

    /// Whether `processes` copies of the run (the ranks of a job on this machine, each of
    /// which holds every cell) fit in what `host` lets them use; the error says how much the
    /// run needs, how much the machine has, and what to lower.
    pub fn check(&self, host: &HostMemory, processes: usize) -> Result<(), SizeError> {
        let processes = processes.max(1);
        let need = self.bytes() * processes as f64;
        if need <= host.usable() {
            return Ok(());
        }
        let ranks = match processes {
            1 => String::new(),
            n => format!(" ({n} ranks on this machine, each holding every cell)"),
        };
        let parts: Vec<String> = self
            .parts
            .iter()
            .take(3)
            .map(|p| format!("{} ({})", p.what, human_bytes(p.bytes)))
            .collect();
        let parts = match parts.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => "nothing of its own".into(),
        };
        let lower = self.parts.first().map_or("agents", |p| p.lower.as_str());
        let room = match &host.limit {
            Some((limit, source)) if *limit < host.available => format!(
                "the {} this process may use ({source}; the machine has {} available, {} in all)",
                human_bytes(*limit),
                human_bytes(host.available),
                human_bytes(host.total)
            ),
            _ => format!(
                "the {} this machine has available ({} in all)",
                human_bytes(host.available),
                human_bytes(host.total)
            ),
        };
        Err(SizeError(format!(
            "the run needs about {} of memory{ranks}, more than {room}. Its largest population \
             ({} agents in each of {} cell{}) holds {parts}: lower {lower}, or run it where \
             there is more memory",
            human_bytes(need),
            self.population,
            self.cells,
            if self.cells == 1 { "" } else { "s" },
        )))
    }
}

/// What the runner holds for every agent of every cell in a step, whatever the scenario: its
/// turn, its decision as made and as handed to the world (twice), and with the model, its
/// reply's trace.
fn runner_bytes_per_agent<S: Scenario>(exp: &Experiment) -> f64 {
    let decision = std::mem::size_of::<Option<S::Decision>>();
    let plain = std::mem::size_of::<AgentTurn>()
        + std::mem::size_of::<Decided<S::Decision>>()
        + 2 * decision
        + 1;
    let trace = match exp.uses(crate::sim::config::PolicyKind::Llm) {
        false => 0.0,
        true => {
            let tokens = exp
                .arms
                .iter()
                .map(|a| a.llm.max_tokens as f64)
                .fold(0.0, f64::max)
                .min(LONGEST_CONTEXT);
            // The trace, its prompt hash, its text and its value as JSON (twice the text).
            std::mem::size_of::<LlmTrace>() as f64 + 64.0 + 3.0 * tokens * BYTES_PER_TOKEN
        }
    };
    plain as f64 + trace
}

/// The footprint of `exp`, whose arms are `arms`; an error when its sizes overflow what
/// throng counts in (cells, agents per step, steps and decisions in all).
pub fn footprint<S: Scenario>(exp: &Experiment, arms: &[S]) -> Result<Footprint, SizeError> {
    let cfg = &exp.config;
    let (replicates, steps) = (cfg.replicates.0, cfg.steps.0);
    let too_many = |what: String, lower: &str| {
        SizeError(format!(
            "the run is too large to count: {what} is more than 2^64; lower {lower}"
        ))
    };
    let cells = exp.arms.len().checked_mul(replicates).ok_or_else(|| {
        too_many(
            format!("{} arms x {replicates} replicates", exp.arms.len()),
            "replicates",
        )
    })?;
    (cfg.agents.0.len() as u64)
        .checked_mul(steps as u64)
        .ok_or_else(|| {
            too_many(
                format!("{} population sizes x {steps} steps", cfg.agents.0.len()),
                "steps",
            )
        })?;
    let mut decisions = 0u64;
    for &size in &cfg.agents.0 {
        decisions = (size as u64)
            .checked_mul(cells as u64)
            .and_then(|n| n.checked_mul(steps as u64))
            .and_then(|n| n.checked_add(decisions))
            .ok_or_else(|| {
                too_many(
                    format!("the decisions of {size} agents x {cells} cells x {steps} steps"),
                    "agents, replicates or steps",
                )
            })?;
    }
    let largest = cfg
        .agents
        .0
        .iter()
        .map(|&size| of_size(exp, arms, size, cells))
        .max_by(|a, b| a.bytes().total_cmp(&b.bytes()))
        .expect("invariant: a config has at least one population size");
    Ok(largest)
}

/// The footprint of population size `size`.
fn of_size<S: Scenario>(exp: &Experiment, arms: &[S], size: usize, cells: usize) -> Footprint {
    let cfg = &exp.config;
    let n = size as f64;
    let (replicates, steps) = (cfg.replicates.0 as f64, cfg.steps.0 as f64);
    let agent_cells = n * cells as f64;
    let mut parts = Vec::new();
    // Each cell's world and records, by the scenario.
    for (a, arm) in arms.iter().enumerate() {
        for part in arm.sizing().map_or_else(Vec::new, |s| s.memory(n, steps)) {
            let what = match arms.len() {
                1 => part.what,
                _ => format!("{} (arm `{}`)", part.what, exp.arms[a].name),
            };
            let bytes = match part.per_cell {
                true => part.bytes * replicates,
                false => part.bytes,
            };
            parts.push(MemoryPart::new(what, part.lower, bytes));
        }
    }
    parts.push(MemoryPart::new(
        "a step's turns and decisions",
        "agents, replicates or arms",
        agent_cells * runner_bytes_per_agent::<S>(exp),
    ));
    parts.push(MemoryPart::new(
        "each cell's records and bookkeeping",
        "replicates or arms",
        cells as f64 * CELL_BYTES,
    ));
    // The agents of each replicate: attributes (and their state columns), policies, the
    // decision log's sample.
    let population = &exp.population;
    let mut per_agent: f64 = population
        .attributes
        .iter()
        .map(|a| match a {
            Attribute::Categorical { .. } => 4.0,
            Attribute::Numeric { .. } => 12.0,
        })
        .sum();
    if exp.is_mixed() {
        per_agent += 1.0;
    }
    if let crate::sim::config::DecisionLogMode::Sample(_) = exp.records.decisions {
        per_agent += 1.0;
    }
    if per_agent > 0.0 {
        parts.push(MemoryPart::new(
            "the agents' attributes",
            "agents or replicates",
            n * replicates * per_agent,
        ));
    }
    if let Some(personas) = &population.personas {
        let tokens = (personas.max_tokens as f64).min(LONGEST_CONTEXT);
        parts.push(MemoryPart::new(
            "the agents' personas",
            "agents, replicates or population.personas.max_tokens",
            n * replicates * (tokens * BYTES_PER_TOKEN + 32.0),
        ));
    }
    if exp.uses(crate::sim::config::PolicyKind::Llm) {
        parts.push(MemoryPart::new(
            "the prompts in flight",
            "llm.wave",
            (cfg.llm.wave as f64).min(agent_cells) * REQUEST_BYTES,
        ));
        if cfg.history > 0 {
            let reply = exp
                .arms
                .iter()
                .map(|a| a.llm.max_tokens as f64)
                .fold(0.0, f64::max)
                .min(LONGEST_CONTEXT)
                * BYTES_PER_TOKEN;
            parts.push(MemoryPart::new(
                "the agents' chat histories",
                "history, agents or replicates",
                agent_cells * (cfg.history as f64).min(steps) * (HISTORY_TURN_BYTES + reply),
            ));
        }
    }
    parts.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
    Footprint {
        population: size,
        cells,
        parts,
    }
}
