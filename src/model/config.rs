//! Model hyper-parameters: the raw `config.json` of a Hugging Face checkpoint (or the
//! metadata of a GGUF file) turned into one validated [`ModelConfig`].
//!
//! throng runs four families of one decoder design (pre-norm, RMSNorm, rotary embeddings,
//! grouped-query attention, SwiGLU): Llama, Qwen2 (biases on q/k/v), Mistral (optionally a
//! sliding attention window) and Mixtral (Mistral with a mixture of experts for the MLP).
//! The differences are data in [`ModelConfig`], not separate code paths.

use super::ModelError;
use serde::Deserialize;
use std::path::Path;

/// Why a model's hyper-parameters cannot be used. The loader tells an architecture throng
/// does not run (another model, which no fix of the file helps) from a bad value in a Llama
/// config by the variant.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    #[error(
        "unsupported architecture {found}: throng runs LlamaForCausalLM (Llama 3.x, SmolLM2), \
         Qwen2ForCausalLM (Qwen2, Qwen2.5), MistralForCausalLM and MixtralForCausalLM; pick one \
         of those, or a GGUF file whose general.architecture is `llama` or `qwen2`"
    )]
    UnsupportedArchitecture { found: String },
    /// A size of zero (heads, layers, the vocabulary).
    #[error("`{0}` must be positive")]
    NotPositive(String),
    /// A number that must be finite and above 0, and is not.
    #[error("`{name}` is {value}: it must be a finite number above 0 ({why})")]
    NotPositiveNumber {
        name: String,
        value: f64,
        why: &'static str,
    },
    #[error("`{heads_key}` ({heads}) must be a multiple of `{kv_key}` ({kv_heads})")]
    HeadGroups {
        heads_key: String,
        heads: usize,
        kv_key: String,
        kv_heads: usize,
    },
    /// No head width given, and the hidden size does not split into the heads.
    #[error(
        "`{hidden_key}` ({hidden}) is not a multiple of `{heads_key}` ({heads}), so the heads \
         have no whole width (a checkpoint whose heads are not hidden_size / heads wide says so \
         in `head_dim`)"
    )]
    HeadWidth {
        hidden_key: String,
        hidden: usize,
        heads_key: String,
        heads: usize,
    },
    #[error("`{0}` ({1}) must be even for rotary embeddings")]
    OddHeadDim(String, usize),
    #[error("rope_freqs has {found} values, head_dim / 2 is {expected}")]
    RopeFreqs { found: usize, expected: usize },
    #[error(
        "rope_freqs value {index} is {value}: every one divides a rotation frequency, so it must \
         be a finite number above 0"
    )]
    RopeFreqValue { index: usize, value: f32 },
    #[error(
        "rope_scaling needs finite numbers with factor > 0, low_freq_factor > 0, \
         high_freq_factor > low_freq_factor and original_max_position_embeddings > 0"
    )]
    RopeScaling,
    #[error("rope_scaling of type llama3: {0}")]
    Llama3Scaling(serde_json::Error),
    #[error("rope_scaling type `{0}` is not supported (throng implements `llama3` and none)")]
    RopeType(String),
    #[error("no eos_token_id: the model could never finish a reply")]
    NoEos,
    #[error(
        "every eos_token_id ({ids:?}) is outside the vocabulary of {vocab} tokens: the model \
         could never finish a reply"
    )]
    EosOutsideVocabulary { ids: Vec<u32>, vocab: usize },
    #[error("num_experts_per_tok ({per_token}) must be between 1 and num_local_experts ({count})")]
    Experts { count: usize, per_token: usize },
    #[error(
        "use_sliding_window = true: Qwen2 then slides its window over the layers from \
         max_window_layers on only, which throng does not implement (it would attend over a \
         window in every layer); no published Qwen2 or Qwen2.5 checkpoint sets it"
    )]
    QwenLayerWindows,
    /// Not the shape of a Hugging Face `config.json` at all.
    #[error("{0}")]
    Json(serde_json::Error),
}

/// How rotary embeddings pair up the dimensions of a head.
///
/// Hugging Face checkpoints rotate the two halves of a head against each other; GGUF files
/// converted by llama.cpp permute the q/k weights so that adjacent pairs rotate instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// `rotate_half`: dimension `i` pairs with `i + head_dim / 2` (Hugging Face).
    Halves,
    /// dimension `2i` pairs with `2i + 1` (GGUF / llama.cpp).
    Interleaved,
}

