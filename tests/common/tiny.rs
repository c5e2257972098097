//! Tiny random-weight checkpoints of every model family for tests.
//!
//! [`TinyLlama::write`] lays out a complete Hugging Face model folder (config.json,
//! model.safetensors, a byte-level tokenizer and a chat template) small enough to run
//! thousands of forward passes in a test, yet with every architectural feature of Llama 3.2:
//! grouped-query attention, `llama3` RoPE scaling and tied embeddings. Its tokenizer is the
//! library's (`throng bench` runs the same byte vocabulary in its `tiny` shape).
//! [`TinyLlama::qwen2`], [`TinyLlama::mistral`] and [`TinyLlama::mixtral`] give the other
//! families' features (q/k/v biases, a sliding window, a mixture of experts), and
//! [`TinyLlama::write_gguf`] the same weights as llama.cpp would convert them.

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::Path;
use throng::model::Family;
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
    pub family: Family,
    /// Mistral's sliding attention window.
    pub sliding_window: Option<usize>,
    /// Mixtral's `(experts, experts per token)`.
    pub experts: Option<(usize, usize)>,
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
            family: Family::Llama,
            sliding_window: None,
            experts: None,
        }
    }
}

/// A Llama 3 style chat template over the byte tokenizer's specials.
pub const TINY_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

impl TinyLlama {
    /// Qwen2 / Qwen2.5: biases on q, k and v, RoPE base 1e6, tied embeddings.
    pub fn qwen2() -> Self {
        Self {
            family: Family::Qwen2,
            llama3_rope_scaling: false,
            seed: 11,
            ..Self::default()
        }
    }

    /// Mistral: v0.1 with a sliding window of `window` keys, v0.2/v0.3 with none.
    pub fn mistral(window: Option<usize>) -> Self {
        Self {
            family: Family::Mistral,
            llama3_rope_scaling: false,
            tie_word_embeddings: false,
            sliding_window: window,
            seed: 13,
            ..Self::default()
        }
    }

    /// Mixtral: `experts` SwiGLU experts per layer, `per_token` of them run for each token.
    pub fn mixtral(experts: usize, per_token: usize) -> Self {
        Self {
            family: Family::Mixtral,
            llama3_rope_scaling: false,
            tie_word_embeddings: false,
            experts: Some((experts, per_token)),
            seed: 17,
            ..Self::default()
        }
    }

    pub fn vocab_size(&self) -> usize {
        256 + SPECIAL_TOKENS.len()
    }

    fn rope_theta(&self) -> f64 {
        match self.family {
            Family::Llama => 500000.0,
            _ => 1000000.0,
        }
    }

