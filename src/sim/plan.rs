//! Sizing a run before it is queued (`throng plan`): the model's weight and KV memory, the
//! first step's tokens, and from those the KV memory, batch and step time per device, whether
//! it fits, and how many devices a target step time needs. Every figure says where it comes
//! from: measured here, computed from the config, or assumed (a device profile's stated
//! figures, efficiencies).

use crate::model::ModelConfig;

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

/// The parameters of a Llama-architecture model, from its config.
pub fn parameters(cfg: &ModelConfig) -> u64 {
    let (h, i, v) = (
        cfg.hidden_size as u64,
        cfg.intermediate_size as u64,
        cfg.vocab_size as u64,
    );
    let q = (cfg.num_heads * cfg.head_dim) as u64;
    let kv = (cfg.num_kv_heads * cfg.head_dim) as u64;
    // q, k, v, o; gate, up, down; two norms.
    let layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
    let head = if cfg.tie_word_embeddings { 0 } else { v * h };
    v * h + cfg.num_layers as u64 * layer + h + head
}

/// Bytes of keys and values one token takes in every layer, at `bytes_per_value`.
pub fn kv_bytes_per_token(cfg: &ModelConfig, bytes_per_value: usize) -> u64 {
    (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_value) as u64
}

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