/// The `llama3` frequency rescaling of Llama 3.1 and 3.2 (long-context RoPE).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f32,
    pub scaling: Option<Llama3RopeScaling>,
    pub style: RopeStyle,
    /// Per-frequency divisors as GGUF files store the `llama3` rescaling (`rope_freqs.weight`).
    pub freq_factors: Option<Vec<f32>>,
}

/// The model families throng runs, as their checkpoints name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    Mistral,
    Mixtral,
}

impl Family {
    /// The Hugging Face architecture name (`config.json`'s `architectures`).
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
        }
    }

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Mistral => "mistral",
            Family::Mixtral => "mixtral",
        }
    }

    const ALL: [Family; 4] = [
        Family::Llama,
        Family::Qwen2,
        Family::Mistral,
        Family::Mixtral,
    ];

    fn from_architecture(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.architecture() == name)
    }

    fn from_model_type(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.model_type() == name)
    }
}

/// A sparse mixture of experts in place of each layer's MLP (Mixtral): a router scores every
/// expert per token and the `per_token` best run, their outputs weighted by the router's
/// softmax renormalised over the chosen ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    pub per_token: usize,
}

/// Validated hyper-parameters of a model of one of the [`Family`]s.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope: RopeConfig,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends a reply; Llama 3.x instruct models use several.
    pub eos_token_ids: Vec<u32>,
    /// Whether the q, k and v projections add a bias (Qwen2).
    pub attention_bias: bool,
    /// Keys a query sees, itself included, when attention looks back over a window only
    /// (Mistral v0.1: 4096); `None` for full causal attention.
    pub sliding_window: Option<usize>,
    /// The mixture of experts that replaces the MLP, if any (Mixtral).
    pub experts: Option<Experts>,
}

impl ModelConfig {
    /// Query heads that share one key/value head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Width of the fused q, k and v projection output.
    pub(crate) fn qkv_width(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }

    /// Every parameter of the model, norms included: what its weights take in memory, and
    /// what `throng plan` sizes them by.
    pub fn parameters(&self) -> u64 {
        self.parameters_with(self.experts.map_or(1, |e| e.count))
    }

    /// Parameters one token's forward pass multiplies by: all of a dense model, only the
    /// chosen experts of a mixture. What compute per token scales with.
    pub fn active_parameters(&self) -> u64 {
        self.parameters_with(self.experts.map_or(1, |e| e.per_token))
    }