    pub fn config_json(&self) -> serde_json::Value {
        let mut cfg = serde_json::json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "rms_norm_eps": 1e-5,
            "rope_theta": self.rope_theta(),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": 256,
            "eos_token_id": [257],
            "torch_dtype": "float32",
        });
        match self.family {
            Family::Llama => {}
            Family::Qwen2 => {
                cfg["sliding_window"] = 32768.into();
                cfg["use_sliding_window"] = false.into();
                cfg["max_window_layers"] = self.num_layers.into();
            }
            Family::Mistral | Family::Mixtral => {
                cfg["sliding_window"] = self.sliding_window.into();
            }
        }
        if let Some((experts, per_token)) = self.experts {
            cfg["num_local_experts"] = experts.into();
            cfg["num_experts_per_tok"] = per_token.into();
        }
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
            if self.family == Family::Qwen2 {
                for (name, rows) in [
                    ("q", self.num_heads * d),
                    ("k", self.num_kv_heads * d),
                    ("v", self.num_kv_heads * d),
                ] {
                    w.insert(
                        format!("{p}.self_attn.{name}_proj.bias"),
                        tensor(&[rows], 0.5, 0.0)?,
                    );
                }
            }
            match self.experts {
                None => {
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
                Some((experts, _)) => {
                    let moe = format!("{p}.block_sparse_moe");
                    // Scores of a few units apart, so that routing is decisive.
                    w.insert(
                        format!("{moe}.gate.weight"),
                        tensor(&[experts, h], 3.0 * proj(h), 0.0)?,
                    );
                    for e in 0..experts {
                        for (name, shape, fan_in) in
                            [("w1", [i, h], h), ("w3", [i, h], h), ("w2", [h, i], i)]
                        {
                            w.insert(
                                format!("{moe}.experts.{e}.{name}.weight"),
                                tensor(&shape, proj(fan_in), 0.0)?,
                            );
                        }
                    }
                }
            }
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

/// llama.cpp's permutation of q and k rows for `llama` GGUF files, whose RoPE rotates
/// adjacent dimensions: within each head, the halves are interleaved.
fn permute_for_gguf(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    w.reshape((heads, 2, rows / heads / 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

impl TinyLlama {
    /// The model's weights as an f32 GGUF file at `path`, named and laid out as llama.cpp's
    /// converter writes this family (`llama` with permuted q/k rows, or `qwen2`); Mixtral's
    /// experts stacked in one tensor per matrix when `stacked`, one tensor each otherwise.
    /// The file carries no tokenizer: load it with `tokenizer.json` beside it.
    pub fn write_gguf(
        &self,
        path: &Path,
        stacked: bool,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.write_gguf_as(path, stacked, candle_core::quantized::GgmlDType::F32)
    }

    /// [`TinyLlama::write_gguf`] with the matrices quantized to `dtype` (vectors stay f32).
    pub fn write_gguf_as(
        &self,
        path: &Path,
        stacked: bool,
        dtype: candle_core::quantized::GgmlDType,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        use candle_core::quantized::gguf_file::{self, Value};
        use candle_core::quantized::{GgmlDType, QTensor};
        let arch = if self.family == Family::Qwen2 {
            "qwen2"
        } else {
            "llama"
        };
        let d = self.hidden_size / self.num_heads;
        let weights = self.weights()?;
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        let mut put = |name: String, t: Tensor| tensors.push((name, t));
        put(
            "token_embd.weight".into(),
            weights["model.embed_tokens.weight"].clone(),
        );
        put(
            "output_norm.weight".into(),
            weights["model.norm.weight"].clone(),
        );
        if let Some(head) = weights.get("lm_head.weight") {
            put("output.weight".into(), head.clone());
        }
        let permute = |w: &Tensor, heads: usize| -> candle_core::Result<Tensor> {
            if arch == "llama" {
                permute_for_gguf(w, heads)
            } else {
                Ok(w.clone())
            }
        };
        for l in 0..self.num_layers {
            let (hf, blk) = (format!("model.layers.{l}"), format!("blk.{l}"));
            let get = |name: &str| weights[&format!("{hf}.{name}")].clone();
            put(
                format!("{blk}.attn_norm.weight"),
                get("input_layernorm.weight"),
            );
            put(
                format!("{blk}.ffn_norm.weight"),
                get("post_attention_layernorm.weight"),
            );
            put(
                format!("{blk}.attn_q.weight"),
                permute(&get("self_attn.q_proj.weight"), self.num_heads)?,
            );
            put(
                format!("{blk}.attn_k.weight"),
                permute(&get("self_attn.k_proj.weight"), self.num_kv_heads)?,
            );
            put(
                format!("{blk}.attn_v.weight"),
                get("self_attn.v_proj.weight"),
            );
            put(
                format!("{blk}.attn_output.weight"),
                get("self_attn.o_proj.weight"),
            );
            if self.family == Family::Qwen2 {
                for x in ["q", "k", "v"] {
                    put(
                        format!("{blk}.attn_{x}.bias"),
                        get(&format!("self_attn.{x}_proj.bias")),
                    );
                }
            }
            match self.experts {
                None => {
                    put(
                        format!("{blk}.ffn_gate.weight"),
                        get("mlp.gate_proj.weight"),
                    );
                    put(format!("{blk}.ffn_up.weight"), get("mlp.up_proj.weight"));
                    put(
                        format!("{blk}.ffn_down.weight"),
                        get("mlp.down_proj.weight"),
                    );
                }
                Some((experts, _)) => {
                    put(
                        format!("{blk}.ffn_gate_inp.weight"),
                        get("block_sparse_moe.gate.weight"),
                    );
                    for (gguf, hf_name) in [("gate", "w1"), ("up", "w3"), ("down", "w2")] {
                        let each: Vec<Tensor> = (0..experts)
                            .map(|e| get(&format!("block_sparse_moe.experts.{e}.{hf_name}.weight")))
                            .collect();
                        if stacked {
                            put(
                                format!("{blk}.ffn_{gguf}_exps.weight"),
                                Tensor::stack(&each, 0)?,
                            );
                        } else {
                            for (e, t) in each.into_iter().enumerate() {
                                put(format!("{blk}.ffn_{gguf}.{e}.weight"), t);
                            }
                        }
                    }
                }
            }
        }
        let config = self.config_json();
        let key = |k: &str| format!("{arch}.{k}");
        let mut meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            (
                "general.name".into(),
                Value::String(format!("tiny {}", self.family.model_type())),
            ),
            (key("embedding_length"), Value::U32(self.hidden_size as u32)),
            (
                key("feed_forward_length"),
                Value::U32(self.intermediate_size as u32),
            ),
            (key("block_count"), Value::U32(self.num_layers as u32)),
            (
                key("attention.head_count"),
                Value::U32(self.num_heads as u32),
            ),
            (
                key("attention.head_count_kv"),
                Value::U32(self.num_kv_heads as u32),
            ),
            (key("rope.dimension_count"), Value::U32(d as u32)),
            (key("rope.freq_base"), Value::F32(self.rope_theta() as f32)),
            (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (
                key("context_length"),
                Value::U32(self.max_position_embeddings as u32),
            ),
            (key("vocab_size"), Value::U32(self.vocab_size() as u32)),
            (
                "tokenizer.ggml.bos_token_id".into(),
                Value::U32(config["bos_token_id"].as_u64().unwrap() as u32),
            ),
            (
                "tokenizer.ggml.eos_token_id".into(),
                Value::U32(config["eos_token_id"][0].as_u64().unwrap() as u32),
            ),
        ];
        if let Some(window) = self.sliding_window {
            meta.push((key("attention.sliding_window"), Value::U32(window as u32)));
        }
        if let Some((experts, per_token)) = self.experts {
            meta.push((key("expert_count"), Value::U32(experts as u32)));
            meta.push((key("expert_used_count"), Value::U32(per_token as u32)));
        }
        let quantized: Vec<(String, QTensor)> = tensors
            .iter()
            .map(|(name, t)| {
                let matrix =
                    t.rank() > 1 && !name.starts_with("token_embd") && !name.contains("gate_inp");
                let dtype = if matrix { dtype } else { GgmlDType::F32 };
                Ok((name.clone(), QTensor::quantize(t, dtype)?))
            })
            .collect::<candle_core::Result<_>>()?;
        let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> =
            quantized.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let mut file = std::fs::File::create(path)?;
        gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
        Ok(())
    }
}
