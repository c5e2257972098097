//! Random-weight models with the exact shape of a preset, for benchmarks that must not need
//! a download (`throng bench`): every matrix has the size, and so the cost, of the real
//! model's; only the numbers are random. Two small shapes compare a mixture of experts with
//! the dense model of the same active size. Weights are drawn on the target device, so an 8B model
//! on a GPU never passes through host memory.

use super::linear::{SourceWeight, Target};
use super::llama::{Part, WeightSource};
use super::{Llama, ModelConfig, ModelError, WeightFormat};
use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};

/// A model shape: one of the presets' architectures, or the tiny test model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Shape {
    /// The tiny model of throng's own tests: 2 layers, hidden 64, a byte vocabulary.
    #[serde(rename = "tiny")]
    Tiny,
    /// Llama 3.2 1B: 16 layers, hidden 2048, head size 64, tied embeddings.
    #[serde(rename = "llama-3.2-1b")]
    Llama32_1b,
    /// Llama 3.2 3B: 28 layers, hidden 3072, head size 128, tied embeddings.
    #[serde(rename = "llama-3.2-3b")]
    Llama32_3b,
    /// Llama 3.1 8B: 32 layers, hidden 4096, head size 128.
    #[serde(rename = "llama-3.1-8b")]
    Llama31_8b,
    /// A small Mixtral: 8 layers, hidden 1024, 8 experts of 2048 with 2 per token, a byte
    /// vocabulary (0.42 B parameters, 0.13 B active).
    #[serde(rename = "mixtral-small")]
    MixtralSmall,
    /// `mixtral-small` with one dense MLP of 4096 in place of its experts: the same active
    /// parameters per token, an eighth of the expert weights.
    #[serde(rename = "mixtral-small-dense")]
    MixtralSmallDense,
}

impl Shape {
    pub const ALL: [Shape; 6] = [
        Shape::Tiny,
        Shape::Llama32_1b,
        Shape::Llama32_3b,
        Shape::Llama31_8b,
        Shape::MixtralSmall,
        Shape::MixtralSmallDense,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Tiny => "tiny",
            Shape::Llama32_1b => "llama-3.2-1b",
            Shape::Llama32_3b => "llama-3.2-3b",
            Shape::Llama31_8b => "llama-3.1-8b",
            Shape::MixtralSmall => "mixtral-small",
            Shape::MixtralSmallDense => "mixtral-small-dense",
        }
    }

    /// The preset whose architecture this is, if any.
    pub fn preset(self) -> Option<&'static str> {
        match self {
            Shape::Tiny | Shape::MixtralSmall | Shape::MixtralSmallDense => None,
            Shape::Llama32_1b => Some("llama-3.2-1b-instruct"),
            Shape::Llama32_3b => Some("llama-3.2-3b-instruct"),
            Shape::Llama31_8b => Some("llama-3.1-8b-instruct"),
        }
    }

    /// The model's `config.json`, as its Hugging Face repository has it.
    pub fn config_json(self) -> serde_json::Value {
        // (hidden, intermediate, layers, heads, head_dim, tied, rope factor)
        let (hidden, intermediate, layers, heads, head_dim, tied, factor) = match self {
            Shape::Tiny => return tiny_config_json(),
            Shape::MixtralSmall => return mixtral_small_config_json(true),
            Shape::MixtralSmallDense => return mixtral_small_config_json(false),
            Shape::Llama32_1b => (2048, 8192, 16, 32, 64, true, 32.0),
            Shape::Llama32_3b => (3072, 8192, 28, 24, 128, true, 32.0),
            Shape::Llama31_8b => (4096, 14336, 32, 32, 128, false, 8.0),
        };
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 128256,
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 8,
            "head_dim": head_dim,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "max_position_embeddings": 131072,
            "tie_word_embeddings": tied,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
        })
    }

    pub fn config(self) -> ModelConfig {
        ModelConfig::from_hf_json(&self.config_json())
            .expect("invariant: the built-in shapes are valid configs")
    }

    /// Whether the shape's vocabulary is the byte tokenizer's (else Llama 3's).
    pub(crate) fn byte_vocabulary(self) -> bool {
        matches!(
            self,
            Shape::Tiny | Shape::MixtralSmall | Shape::MixtralSmallDense
        )
    }

    /// Token ids that are ordinary text in the shape's tokenizer (no special tokens).
    pub(crate) fn text_vocab(self) -> u32 {
        if self.byte_vocabulary() { 256 } else { 128_000 }
    }
}

/// The `mixtral-small` shapes: with experts, or with the one dense MLP of the same active
/// width (two experts of 2048 per token, one MLP of 4096).
fn mixtral_small_config_json(experts: bool) -> serde_json::Value {
    let mut cfg = serde_json::json!({
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 256 + SPECIAL_TOKENS.len(),
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": false,
        "sliding_window": null,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "bos_token_id": 256,
        "eos_token_id": [257],
    });
    if !experts {
        cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        cfg["model_type"] = "mistral".into();
        cfg["intermediate_size"] = 4096.into();
    }
    cfg
}

/// The `tiny` shape's `config.json`: the tests' tiny model (`tests/common/tiny.rs`, which
/// checks that the two agree) with room for a benchmark's long contexts.
fn tiny_config_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256 + SPECIAL_TOKENS.len(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": true,
        "bos_token_id": 256,
        "eos_token_id": [257],
        "torch_dtype": "float32",
        // Scaled so that short sequences cross all three frequency bands.
        "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64
        },
    })
}

