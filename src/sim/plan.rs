//! Sizing a run before it is queued (`throng plan`): the model's weight and KV memory, the
//! first step's tokens, and from those the KV memory, batch and step time per device, whether
//! it fits, and how many devices a target step time needs. Every figure says where it comes
//! from: measured here, computed from the config, or assumed (a device profile's stated
//! figures, efficiencies). The model's own figures (`ModelConfig::parameters`,
//! `kv_bytes_per_token`) come in from the command that loads the model (`cli::plan`), so that
//! the simulation layer stays below the model.

/// Where a figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Measured,
    Computed,
    Assumed,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::Measured => "measured",
            Source::Computed => "computed",
            Source::Assumed => "assumed",
        }
    }
}

/// A number and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    pub value: f64,
    pub source: Source,
}

impl Figure {
    pub fn new(value: f64, source: Source) -> Self {
        Figure { value, source }
    }
}

/// A device's stated figures, for sizing a GPU run from a machine without one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceProfile {
    pub name: &'static str,
    pub memory_bytes: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Dense bf16 matrix throughput, FLOP/s.
    pub flops: f64,
}

/// Stated by NVIDIA (dense, without sparsity).
pub const PROFILES: &[DeviceProfile] = &[
    DeviceProfile {
        name: "h200",
        memory_bytes: 141e9,
        bandwidth: 4.8e12,
        flops: 989e12,
    },
    DeviceProfile {
        name: "h100",
        memory_bytes: 80e9,
        bandwidth: 3.35e12,
        flops: 989e12,
    },
    DeviceProfile {
        name: "a100",
        memory_bytes: 80e9,
        bandwidth: 2.0e12,
        flops: 312e12,
    },
    DeviceProfile {
        name: "l4",
        memory_bytes: 24e9,
        bandwidth: 0.3e12,
        flops: 121e12,
    },
];

pub fn profile(name: &str) -> Option<&'static DeviceProfile> {
    PROFILES.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// Of a GPU's stated figures, what a real step reaches (assumed): matrix units half busy
/// over a step's ragged batches, memory streamed at 80% of its peak.
pub const FLOPS_EFFICIENCY: f64 = 0.5;
pub const BANDWIDTH_EFFICIENCY: f64 = 0.8;
/// Of a device's memory, what is left for neither weights nor KV cache (activations,
/// workspaces, the runtime): assumed.
pub const RESERVED_SHARE: f64 = 0.1;

/// How fast decisions are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    /// Measured on this device: `seconds` for `decisions` decided together.
    Measured { decisions: usize, seconds: f64 },
    /// From a device profile's stated figures and the model's size.
    Profile(DeviceProfile),
}

/// What the estimate starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub devices: usize,
    pub memory_per_device: Figure,
    pub weight_bytes: Figure,
    pub parameters: u64,
    pub kv_bytes_per_token: Figure,
    /// Cells of the population size, and the agents deciding in its first step.
    pub cells: usize,
    pub decisions: usize,
    /// Mean tokens of a whole prompt, and of the shared system prompt within it.
    pub prompt_tokens: Figure,
    pub shared_tokens: Figure,
    /// Distinct system prompts in the step, and their mean tokens.
    pub prefixes: usize,
    pub prefix_tokens: f64,
    pub reply_tokens: Figure,
    /// Sequences the engine runs at once.
    pub max_seqs: usize,
    pub speed: Speed,
}

/// What the estimate says, per device.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Of the prompt tokens, those of shared system prompts.
    pub shared_share: f64,
    pub decisions_per_device: usize,
    /// KV memory a device has after weights and the reserve.
    pub kv_memory: f64,
    /// KV bytes of one agent's sequence (own prompt and reply), and of the system prompts a
    /// device holds.
    pub kv_per_sequence: f64,
    pub kv_prefixes: f64,
    /// KV memory to hold every agent of a device at once.
    pub kv_whole_step: f64,
    /// Sequences a device runs at once.
    pub batch: usize,
    pub fits: bool,
    pub step_seconds: Figure,
}

impl Inputs {
    /// The estimate on `devices` devices (every other input as given).
    pub fn estimate_on(&self, devices: usize) -> Estimate {
        let devices = devices.max(1);
        let per_device = self.decisions.div_ceil(devices);
        let own = (self.prompt_tokens.value - self.shared_tokens.value).max(0.0);
        let kv_token = self.kv_bytes_per_token.value;
        let kv_per_sequence = (own + self.reply_tokens.value) * kv_token;
        // Split by cells (when they deal out evenly) a device holds its cells' prefixes;
        // split by agents, all of them.
        let prefixes_here = if self.cells.is_multiple_of(devices) {
            self.prefixes.div_ceil(devices)
        } else {
            self.prefixes
        };
        let kv_prefixes = prefixes_here as f64 * self.prefix_tokens * kv_token;
        let memory = self.memory_per_device.value;
        let kv_memory = memory * (1.0 - RESERVED_SHARE) - self.weight_bytes.value;
        let room = ((kv_memory - kv_prefixes) / kv_per_sequence.max(1.0)).floor();
        let batch = if room < 1.0 {
            0
        } else {
            (room as usize).min(self.max_seqs).min(per_device.max(1))
        };
        let fits = batch >= 1;
        let step_seconds = match self.speed {
            Speed::Measured { decisions, seconds } => {
                // The measured throughput at the sample's batch, held at larger batches.
                Figure::new(
                    per_device as f64 * seconds / decisions.max(1) as f64,
                    Source::Measured,
                )
            }
            Speed::Profile(p) => {
                let flops = p.flops * FLOPS_EFFICIENCY;
                let bandwidth = p.bandwidth * BANDWIDTH_EFFICIENCY;
                let params = self.parameters as f64;
                let b = batch.max(1) as f64;
                let waves = (per_device as f64 / b).ceil();
                // Prefill: every own token once, every system prompt once per wave.
                let prefill_tokens = b * own + prefixes_here as f64 * self.prefix_tokens;
                let prefill = 2.0 * params * prefill_tokens / flops;
                // Decode: each token step reads the weights and the batch's KV, or is bound
                // by the matrix units, whichever is slower.
                let context = self.prompt_tokens.value + self.reply_tokens.value / 2.0;
                let read = self.weight_bytes.value + b * context * kv_token;
                let per_token = (read / bandwidth).max(2.0 * params * b / flops);
                let decode = self.reply_tokens.value * per_token;
                Figure::new(waves * (prefill + decode), Source::Assumed)
            }
        };
        Estimate {
            shared_share: if self.prompt_tokens.value > 0.0 {
                self.shared_tokens.value / self.prompt_tokens.value
            } else {
                0.0
            },
            decisions_per_device: per_device,
            kv_memory,
            kv_per_sequence,
            kv_prefixes,
            kv_whole_step: kv_prefixes + per_device as f64 * kv_per_sequence,
            batch,
            fits,
            step_seconds,
        }
    }