    fn parameters_with(&self, experts: usize) -> u64 {
        let (h, i, v) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
        );
        let q = (self.num_heads * self.head_dim) as u64;
        let kv = (self.num_kv_heads * self.head_dim) as u64;
        let bias = if self.attention_bias { q + 2 * kv } else { 0 };
        let router = self.experts.map_or(0, |e| e.count as u64 * h);
        // q, k, v, o; gate, up, down per expert; the router; two norms.
        let layer = h * q + 2 * h * kv + q * h + bias + experts as u64 * 3 * h * i + router + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_layers as u64 * layer + h + head
    }

    /// Bytes of keys and values one token takes in every layer, at `bytes_per_value`.
    pub fn kv_bytes_per_token(&self, bytes_per_value: usize) -> u64 {
        (2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value) as u64
    }

    /// Rotation frequencies per pair of head dimensions, with the `llama3` rescaling applied.
    pub(crate) fn inverse_frequencies(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1.0 / self.rope.theta.powf(i as f32 / d as f32))
            .collect();
        if let Some(factors) = &self.rope.freq_factors {
            return base.iter().zip(factors).map(|(f, d)| f / d).collect();
        }
        let Some(s) = self.rope.scaling else {
            return base;
        };
        let old = s.original_max_position_embeddings as f32;
        let low_freq_wavelen = old / s.low_freq_factor;
        let high_freq_wavelen = old / s.high_freq_factor;
        base.into_iter()
            .map(|freq| {
                let wavelen = 2.0 * std::f32::consts::PI / freq;
                if wavelen < high_freq_wavelen {
                    freq
                } else if wavelen > low_freq_wavelen {
                    freq / s.factor
                } else {
                    let smooth = (old / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * freq / s.factor + smooth * freq
                }
            })
            .collect()
    }

    /// Reads and validates a Hugging Face `config.json`.
    pub(crate) fn from_hf_file(path: &Path) -> Result<Self, ModelError> {
        let text = super::files::read_regular_text(path)?;
        let raw: RawHfConfig = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.to_path_buf(),
            message: format!("line {}, column {}: {e}", e.line(), e.column()),
        })?;
        raw.validate()
            .map_err(|problem| ModelError::from_config_problem(path, problem))
    }

    /// Reads and validates the contents of a Hugging Face `config.json`.
    pub(crate) fn from_hf_json(json: &serde_json::Value) -> Result<Self, ConfigProblem> {
        let raw: RawHfConfig = serde_json::from_value(json.clone()).map_err(ConfigProblem::Json)?;
        raw.validate()
    }

    /// Checks the hyper-parameters, naming them as `config.json` does.
    pub(crate) fn check(self) -> Result<Self, ConfigProblem> {
        self.check_with(&|name| name.to_string())
    }

    /// Checks the hyper-parameters, naming each by `key(its config.json name)` (a GGUF file
    /// names them by its own metadata keys).
    pub(crate) fn check_with(self, key: &dyn Fn(&str) -> String) -> Result<Self, ConfigProblem> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigProblem::NotPositive(key(name)));
        }
        // Zero or negative, these load and generate garbage: a rotation whose frequencies are
        // all 1 or NaN, a norm that divides by zero or by the root of a negative number.
        let numbers = [
            (
                "rope_theta",
                self.rope.theta as f64,
                "the base of the rotary embeddings' frequencies: 10000 for Llama 2, 500000 for Llama 3",
            ),
            (
                "rms_norm_eps",
                self.rms_norm_eps,
                "what RMSNorm adds to the mean square before its root: 1e-5 or 1e-6 in published models",
            ),
        ];
        for (name, value, why) in numbers {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigProblem::NotPositiveNumber {
                    name: key(name),
                    value,
                    why,
                });
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ConfigProblem::HeadGroups {
                heads_key: key("num_attention_heads"),
                heads: self.num_heads,
                kv_key: key("num_key_value_heads"),
                kv_heads: self.num_kv_heads,
            });
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ConfigProblem::OddHeadDim(key("head_dim"), self.head_dim));
        }
        self.check_rope()?;
        if self.eos_token_ids.is_empty() {
            return Err(ConfigProblem::NoEos);
        }
        if self
            .eos_token_ids
            .iter()
            .all(|&id| id as usize >= self.vocab_size)
        {
            return Err(ConfigProblem::EosOutsideVocabulary {
                ids: self.eos_token_ids.clone(),
                vocab: self.vocab_size,
            });
        }
        if self.sliding_window == Some(0) {
            return Err(ConfigProblem::NotPositive(key("sliding_window")));
        }
        if let Some(e) = self.experts
            && !(1..=e.count).contains(&e.per_token)
        {
            return Err(ConfigProblem::Experts {
                count: e.count,
                per_token: e.per_token,
            });
        }
        Ok(self)
    }

    /// The rotary embeddings' frequency factors, one per pair of a head's dimensions and each
    /// positive, and their Llama 3 scaling, finite with its low band below its high.
    fn check_rope(&self) -> Result<(), ConfigProblem> {
        if let Some(factors) = &self.rope.freq_factors {
            if factors.len() != self.head_dim / 2 {
                return Err(ConfigProblem::RopeFreqs {
                    found: factors.len(),
                    expected: self.head_dim / 2,
                });
            }
            if let Some((index, &value)) = factors
                .iter()
                .enumerate()
                .find(|(_, f)| !(f.is_finite() && **f > 0.0))
            {
                return Err(ConfigProblem::RopeFreqValue { index, value });
            }
        }
        if let Some(s) = self.rope.scaling {
            let finite = [s.factor, s.low_freq_factor, s.high_freq_factor]
                .iter()
                .all(|v| v.is_finite());
            if !(finite
                && s.factor > 0.0
                && s.low_freq_factor > 0.0
                && s.high_freq_factor > s.low_freq_factor
                && s.original_max_position_embeddings > 0)
            {
                return Err(ConfigProblem::RopeScaling);
            }
        }
        Ok(())
    }
}

/// `config.json` as Hugging Face writes it for the [`Family`]s.
#[derive(Debug, Deserialize)]
struct RawHfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    rope_theta: f32,
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    bos_token_id: Option<u32>,
    eos_token_id: Option<OneOrMany>,
    /// Mistral, Mixtral (null when unused) and Qwen2 (used only with `use_sliding_window`).
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: bool,
    /// Mixtral.
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

fn default_rope_theta() -> f32 {
    10_000.0
}