/// Special tokens of the byte tokenizer, after the 256 byte tokens.
pub const SPECIAL_TOKENS: [&str; 4] = [
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
];

/// GPT-2's printable stand-ins for the 256 byte values, as byte-level BPE vocabularies use.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("invariant: printable latin-1")
            } else {
                extra += 1;
                char::from_u32(255 + extra).expect("invariant: valid code point")
            }
        })
        .collect()
}

/// A byte-level BPE tokenizer with no merges: every byte is a token, so any text (and any
/// JSON a grammar allows) can be spelled, which is what a constrained decoder needs.
pub fn byte_tokenizer_json() -> serde_json::Value {
    let vocab: serde_json::Map<String, serde_json::Value> = byte_chars()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
        .collect();
    let added: Vec<serde_json::Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

/// Draws each weight as it is asked for: uniform, scaled by `1 / sqrt(fan_in)` (norms near 1),
/// so that activations stay of order one through every layer, as in a trained model.
struct RandomWeights {
    device: Device,
    seed: u64,
    drawn: u64,
}

impl RandomWeights {
    fn tensor(&mut self, shape: &[usize], scale: f32, offset: f32) -> candle_core::Result<Tensor> {
        self.drawn += 1;
        let seed = crate::seed::derive(self.seed, &[self.drawn]);
        let t = if self.device.is_cpu() {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            Tensor::from_vec(data, shape, &self.device)?
        } else {
            self.device.set_seed(seed)?;
            Tensor::rand(-1.0f32, 1.0, shape, &self.device)?
        };
        (t * f64::from(scale))? + f64::from(offset)
    }
}

impl WeightSource for RandomWeights {
    fn get(&mut self, part: Part, cfg: &ModelConfig) -> Result<SourceWeight, ModelError> {
        let shape = part.shape(cfg);
        let t = match part {
            Part::FinalNorm | Part::AttnNorm(_) | Part::MlpNorm(_) => self.tensor(&shape, 0.1, 1.0),
            Part::Embedding => self.tensor(&shape, 1.0, 0.0),
            Part::QBias(_) | Part::KBias(_) | Part::VBias(_) => self.tensor(&shape, 0.1, 0.0),
            _ => self.tensor(&shape, 1.7 / (shape[1] as f32).sqrt(), 0.0),
        }
        .map_err(|e| ModelError::during("drawing random weights", e))?;
        Ok(SourceWeight::Dense(t))
    }

    fn contains(&self, _part: Part) -> bool {
        true
    }
}

/// A Llama of `shape` with random weights (seeded by `seed`) in `weights` format on `device`.
///
/// The model never ends a reply on its own (no end-of-turn ids): a benchmark's replies run to
/// their token limit unless a grammar completes them first.
pub(crate) fn random_llama(
    shape: Shape,
    weights: WeightFormat,
    device: &Device,
    seed: u64,
) -> Result<Llama, ModelError> {
    let mut cfg = shape.config();
    cfg.eos_token_ids.clear();
    let target = weights.target(device, cfg.parameters() as usize, false)?;
    let mut source = RandomWeights {
        device: match target {
            // Quantized and int8 weights are made on the host, as from a file.
            Target::Quantized(_) | Target::Int8 | Target::Gguf(_) | Target::Native => Device::Cpu,
            Target::Dense(_) => device.clone(),
        },
        seed,
        drawn: 0,
    };
    Llama::load(cfg, &mut source, target, device)
}

/// The dtype activations and the KV cache take for `weights` on `device`.
pub(crate) fn activation_dtype(weights: WeightFormat, device: &Device, shape: Shape) -> DType {
    match weights.target(device, shape.config().parameters() as usize, false) {
        Ok(Target::Dense(dtype)) => dtype,
        // Loading refuses a format the device cannot hold; until then, f32.
        Ok(Target::Quantized(_) | Target::Int8 | Target::Gguf(_) | Target::Native) | Err(_) => {
            DType::F32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes are the published models' sizes.
    #[test]
    fn shapes_have_the_published_parameter_counts() {
        let billions = |s: Shape| s.config().parameters() as f64 / 1e9;
        assert!((billions(Shape::Llama32_1b) - 1.24).abs() < 0.01);
        assert!((billions(Shape::Llama32_3b) - 3.21).abs() < 0.01);
        assert!((billions(Shape::Llama31_8b) - 8.03).abs() < 0.01);
        let tiny = Shape::Tiny.config();
        assert_eq!((tiny.num_layers, tiny.hidden_size), (2, 64));
        // The mixture and its dense twin do the same work per token.
        let (moe, dense) = (
            Shape::MixtralSmall.config(),
            Shape::MixtralSmallDense.config(),
        );
        assert_eq!(
            moe.active_parameters() - dense.active_parameters(),
            8 * 8 * 1024
        );
        assert!((billions(Shape::MixtralSmall) - 0.42).abs() < 0.01);
    }

    #[test]
    fn a_random_tiny_model_runs_and_never_ends_a_reply() {
        let model = random_llama(Shape::Tiny, WeightFormat::F32, &Device::Cpu, 3).unwrap();
        use super::super::CausalLm;
        assert!(model.config().eos_token_ids.is_empty());
        assert_eq!(model.config().vocab_size, 260);
    }
}
