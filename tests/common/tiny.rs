//! Tiny random-weight Llama checkpoints for tests.
//!
//! [`TinyLlama::write`] lays out a complete Hugging Face model folder (config.json,
//! model.safetensors, a byte-level tokenizer and a chat template) small enough to run
//! thousands of forward passes in a test, yet with every architectural feature of Llama 3.2:
//! grouped-query attention, `llama3` RoPE scaling and tied embeddings. Its tokenizer is the
//! library's (`throng bench` runs the same byte vocabulary in its `tiny` shape).

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use throng::model::synthetic::{SPECIAL_TOKENS, byte_tokenizer_json};

/// How far bf16 logits may stray from f32 ones, as a share of the largest logit. bf16 keeps 8
/// significant bits (a relative rounding of 2^-9), and a forward pass rounds its activations
/// at every step; tests/model_forward.rs checks that the CPU's bf16 path stays within it, and
/// tests/cuda.rs holds CUDA's bf16 (cuBLAS and paged FlashAttention) to the same bound.
pub const BF16_LOGIT_TOLERANCE: f32 = 0.03;

/// Shape of a tiny model. The vocabulary is the byte tokenizer's (256 bytes + specials).
#[derive(Debug, Clone)]
pub struct TinyLlama {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub llama3_rope_scaling: bool,
    pub seed: u64,
}

impl Default for TinyLlama {
    fn default() -> Self {
        Self {
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            max_position_embeddings: 1024,
            tie_word_embeddings: true,
            llama3_rope_scaling: true,
            seed: 7,
        }
    }
}

/// A Llama 3 style chat template over the byte tokenizer's specials.
pub const TINY_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

impl TinyLlama {
    pub fn vocab_size(&self) -> usize {
        256 + SPECIAL_TOKENS.len()
    }

    pub fn config_json(&self) -> serde_json::Value {
        let mut cfg = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": 256,
            "eos_token_id": [257],
            "torch_dtype": "float32",
        });
        if self.llama3_rope_scaling {
            // Scaled so that short test sequences cross all three frequency bands.
            cfg["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64
            });
        }
        cfg
    }

    /// Random weights, `(out, in)` per matrix, scaled so activations stay O(1).
    pub fn weights(&self) -> candle_core::Result<HashMap<String, Tensor>> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed);
        let mut tensor =
            |shape: &[usize], scale: f32, offset: f32| -> candle_core::Result<Tensor> {
                let n: usize = shape.iter().product();
                let data: Vec<f32> = (0..n)
                    .map(|_| offset + scale * rng.random_range(-1.0f32..1.0))
                    .collect();
                Tensor::from_vec(data, shape, &Device::Cpu)
            };
        let (h, i, d) = (
            self.hidden_size,
            self.intermediate_size,
            self.hidden_size / self.num_heads,
        );
        let proj = |fan_in: usize| 1.7 / (fan_in as f32).sqrt();
        let mut w = HashMap::new();
        w.insert(
            "model.embed_tokens.weight".into(),
            tensor(&[self.vocab_size(), h], 1.0, 0.0)?,
        );
        w.insert("model.norm.weight".into(), tensor(&[h], 0.1, 1.0)?);
        if !self.tie_word_embeddings {
            w.insert(
                "lm_head.weight".into(),
                tensor(&[self.vocab_size(), h], proj(h), 0.0)?,
            );
        }
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            w.insert(
                format!("{p}.input_layernorm.weight"),
                tensor(&[h], 0.1, 1.0)?,
            );
            w.insert(
                format!("{p}.post_attention_layernorm.weight"),
                tensor(&[h], 0.1, 1.0)?,
            );
            w.insert(
                format!("{p}.self_attn.q_proj.weight"),
                tensor(&[self.num_heads * d, h], proj(h), 0.0)?,
            );
            w.insert(
                format!("{p}.self_attn.k_proj.weight"),
                tensor(&[self.num_kv_heads * d, h], proj(h), 0.0)?,
            );
            w.insert(
                format!("{p}.self_attn.v_proj.weight"),
                tensor(&[self.num_kv_heads * d, h], proj(h), 0.0)?,
            );
            w.insert(
                format!("{p}.self_attn.o_proj.weight"),
                tensor(&[h, self.num_heads * d], proj(h), 0.0)?,
            );
            w.insert(
                format!("{p}.mlp.gate_proj.weight"),
                tensor(&[i, h], proj(h), 0.0)?,
            );
            w.insert(
                format!("{p}.mlp.up_proj.weight"),
                tensor(&[i, h], proj(h), 0.0)?,
            );
            w.insert(
                format!("{p}.mlp.down_proj.weight"),
                tensor(&[h, i], proj(i), 0.0)?,
            );
        }
        Ok(w)
    }

    /// Writes a complete model folder into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_string_pretty(&self.config_json())?,
        )?;
        let weights = self.weights()?;
        let weights: HashMap<String, Tensor> = weights
            .into_iter()
            .map(|(k, v)| v.to_dtype(DType::F32).map(|v| (k, v)))
            .collect::<candle_core::Result<_>>()?;
        candle_core::safetensors::save(&weights, dir.join("model.safetensors"))?;
        std::fs::write(
            dir.join("tokenizer.json"),
            byte_tokenizer_json().to_string(),
        )?;
        let tokenizer_config = serde_json::json!({
            "bos_token": SPECIAL_TOKENS[0],
            "eos_token": SPECIAL_TOKENS[1],
            "chat_template": TINY_CHAT_TEMPLATE,
        });
        std::fs::write(
            dir.join("tokenizer_config.json"),
            tokenizer_config.to_string(),
        )?;
        Ok(())
    }
}
