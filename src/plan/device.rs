//! The arithmetic of sizing a run on devices (`throng plan`): from the model's weight and KV
//! memory and the first step's tokens, the KV memory, batch and step time per device, whether
//! it fits, and how many devices a target step time needs. Every figure says where it comes
//! from: measured here, computed from the config, or assumed (a device profile's stated
//! figures, efficiencies). The model's own figures (`ModelConfig::parameters`,
//! `kv_bytes_per_token`) come in from the command that loads the model (`cli::plan`).

use crate::host::human_bytes;

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
pub(crate) const PROFILES: &[DeviceProfile] = &[
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
pub(crate) const FLOPS_EFFICIENCY: f64 = 0.5;
pub(crate) const BANDWIDTH_EFFICIENCY: f64 = 0.8;
/// Of a device's memory, what is left for neither weights nor KV cache (activations,
/// workspaces, the runtime): assumed.
pub(crate) const RESERVED_SHARE: f64 = 0.1;

/// How fast decisions are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    /// Measured on this device: `seconds` for `decisions` decided together.
    Measured { decisions: usize, seconds: f64 },
    /// From a device profile's stated figures and the model's size.
    Profile(DeviceProfile),
}

/// A mixture of experts' weights, for what a decode step reads of them: a batch of `b`
/// tokens each routed to `per_token` of `count` experts touches only some experts of a layer
/// when `b` is small, all of them soon after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertWeights {
    pub count: usize,
    pub per_token: usize,
    /// Bytes of one expert's weights over every layer (its share of `Inputs::weight_bytes`).
    pub bytes_each: f64,
}

impl ExpertWeights {
    /// Experts of a layer that a batch of `batch` tokens touches, expected under uniform,
    /// independent routing (assumed: real routers are uneven, which touches fewer):
    /// `count x (1 - (1 - per_token / count)^batch)`.
    pub fn touched(&self, batch: usize) -> f64 {
        let count = self.count.max(1) as f64;
        let miss = 1.0 - (self.per_token as f64 / count).min(1.0);
        count * (1.0 - miss.powi(batch.min(i32::MAX as usize) as i32))
    }
}

/// What the estimate starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    pub devices: usize,
    pub memory_per_device: Figure,
    /// Every weight the device holds (all experts of a mixture).
    pub weight_bytes: Figure,
    /// Parameters held in memory (all experts).
    pub parameters: u64,
    /// Parameters one token is multiplied by (the routed experts only): what compute per
    /// token scales with. Equal to `parameters` for a dense model.
    pub active_parameters: u64,
    /// The mixture of experts, if any: a decode step reads only the experts its batch touches.
    pub experts: Option<ExpertWeights>,
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
    /// Of a mixture's experts per layer, those a decode step of the batch reads (assumed:
    /// uniform routing); `None` for a dense model or a measured speed.
    pub experts_touched: Option<f64>,
    /// Weight bytes a decode step reads from memory (all weights of a dense model).
    pub weights_read: f64,
}

impl Inputs {
    /// The estimate on `devices` devices (every other input as given).
    pub(crate) fn estimate_on(&self, devices: usize) -> Estimate {
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
        let (experts_touched, weights_read) = match (self.experts, self.speed) {
            (Some(e), Speed::Profile(_)) => {
                let touched = e.touched(batch.max(1));
                let unread = (e.count as f64 - touched).max(0.0) * e.bytes_each;
                (Some(touched), (self.weight_bytes.value - unread).max(0.0))
            }
            _ => (None, self.weight_bytes.value),
        };
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
                // Compute scales with the parameters a token is multiplied by.
                let params = self.active_parameters as f64;
                let b = batch.max(1) as f64;
                let waves = (per_device as f64 / b).ceil();
                // Prefill: every own token once, every system prompt once per wave.
                let prefill_tokens = b * own + prefixes_here as f64 * self.prefix_tokens;
                let prefill = 2.0 * params * prefill_tokens / flops;
                // Decode: each token step reads the weights (of a mixture, the experts the
                // batch touches) and the batch's KV, or is bound by the matrix units,
                // whichever is slower.
                let context = self.prompt_tokens.value + self.reply_tokens.value / 2.0;
                let read = weights_read + b * context * kv_token;
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
            experts_touched,
            weights_read,
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

// Where the models of a run go: with several models (policy groups or arms on different
// models), each device holds some of them, and what it holds must leave room for their KV.

/// How a run's models share its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every device holds every model; each model's agents are split evenly over all devices.
    Everywhere,
    /// Models dealt to devices as `--split models` deals them to ranks
    /// ([`crate::sim::runner::model_ranks`]): with devices enough, each device holds one
    /// model, at least one device each and the rest by decisions; with fewer devices than
    /// models, model `m` on device `m % devices`. A model's agents are split evenly over its
    /// devices.
    SplitModels,
}

/// One model of a run, as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLoad {
    pub name: String,
    /// What a device holding it keeps of its weights (all of them: throng does not split a
    /// model's layers or tensors across devices).
    pub weight_bytes: f64,
    pub kv_bytes_per_token: f64,
    /// Agents that decide through it in the step: its share of the agents.
    pub decisions: usize,
    /// KV tokens of one agent's own sequence (own prompt and reply), and of the system prompts
    /// a device holding the model keeps once.
    pub sequence_tokens: f64,
    pub prefix_tokens: f64,
    /// Parameters a token is multiplied by.
    pub active_parameters: u64,
}

