//! The network: Llama-architecture weights (safetensors or GGUF), a ragged batched forward pass
//! and the paged key/value cache it reads and writes.
//!
//! The engine hands the model one [`BatchInputs`] per step: the new tokens of many sequences
//! packed end to end, each sequence with its own position and KV block table. Every linear
//! layer runs once over the packed tokens; only attention looks at a sequence's own blocks.

mod attention;
mod batch;
mod config;
pub(crate) mod cpu;
mod error;
mod files;
mod finite;
mod fused;
mod gguf;
pub mod identity;
mod kv_cache;
mod linear;
mod llama;
pub mod loader;
mod preset;
pub mod profile;
pub mod quant;
mod rope;
mod safetensors;
pub mod synthetic;

pub use attention::{
    AttentionBackend, AttentionUnavailable, FLASH_BLOCK_MULTIPLE, FLASH_HEAD_DIMS,
};
pub use batch::{BatchInputs, SeqChunk};
pub use config::{
    ConfigProblem, Experts, Family, Llama3RopeScaling, ModelConfig, RopeConfig, RopeStyle,
};
pub use error::ModelError;
pub use identity::{ModelIdentity, Origin};
pub use kv_cache::{KvCache, KvFormat};
pub use linear::WeightFormat;
pub use llama::Llama;
pub use loader::{LoadOptions, LoadedModel, ModelSource};
pub use preset::{DEFAULT_MODEL, Preset, PresetSource, Presets};

use candle_core::{DType, Device, Tensor};

/// A decoder-only language model that serves ragged batches against a paged KV cache.
pub trait CausalLm: Send + Sync {
    fn config(&self) -> &ModelConfig;
    fn device(&self) -> &Device;
    /// The dtype of activations and of the KV cache.
    fn dtype(&self) -> DType;
    /// Runs one step: appends the batch's keys and values to `kv` and returns next-token
    /// logits, `(batch.logit_rows(), vocab)` in f32, one row per chunk that asked for them.
    fn forward(&self, batch: &BatchInputs, kv: &mut KvCache) -> Result<Tensor, ModelError>;
    /// Per-operation timings of the forward passes so far, if profiling is on.
    fn profile(&self) -> Option<&profile::Profile> {
        None
    }
}
