//! The paged key/value store: one preallocated pool of fixed-size blocks per layer.
//!
//! Which block belongs to which sequence is the engine's business (its block manager);
//! the cache only stores rows. Each layer's keys (and values) are one tensor in the layout
//! paged FlashAttention reads, `(num_blocks, block_size, kv_heads, head_dim)`. Flattened, the
//! same memory is `(slots, kv_heads * head_dim)`: a row (slot) is `block * block_size + offset`
//! and holds one token's keys or values for all kv heads, which is how new keys are written
//! and how the CPU kernel and the gathered path read them.

use super::attention::AttentionBackend;
use super::batch::Slots;
use super::{ModelConfig, ModelError};
use candle_core::{DType, Device, Tensor};

/// How the KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvFormat {
    /// f16 on the CPU: half the bytes of f32 for attention to read and twice the tokens in
    /// the same memory, within the quality gate (`throng eval --kv-format f16`); the model's
    /// own dtype on a GPU.
    #[default]
    Auto,
    /// The model's activation dtype (f32 on the CPU, bf16 or f16 on a GPU).
    Model,
    F32,
    F16,
}

impl KvFormat {
    pub const ALL: [KvFormat; 4] = [
        KvFormat::Auto,
        KvFormat::Model,
        KvFormat::F32,
        KvFormat::F16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KvFormat::Auto => "auto",
            KvFormat::Model => "model",
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
        }
    }

    /// The format `name` ([`KvFormat::name`]) names.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The dtype a cache in this format holds for a model computing in `activations` on
    /// `device`.
    pub fn dtype(self, device: &Device, activations: DType) -> DType {
        match self {
            // The paged CPU kernel widens f16 rows exactly; other activation dtypes on the
            // CPU take the gathered path, which gains nothing from a narrower cache.
            KvFormat::Auto if device.is_cpu() && activations == DType::F32 => DType::F16,
            KvFormat::Auto | KvFormat::Model => activations,
            KvFormat::F32 => DType::F32,
            KvFormat::F16 => DType::F16,
        }
    }
}

#[derive(Debug)]
pub struct KvCache {
    /// `(keys, values)` per layer, each `(num_blocks, block_size, kv_heads, head_dim)`.
    layers: Vec<(Tensor, Tensor)>,
    block_size: usize,
    num_blocks: usize,
    kv_heads: usize,
    head_dim: usize,
    device: Device,
    dtype: DType,
    attention: AttentionBackend,
    /// The model's sliding attention window, which every attention plan over this cache
    /// applies.
    window: Option<usize>,
    /// Whether the paged CPU kernel reads prefixes shared by several sequences once for all
    /// of them (the same bits either way). Off unless `THRONG_CASCADE=1`: measured on 64
    /// agents' decode steps it was slower than each sequence reading its whole context, with
    /// 240, 2,000 and 8,000 shared tokens alike (the shared keys stay in the CPU's caches,
    /// and the extra phases cost more than the reads they save; see the book's Engine
    /// chapter).
    cascade: bool,
}

impl KvCache {
    /// Bytes one block takes across all layers, keys and values.
    pub(crate) fn bytes_per_block(cfg: &ModelConfig, block_size: usize, dtype: DType) -> usize {
        2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.size_in_bytes()
    }

