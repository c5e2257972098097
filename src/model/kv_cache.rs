//! The paged key/value store: one preallocated pool of fixed-size blocks per layer.
//!
//! Which block belongs to which sequence is the engine's business (its block manager);
//! the cache only stores rows. A row (slot) is `block * block_size + offset` and holds one
//! token's keys or values for all kv heads: `(slots, kv_heads * head_dim)` per layer.

use super::{ModelConfig, ModelError};
use candle_core::{DType, Device, Tensor};

#[derive(Debug)]
pub struct KvCache {
    /// `(keys, values)` per layer, each `(num_blocks * block_size, kv_heads * head_dim)`.
    layers: Vec<(Tensor, Tensor)>,
    block_size: usize,
    num_blocks: usize,
    row_width: usize,
    device: Device,
    dtype: DType,
}

impl KvCache {
    /// Bytes one block takes across all layers, keys and values.
    pub fn bytes_per_block(cfg: &ModelConfig, block_size: usize, dtype: DType) -> usize {
        2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.size_in_bytes()
    }

    /// How many blocks fit in `budget` bytes.
    pub fn blocks_for_budget(
        cfg: &ModelConfig,
        block_size: usize,
        dtype: DType,
        budget: usize,
    ) -> usize {
        budget / Self::bytes_per_block(cfg, block_size, dtype)
    }

    /// Allocates the whole pool up front so that running out of memory happens here, at
    /// start-up, and not in the middle of a long simulation.
    pub fn new(
        cfg: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, ModelError> {
        if num_blocks == 0 || block_size == 0 {
            return Err(ModelError::InvalidRequest(format!(
                "a KV cache needs at least one block of at least one token (got {num_blocks} blocks of {block_size})"
            )));
        }
        let row_width = cfg.num_kv_heads * cfg.head_dim;
        let slots = num_blocks * block_size;
        let alloc = || -> candle_core::Result<Vec<(Tensor, Tensor)>> {
            (0..cfg.num_layers)
                .map(|_| {
                    Ok((
                        Tensor::zeros((slots, row_width), dtype, device)?,
                        Tensor::zeros((slots, row_width), dtype, device)?,
                    ))
                })
                .collect()
        };
        let layers = alloc().map_err(|e| ModelError::during("allocating the KV cache", e))?;
        Ok(Self {
            layers,
            block_size,
            num_blocks,
            row_width,
            device: device.clone(),
            dtype,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements in one slot: `kv_heads * head_dim`.
    pub(crate) fn row_width(&self) -> usize {
        self.row_width
    }

    /// Stores one layer's new keys and values `(T, row_width)` at `slots` `(T, row_width)`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        slots: &Tensor,
    ) -> candle_core::Result<()> {
        let (kc, vc) = &self.layers[layer];
        kc.scatter_set(slots, &k.to_dtype(self.dtype)?, 0)?;
        vc.scatter_set(slots, &v.to_dtype(self.dtype)?, 0)
    }

    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}