    pub fn estimate(&self) -> Estimate {
        self.estimate_on(self.devices)
    }

    /// The fewest devices (up to `limit`) whose estimated step takes at most `target`
    /// seconds, assuming agents split evenly across them.
    pub fn devices_for(&self, target: f64, limit: usize) -> Option<usize> {
        (1..=limit).find(|&d| {
            let e = self.estimate_on(d);
            e.fits && e.step_seconds.value <= target
        })
    }
}

// What a run of the simulation holds in memory, the model aside: checked by `throng run`
// (and `--resume`) before it writes anything, so that a run too large for the machine is
// refused with its size instead of aborting half-way ("memory allocation of ... failed").

use crate::sim::experiment::Experiment;
use crate::sim::policy::{AgentTurn, Decided, LlmTrace};
use crate::sim::population::Attribute;
use crate::sim::scenario::Scenario;

/// What the process holds whatever the run: the program, its runtime and buffers (measured
/// at 25 to 75 MB for small runs), with room to spare.
pub const BASE_BYTES: f64 = 96.0 * 1024.0 * 1024.0;
/// Bytes of text per token of a model's reply or persona (English averages about 4).
pub const BYTES_PER_TOKEN: f64 = 8.0;
/// No model throng runs holds more tokens in one sequence than this: a bound on the text
/// `max_tokens` can ask for.
pub const LONGEST_CONTEXT: f64 = 131_072.0;
/// A request in flight: its rendered prompt, token ids and sequence (assumed).
pub const REQUEST_BYTES: f64 = 16.0 * 1024.0;
/// A turn an agent remembers (`history`): its own prompt, besides the reply (assumed).
pub const HISTORY_TURN_BYTES: f64 = 4.0 * 1024.0;

/// One part of what a run holds in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPart {
    /// What it is, in words (`every round's guesses`).
    pub what: String,
    /// What to lower to shrink it (`steps, agents or replicates`).
    pub lower: String,
    pub bytes: f64,
    /// Whether every cell holds it at once (a world), rather than one cell at a time (what
    /// building a world needs for a moment); only for a scenario's parts of one cell.
    pub per_cell: bool,
}

impl MemoryPart {
    pub fn new(what: impl Into<String>, lower: impl Into<String>, bytes: f64) -> Self {
        Self {
            what: what.into(),
            lower: lower.into(),
            bytes,
            per_cell: true,
        }
    }

    /// A part that one cell at a time holds.
    pub fn once(what: impl Into<String>, lower: impl Into<String>, bytes: f64) -> Self {
        Self {
            per_cell: false,
            ..Self::new(what, lower, bytes)
        }
    }
}

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

/// The memory a run may take here: what the machine has available, and a lower limit set on
/// this process, if any (`ulimit -v`, a control group's).
#[derive(Debug, Clone, PartialEq)]
pub struct HostMemory {
    pub available: f64,
    pub total: f64,
    pub limit: Option<(f64, String)>,
}

impl HostMemory {
    /// This machine and process, where the kernel says (Linux).
    pub fn here() -> Option<Self> {
        let available = crate::host::available_memory()?;
        Some(Self {
            available: available as f64,
            total: crate::host::total_memory().unwrap_or(available) as f64,
            limit: crate::host::memory_limit().map(|l| (l.bytes as f64, l.source.into())),
        })
    }

    /// What the run may take: the available memory, or the limit below it.
    pub fn usable(&self) -> f64 {
        self.limit
            .as_ref()
            .map_or(self.available, |(limit, _)| limit.min(self.available))
    }
}

/// A run too large to count or to hold, in words that say what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SizeError(pub String);

/// `bytes` for people: `1.2 GB`, `400.0 TB`, and beyond a yottabyte, `1.0e30 bytes`.
pub fn human_bytes(bytes: f64) -> String {
    if !bytes.is_finite() || bytes >= 1e24 {
        return format!("{bytes:.1e} bytes");
    }
    bytesize::ByteSize(bytes.max(0.0) as u64)
        .display()
        .si()
        .to_string()
}

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
    let trace = match exp.policies.uses(crate::sim::config::PolicyKind::Llm) {
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
        for part in arm.memory(n, steps) {
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
    if exp.policies.is_mixed() {
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
    if exp.policies.uses(crate::sim::config::PolicyKind::Llm) {
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