impl RawHfConfig {
    fn validate(self) -> Result<ModelConfig, ConfigProblem> {
        let family = if self.architectures.is_empty() {
            self.model_type.as_deref().and_then(Family::from_model_type)
        } else {
            self.architectures
                .iter()
                .find_map(|a| Family::from_architecture(a))
        };
        let Some(family) = family else {
            let found = if self.architectures.is_empty() {
                format!("model_type {:?}", self.model_type.unwrap_or_default())
            } else {
                self.architectures.join(", ")
            };
            return Err(ConfigProblem::UnsupportedArchitecture { found });
        };
        let scaling = match self.rope_scaling {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => parse_rope_scaling(value)?,
        };
        let num_kv_heads = self.num_key_value_heads.unwrap_or(self.num_attention_heads);
        if self.num_attention_heads == 0 {
            return Err(ConfigProblem::NotPositive("num_attention_heads".into()));
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if !self.hidden_size.is_multiple_of(self.num_attention_heads) => {
                return Err(ConfigProblem::HeadWidth {
                    hidden_key: "hidden_size".into(),
                    hidden: self.hidden_size,
                    heads_key: "num_attention_heads".into(),
                    heads: self.num_attention_heads,
                });
            }
            None => self.hidden_size / self.num_attention_heads,
        };
        let eos_token_ids = match self.eos_token_id {
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
            None => Vec::new(),
        };
        // Qwen2 configs name a window they do not use unless `use_sliding_window` says so.
        let sliding_window = match family {
            Family::Qwen2 if self.use_sliding_window => {
                return Err(ConfigProblem::QwenLayerWindows);
            }
            Family::Qwen2 => None,
            _ => self.sliding_window,
        };
        let experts = match (family, self.num_local_experts, self.num_experts_per_tok) {
            (Family::Mixtral, count, per_token) => Some(Experts {
                count: count.unwrap_or(8),
                per_token: per_token.unwrap_or(2),
            }),
            _ => None,
        };
        ModelConfig {
            family,
            attention_bias: family == Family::Qwen2,
            sliding_window,
            experts,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope: RopeConfig {
                theta: self.rope_theta,
                scaling,
                style: RopeStyle::Halves,
                freq_factors: None,
            },
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            bos_token_id: self.bos_token_id,
            eos_token_ids,
        }
        .check()
    }
}