impl ModelLoad {
    fn kv_per_sequence(&self) -> f64 {
        self.sequence_tokens * self.kv_bytes_per_token
    }
}

/// What one device holds, and whether it fits.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceLoad {
    /// Counted from 0.
    pub device: usize,
    /// The models it holds, as indices into the models placed, with the decisions each makes
    /// on this device.
    pub models: Vec<(usize, usize)>,
    pub weight_bytes: f64,
    /// KV memory left after the weights, the reserve and the models' system prompts.
    pub kv_room: f64,
    /// KV memory its agents' sequences would take all at once.
    pub kv_whole_step: f64,
    /// Whether the weights leave room for one sequence of each model it holds that has work.
    pub fits: bool,
}

/// Where the models go on `devices` devices.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlacement {
    pub placement: Placement,
    pub memory_per_device: f64,
    pub models: Vec<ModelLoad>,
    pub devices: Vec<DeviceLoad>,
}

/// Models that cannot be placed at all, with the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    #[error("no model to place: a run that sizes a model names at least one")]
    NoModels,
    #[error("no device to place the models on: give at least 1")]
    NoDevices,
}

/// Places `models` on `devices` devices of `memory_per_device` bytes each, as `placement`
/// says, and reports what each device holds and whether it fits (weights, the reserve
/// [`RESERVED_SHARE`], the system prompts and at least one agent's sequence of each model
/// with work there).
pub fn place(
    models: &[ModelLoad],
    devices: usize,
    memory_per_device: f64,
    placement: Placement,
) -> Result<ModelPlacement, PlacementError> {
    if models.is_empty() {
        return Err(PlacementError::NoModels);
    }
    if devices == 0 {
        return Err(PlacementError::NoDevices);
    }
    // The devices of each model.
    let owners: Vec<Vec<usize>> = match placement {
        Placement::Everywhere => vec![(0..devices).collect(); models.len()],
        Placement::SplitModels => {
            // As the run deals them (`--split models`), by each model's decisions.
            let decisions: Vec<u64> = models.iter().map(|m| m.decisions as u64).collect();
            crate::sim::runner::model_ranks(&decisions, devices)
        }
    };
    let usable = memory_per_device * (1.0 - RESERVED_SHARE);
    let devices = (0..devices)
        .map(|device| {
            let mut held = Vec::new();
            for (m, owned) in owners.iter().enumerate() {
                if let Some(slot) = owned.iter().position(|&d| d == device) {
                    // Split evenly: the first `rest` devices take one more.
                    let (each, rest) = (
                        models[m].decisions / owned.len(),
                        models[m].decisions % owned.len(),
                    );
                    held.push((m, each + usize::from(slot < rest)));
                }
            }
            let weight_bytes: f64 = held.iter().map(|&(m, _)| models[m].weight_bytes).sum();
            let prefixes: f64 = held
                .iter()
                .map(|&(m, _)| models[m].prefix_tokens * models[m].kv_bytes_per_token)
                .sum();
            let kv_room = usable - weight_bytes - prefixes;
            let one_each: f64 = held
                .iter()
                .filter(|&&(_, n)| n > 0)
                .map(|&(m, _)| models[m].kv_per_sequence().max(1.0))
                .sum();
            DeviceLoad {
                device,
                kv_whole_step: held
                    .iter()
                    .map(|&(m, n)| n as f64 * models[m].kv_per_sequence())
                    .sum(),
                fits: kv_room >= one_each && weight_bytes <= usable,
                models: held,
                weight_bytes,
                kv_room,
            }
        })
        .collect();
    Ok(ModelPlacement {
        placement,
        memory_per_device,
        models: models.to_vec(),
        devices,
    })
}