    /// How many blocks fit in `budget` bytes.
    pub(crate) fn blocks_for_budget(
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
        let shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim);
        let zeros = || -> candle_core::Result<Tensor> {
            if device.is_cpu() && dtype == DType::F16 {
                // From zeroed u16s: the allocator hands out pages that stay untouched until a
                // block is written, as f32 zeros do; `vec![f16::ZERO; n]` would write every
                // page of the pool at start-up.
                use half::vec::HalfBitsVecExt;
                let n = num_blocks * block_size * cfg.num_kv_heads * cfg.head_dim;
                let halves: Vec<half::f16> = vec![0u16; n].reinterpret_into();
                Tensor::from_vec(halves, shape, device)
            } else {
                Tensor::zeros(shape, dtype, device)
            }
        };
        let alloc = || -> candle_core::Result<Vec<(Tensor, Tensor)>> {
            (0..cfg.num_layers)
                .map(|_| Ok((zeros()?, zeros()?)))
                .collect()
        };
        let layers = alloc().map_err(|e| ModelError::during("allocating the KV cache", e))?;
        let attention = match AttentionBackend::best(device, dtype, cfg.head_dim, block_size) {
            // The trimmed FlashAttention build has causal kernels only.
            AttentionBackend::FlashPaged if cfg.sliding_window.is_some() => {
                AttentionBackend::Gathered
            }
            best => best,
        };
        Ok(Self {
            layers,
            block_size,
            num_blocks,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            device: device.clone(),
            dtype,
            attention,
            window: cfg.sliding_window,
            cascade: std::env::var("THRONG_CASCADE").as_deref() == Ok("1"),
        })
    }

    /// Bytes one block takes on the device: keys and values of every layer.
    pub fn block_bytes(&self) -> usize {
        2 * self.layers.len()
            * self.block_size
            * self.kv_heads
            * self.head_dim
            * self.dtype.size_in_bytes()
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

    /// The attention implementation forward passes over this cache use (the fastest that
    /// applies, unless [`KvCache::set_attention`] chose another).
    pub fn attention(&self) -> AttentionBackend {
        self.attention
    }

    /// Uses `backend` for attention, if it can run on this cache's device, dtype, head size
    /// and block size.
    pub fn set_attention(&mut self, backend: AttentionBackend) -> Result<(), ModelError> {
        backend
            .check(&self.device, self.dtype, self.head_dim, self.block_size)
            .map_err(|e| ModelError::InvalidRequest(e.to_string()))?;
        if backend == AttentionBackend::FlashPaged
            && let Some(window) = self.window
        {
            return Err(ModelError::InvalidRequest(format!(
                "the model attends over a sliding window of {window} tokens, which the paged \
                 FlashAttention build does not implement; use `gathered`"
            )));
        }
        self.attention = backend;
        Ok(())
    }

    /// Whether the paged CPU kernel reads shared prefixes once per batch.
    pub fn cascade(&self) -> bool {
        self.cascade
    }

    /// Keys a query sees, itself included, if attention looks back over a window only.
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Elements in one slot: `kv_heads * head_dim`.
    pub(crate) fn row_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes the whole pool takes on its device.
    pub fn bytes(&self) -> usize {
        2 * self.layers.len()
            * self.num_blocks
            * self.block_size
            * self.row_width()
            * self.dtype.size_in_bytes()
    }

    /// `(num_blocks, block_size, kv_heads, head_dim)` viewed as `(slots, kv_heads * head_dim)`:
    /// the same memory, no copy.
    fn rows(&self, t: &Tensor) -> candle_core::Result<Tensor> {
        t.reshape((self.num_blocks * self.block_size, self.row_width()))
    }

    /// Stores one layer's new keys and values `(T, row_width)` at `slots`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        slots: &Slots,
    ) -> candle_core::Result<()> {
        let (kc, vc) = &self.layers[layer];
        match &slots.repeated {
            Some(repeated) => {
                self.rows(kc)?
                    .scatter_set(repeated, &k.to_dtype(self.dtype)?, 0)?;
                self.rows(vc)?
                    .scatter_set(repeated, &v.to_dtype(self.dtype)?, 0)
            }
            None => {
                let write = WriteRows {
                    slots: &slots.rows,
                    width: self.row_width(),
                };
                // A bf16 or f16 model's keys go through f32, exactly: converting them on to
                // the cache's type rounds as converting them directly does.
                let f32_rows = |t: &Tensor| t.to_dtype(candle_core::DType::F32)?.contiguous();
                kc.inplace_op2(&f32_rows(k)?, &write)?;
                vc.inplace_op2(&f32_rows(v)?, &write)
            }
        }
    }

    /// One layer's keys and values, each `(num_blocks, block_size, kv_heads, head_dim)`.
    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}

/// Rows of f32 keys or values copied (converted to the cache's type, rounding to nearest as
/// `to_dtype` does) into the cache rows `slots` names: on the CPU, one pass over the new
/// rows instead of a scatter over an index as wide as the values.
struct WriteRows<'a> {
    slots: &'a [u32],
    width: usize,
}

impl candle_core::InplaceOp2 for WriteRows<'_> {
    fn name(&self) -> &'static str {
        "kv-cache-write-rows"
    }

    fn cpu_fwd(
        &self,
        cache: &mut candle_core::CpuStorage,
        cache_layout: &candle_core::Layout,
        rows: &candle_core::CpuStorage,
        rows_layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use candle_core::CpuStorage;
        use half::slice::HalfFloatSliceExt;
        let (Some((c0, c1)), Some((r0, r1))) = (
            cache_layout.contiguous_offsets(),
            rows_layout.contiguous_offsets(),
        ) else {
            candle_core::bail!("the KV cache writes contiguous rows only");
        };
        let w = self.width;
        let CpuStorage::F32(rows) = rows else {
            candle_core::bail!("the KV cache is written from f32 keys and values");
        };
        let rows = &rows[r0..r1];
        if rows.len() != self.slots.len() * w {
            candle_core::bail!(
                "{} values for {} slots of {w}",
                rows.len(),
                self.slots.len()
            );
        }
        let fits = |len: usize| self.slots.iter().all(|&s| (s as usize + 1) * w <= len);
        match cache {
            CpuStorage::F32(cache) if fits(c1 - c0) => {
                let cache = &mut cache[c0..c1];
                for (&slot, row) in self.slots.iter().zip(rows.chunks_exact(w)) {
                    cache[slot as usize * w..][..w].copy_from_slice(row);
                }
            }
            CpuStorage::F16(cache) if fits(c1 - c0) => {
                let cache = &mut cache[c0..c1];
                for (&slot, row) in self.slots.iter().zip(rows.chunks_exact(w)) {
                    cache[slot as usize * w..][..w].convert_from_f32_slice(row);
                }
            }
            CpuStorage::BF16(cache) if fits(c1 - c0) => {
                let cache = &mut cache[c0..c1];
                for (&slot, row) in self.slots.iter().zip(rows.chunks_exact(w)) {
                    cache[slot as usize * w..][..w].convert_from_f32_slice(row);
                }
            }
            CpuStorage::F32(_) | CpuStorage::F16(_) | CpuStorage::BF16(_) => {
                candle_core::bail!("a slot past the KV cache's rows")
            }
            _ => candle_core::bail!("the KV cache holds f32, f16 or bf16 on the CPU"),
        }
        Ok(())
    }
}