fn parse_rope_scaling(
    value: serde_json::Value,
) -> Result<Option<Llama3RopeScaling>, ConfigProblem> {
    // Hugging Face has spelled the kind both `rope_type` and `type`.
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default")
        .to_string();
    match kind.as_str() {
        "default" => Ok(None),
        "llama3" => serde_json::from_value(value)
            .map(Some)
            .map_err(ConfigProblem::Llama3Scaling),
        other => Err(ConfigProblem::RopeType(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama_3_2_1b() -> &'static str {
        r#"{"architectures":["LlamaForCausalLM"],"bos_token_id":128000,"eos_token_id":[128001,128008,128009],
            "head_dim":64,"hidden_size":2048,"intermediate_size":8192,"max_position_embeddings":131072,
            "model_type":"llama","num_attention_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,
            "rms_norm_eps":1e-05,"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,
            "tie_word_embeddings":true,"torch_dtype":"bfloat16","vocab_size":128256}"#
    }

    #[test]
    fn reads_a_llama_3_2_config() {
        let raw: RawHfConfig = serde_json::from_str(llama_3_2_1b()).unwrap();
        let cfg = raw.validate().unwrap();
        assert_eq!(cfg.eos_token_ids, vec![128001, 128008, 128009]);
        assert_eq!(cfg.group_size(), 4);
        assert!(cfg.tie_word_embeddings);
        let s = cfg.rope.scaling.unwrap();
        assert_eq!(s.factor, 32.0);
        assert_eq!(s.original_max_position_embeddings, 8192);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let raw: RawHfConfig = serde_json::from_str(llama_3_2_1b()).unwrap();
        let cfg = raw.validate().unwrap();
        let mut plain = cfg.clone();
        plain.rope.scaling = None;
        let (scaled, base) = (cfg.inverse_frequencies(), plain.inverse_frequencies());
        assert_eq!(scaled[0], base[0], "the highest frequency is untouched");
        let last = base.len() - 1;
        assert!(
            (scaled[last] - base[last] / 32.0).abs() < 1e-12,
            "the lowest is divided by factor"
        );
    }

    #[test]
    fn rejects_other_architectures_by_name() {
        let text = llama_3_2_1b().replace("LlamaForCausalLM", "GPT2LMHeadModel");
        let raw: RawHfConfig = serde_json::from_str(&text).unwrap();
        let err = raw.validate().unwrap_err();
        assert!(
            matches!(&err, ConfigProblem::UnsupportedArchitecture { found } if found == "GPT2LMHeadModel"),
            "{err:?}"
        );
        assert!(err.to_string().contains("GPT2LMHeadModel"), "{err}");
    }

    /// Mixtral-8x7B-Instruct-v0.1's config.json.
    fn mixtral_8x7b() -> &'static str {
        r#"{"architectures":["MixtralForCausalLM"],"attention_dropout":0.0,"bos_token_id":1,
            "eos_token_id":2,"hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,
            "intermediate_size":14336,"max_position_embeddings":32768,"model_type":"mixtral",
            "num_attention_heads":32,"num_experts_per_tok":2,"num_hidden_layers":32,
            "num_key_value_heads":8,"num_local_experts":8,"output_router_logits":false,
            "rms_norm_eps":1e-05,"rope_theta":1000000.0,"router_aux_loss_coef":0.02,
            "sliding_window":null,"tie_word_embeddings":false,"torch_dtype":"bfloat16",
            "vocab_size":32000}"#
    }

    #[test]
    fn a_mixture_of_experts_counts_all_experts_in_memory_and_two_per_token() {
        let cfg =
            ModelConfig::from_hf_json(&serde_json::from_str(mixtral_8x7b()).unwrap()).unwrap();
        assert_eq!(cfg.family, Family::Mixtral);
        assert_eq!(
            cfg.experts,
            Some(Experts {
                count: 8,
                per_token: 2
            })
        );
        assert_eq!(cfg.sliding_window, None);
        // Mistral AI states 46.7 B parameters in all, 12.9 B used per token.
        let (total, active) = (
            cfg.parameters() as f64 / 1e9,
            cfg.active_parameters() as f64 / 1e9,
        );
        assert!((total - 46.7).abs() < 0.1, "{total}");
        assert!((active - 12.9).abs() < 0.1, "{active}");
    }

    #[test]
    fn qwen2_has_attention_biases_and_ignores_an_unused_window() {
        let text = r#"{"architectures":["Qwen2ForCausalLM"],"bos_token_id":151643,"eos_token_id":151645,
            "hidden_size":896,"intermediate_size":4864,"max_position_embeddings":32768,
            "max_window_layers":21,"model_type":"qwen2","num_attention_heads":14,
            "num_hidden_layers":24,"num_key_value_heads":2,"rms_norm_eps":1e-06,
            "rope_theta":1000000.0,"sliding_window":32768,"tie_word_embeddings":true,
            "use_sliding_window":false,"vocab_size":151936}"#;
        let cfg = ModelConfig::from_hf_json(&serde_json::from_str(text).unwrap()).unwrap();
        assert_eq!(cfg.family, Family::Qwen2);
        assert!(cfg.attention_bias && cfg.tie_word_embeddings);
        assert_eq!((cfg.sliding_window, cfg.head_dim), (None, 64));
        // Qwen2.5-0.5B: 494 M parameters, as its model card says.
        let total = cfg.parameters() as f64 / 1e6;
        assert!((total - 494.0).abs() < 1.0, "{total}");
        // A per-layer window throng does not run is refused, not run as a window everywhere.
        let windowed = text.replace(
            r#""use_sliding_window":false"#,
            r#""use_sliding_window":true"#,
        );
        let err = ModelConfig::from_hf_json(&serde_json::from_str(&windowed).unwrap()).unwrap_err();
        assert!(err.to_string().contains("max_window_layers"), "{err}");
    }

    #[test]
    fn mistral_v0_1_keeps_its_window_and_rejects_a_zero_one() {
        let text = mixtral_8x7b()
            .replace("MixtralForCausalLM", "MistralForCausalLM")
            .replace(r#""sliding_window":null"#, r#""sliding_window":4096"#);
        let cfg = ModelConfig::from_hf_json(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(
            (cfg.family, cfg.sliding_window, cfg.experts),
            (Family::Mistral, Some(4096), None)
        );
        let zero = text.replace(r#""sliding_window":4096"#, r#""sliding_window":0"#);
        let err = ModelConfig::from_hf_json(&serde_json::from_str(&zero).unwrap()).unwrap_err();
        assert!(err.to_string().contains("sliding_window"), "{err}");
    }
}