impl ModelPlacement {
    /// Whether every device fits.
    pub fn fits(&self) -> bool {
        self.devices.iter().all(|d| d.fits)
    }

    /// One line per group of devices that hold the same (`devices 1-8: each holds ...`),
    /// devices numbered from 1.
    pub fn lines(&self) -> Vec<String> {
        let describe = |d: &DeviceLoad| {
            let models = d
                .models
                .iter()
                .map(|&(m, n)| {
                    let model = &self.models[m];
                    format!(
                        "{} (weights {}, {n} decisions)",
                        model.name,
                        human_bytes(model.weight_bytes)
                    )
                })
                .collect::<Vec<_>>()
                .join(" and ");
            let verdict = if d.fits {
                "fits".to_string()
            } else if d.weight_bytes > self.memory_per_device * (1.0 - RESERVED_SHARE) {
                format!(
                    "does NOT fit: the weights alone pass the {} usable",
                    human_bytes(self.memory_per_device * (1.0 - RESERVED_SHARE))
                )
            } else {
                "does NOT fit: no room left for one agent's KV cache".to_string()
            };
            format!(
                "{models}; KV room {}, the whole step at once needs {}; {verdict}",
                human_bytes(d.kv_room.max(0.0)),
                human_bytes(d.kv_whole_step)
            )
        };
        let mut lines: Vec<(usize, usize, String)> = Vec::new();
        for d in &self.devices {
            let text = describe(d);
            match lines.last_mut() {
                Some((_, last, t)) if *t == text => *last = d.device,
                _ => lines.push((d.device, d.device, text)),
            }
        }
        lines
            .into_iter()
            .map(|(first, last, text)| match first == last {
                true => format!("device {}: {text}", first + 1),
                false => format!("devices {}-{}: each holds {text}", first + 1, last + 1),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, weights: f64, decisions: usize, active: u64) -> ModelLoad {
        ModelLoad {
            name: name.into(),
            weight_bytes: weights,
            kv_bytes_per_token: 1000.0,
            decisions,
            sequence_tokens: 100.0,
            prefix_tokens: 50.0,
            active_parameters: active,
        }
    }

    #[test]
    // Guards every-model-everywhere: each device holds all weights and an even share of each
    // model's agents, and the room left is the memory less reserve, weights and prefixes.
    fn every_model_on_every_device_holds_all_weights() {
        let models = [model("a", 10e9, 5, 8), model("b", 20e9, 4, 8)];
        let p = place(&models, 2, 100e9, Placement::Everywhere).unwrap();
        assert_eq!(p.devices.len(), 2);
        assert_eq!(p.devices[0].models, vec![(0, 3), (1, 2)]);
        assert_eq!(p.devices[1].models, vec![(0, 2), (1, 2)]);
        assert_eq!(p.devices[0].weight_bytes, 30e9);
        assert_eq!(p.devices[0].kv_room, 90e9 - 30e9 - 2.0 * 50.0 * 1000.0);
        assert_eq!(p.devices[0].kv_whole_step, 5.0 * 100.0 * 1000.0);
        assert!(p.fits());
        // Weights past the usable memory (90 of 100 GB) fit nowhere, whatever the devices.
        let big = [model("a", 50e9, 5, 8), model("b", 45e9, 4, 8)];
        let p = place(&big, 4, 100e9, Placement::Everywhere).unwrap();
        assert!(!p.fits());
        assert!(p.lines()[0].contains("the weights alone pass the 90.0 GB usable"));
    }

    #[test]
    // Guards `--split models`: devices dealt as the run deals ranks (by decisions, at least
    // one each), each device holding one model's weights; fewer devices than models share.
    fn split_models_deals_devices_by_decisions() {
        // a has three times b's decisions: of 4 devices, 3 and 1.
        let models = [model("a", 50e9, 300, 8), model("b", 45e9, 100, 8)];
        let p = place(&models, 4, 100e9, Placement::SplitModels).unwrap();
        let held: Vec<_> = p.devices.iter().map(|d| d.models.clone()).collect();
        assert_eq!(
            held,
            vec![
                vec![(0, 100)],
                vec![(0, 100)],
                vec![(0, 100)],
                vec![(1, 100)]
            ]
        );
        assert!(p.fits(), "one model a device fits where both would not");
        assert_eq!(
            p.lines()[0],
            "devices 1-3: each holds a (weights 50.0 GB, 100 decisions); KV room 40.0 GB, \
             the whole step at once needs 10.0 MB; fits"
        );
        let one = place(&models, 1, 100e9, Placement::SplitModels).unwrap();
        assert_eq!(one.devices[0].models, vec![(0, 300), (1, 100)]);
        assert!(
            !one.fits(),
            "both models' weights (95 GB) pass one device's 90 GB"
        );
        assert_eq!(
            place(&[], 1, 1e9, Placement::Everywhere),
            Err(PlacementError::NoModels)
        );
        assert_eq!(
            place(&models, 0, 1e9, Placement::Everywhere),
            Err(PlacementError::NoDevices)
        );
    }

    #[test]
    // Guards the single-model case `throng plan` prints: placement and the estimate agree on
    // whether it fits, at the edge of one sequence's KV.
    fn one_model_fits_where_the_estimate_says() {
        for weights in [1e9, 89.8e9, 89.9e9, 89.99e9, 95e9] {
            let inputs = Inputs {
                devices: 1,
                memory_per_device: Figure::new(100e9, Source::Assumed),
                weight_bytes: Figure::new(weights, Source::Computed),
                parameters: 1,
                active_parameters: 1,
                experts: None,
                kv_bytes_per_token: Figure::new(1e6, Source::Computed),
                cells: 1,
                decisions: 10,
                prompt_tokens: Figure::new(150.0, Source::Measured),
                shared_tokens: Figure::new(50.0, Source::Measured),
                prefixes: 1,
                prefix_tokens: 50.0,
                reply_tokens: Figure::new(20.0, Source::Assumed),
                max_seqs: 256,
                speed: Speed::Profile(*profile("h200").unwrap()),
            };
            let one = ModelLoad {
                name: "m".into(),
                weight_bytes: weights,
                kv_bytes_per_token: 1e6,
                decisions: 10,
                sequence_tokens: 120.0,
                prefix_tokens: 50.0,
                active_parameters: 1,
            };
            let placed = place(&[one], 1, 100e9, Placement::Everywhere).unwrap();
            assert_eq!(placed.fits(), inputs.estimate().fits, "weights {weights}");
        }
    }

    #[test]
    // Guards the mixture's memory traffic: a batch of one reads its 2 experts of 8, a large
    // batch all 8, and compute follows the active parameters, not the total.
    fn a_mixture_reads_the_experts_its_batch_touches() {
        let e = ExpertWeights {
            count: 8,
            per_token: 2,
            bytes_each: 1e9,
        };
        assert!((e.touched(1) - 2.0).abs() < 1e-12);
        assert!(e.touched(256) > 7.99);
        let inputs = |experts, active| Inputs {
            devices: 1,
            memory_per_device: Figure::new(141e9, Source::Assumed),
            weight_bytes: Figure::new(10e9, Source::Computed),
            parameters: 5_000_000_000,
            active_parameters: active,
            experts,
            kv_bytes_per_token: Figure::new(1e5, Source::Computed),
            cells: 1,
            decisions: 1,
            prompt_tokens: Figure::new(100.0, Source::Measured),
            shared_tokens: Figure::new(0.0, Source::Measured),
            prefixes: 0,
            prefix_tokens: 0.0,
            reply_tokens: Figure::new(10.0, Source::Assumed),
            max_seqs: 256,
            speed: Speed::Profile(*profile("h200").unwrap()),
        };
        let moe = inputs(Some(e), 2_000_000_000).estimate();
        // One agent: batch 1, 2 of 8 experts read, 6 GB of the 10 GB left unread.
        assert_eq!(moe.experts_touched, Some(2.0));
        assert!((moe.weights_read - 4e9).abs() < 1.0);
        let dense = inputs(None, 5_000_000_000).estimate();
        assert_eq!((dense.experts_touched, dense.weights_read), (None, 10e9));
        assert!(moe.step_seconds.value < dense.step_seconds.value);
    }
}
