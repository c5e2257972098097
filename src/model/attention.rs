//! Causal attention of packed queries against each sequence's own blocks in the paged KV cache.
//!
//! Three implementations of one contract, one chosen per KV cache ([`AttentionBackend`]):
//! - `PagedCpu` (CPU, f32): a kernel reads keys and values straight out of the blocks, one
//!   `(sequence, kv head, query rows)` work item per rayon task. Each output row is computed by
//!   the same sequence of floating-point operations whatever else is in the batch, so results
//!   are batch invariant by construction.
//! - `FlashPaged` (CUDA, bf16, feature `flash-attn`): candle-flash-attn's paged varlen
//!   FlashAttention-2 reads the blocks in place through a block table; nothing is gathered and
//!   no score matrix is written to memory. See [`flash`].
//! - `Gathered` (any device, any dtype): each sequence's keys and values are gathered from the
//!   cache with `index_select` and attention runs as dense matmuls: all single-token decodes as
//!   one padded batch, each multi-token prefill chunk on its own. The fallback wherever the
//!   others do not apply; the tests run it on the CPU against `PagedCpu`.

mod flash;
mod kernels;
mod paged;
mod timer;

#[cfg(feature = "flash-attn")]
pub(crate) use flash::FlashInputs;
pub(crate) use kernels::exp_nonpositive;
pub(crate) use timer::AttentionTimer;

use candle_core::{DType, Device, Tensor};

/// Which attention implementation a KV cache's forward passes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionBackend {
    /// The paged CPU kernel: f32 on the CPU, batch invariant.
    PagedCpu,
    /// Gathered keys and values with dense matmuls: any device and dtype.
    Gathered,
    /// Paged FlashAttention-2 on CUDA: bf16, head size 64 or 128, blocks a multiple of 32
    /// (built with the `flash-attn` feature).
    FlashPaged,
}

/// Head sizes the trimmed FlashAttention build has kernels for (see vendor/candle-flash-attn).
pub const FLASH_HEAD_DIMS: [usize; 2] = [64, 128];
/// The paged kernel reads keys in tiles of 32 rows that must not straddle two blocks
/// (`kBlockN = 32` in `run_mha_fwd_splitkv_paged_dispatch`; candle-flash-attn checks it).
pub const FLASH_BLOCK_MULTIPLE: usize = 32;

/// Why an attention implementation cannot run with a cache's settings, and what to change.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AttentionUnavailable {
    #[error(
        "the paged CPU attention kernel reads f32 or f16 caches on the CPU, not {dtype:?} on {device:?}; use `gathered`"
    )]
    PagedCpu { dtype: DType, device: Device },
    #[error("paged FlashAttention is not in this build; rebuild with `--features flash-attn`")]
    FlashNotBuilt,
    #[error("paged FlashAttention runs on CUDA, not {0:?}")]
    FlashDevice(Device),
    #[error(
        "paged FlashAttention is built for bf16 only, the cache is {0:?}; use `--weights bf16`"
    )]
    FlashDtype(DType),
    #[error("paged FlashAttention is built for head sizes {FLASH_HEAD_DIMS:?}, the model has {0}")]
    FlashHeadDim(usize),
    #[error(
        "paged FlashAttention needs KV blocks of a multiple of {FLASH_BLOCK_MULTIPLE} tokens, not {0}"
    )]
    FlashBlockSize(usize),
}

impl AttentionBackend {
    /// The fastest implementation that runs on `device` with these settings.
    pub fn best(device: &Device, dtype: DType, head_dim: usize, block_size: usize) -> Self {
        if device.is_cpu() && matches!(dtype, DType::F32 | DType::F16) {
            AttentionBackend::PagedCpu
        } else if AttentionBackend::FlashPaged
            .check(device, dtype, head_dim, block_size)
            .is_ok()
        {
            AttentionBackend::FlashPaged
        } else {
            AttentionBackend::Gathered
        }
    }

    /// Why this implementation cannot run with these settings, if it cannot.
    pub fn check(
        self,
        device: &Device,
        dtype: DType,
        head_dim: usize,
        block_size: usize,
    ) -> Result<(), AttentionUnavailable> {
        match self {
            AttentionBackend::Gathered => Ok(()),
            AttentionBackend::PagedCpu
                if device.is_cpu() && matches!(dtype, DType::F32 | DType::F16) =>
            {
                Ok(())
            }
            AttentionBackend::PagedCpu => Err(AttentionUnavailable::PagedCpu {
                dtype,
                device: device.clone(),
            }),
            AttentionBackend::FlashPaged => {
                if !cfg!(feature = "flash-attn") {
                    Err(AttentionUnavailable::FlashNotBuilt)
                } else if !device.is_cuda() {
                    Err(AttentionUnavailable::FlashDevice(device.clone()))
                } else if dtype != DType::BF16 {
                    Err(AttentionUnavailable::FlashDtype(dtype))
                } else if !FLASH_HEAD_DIMS.contains(&head_dim) {
                    Err(AttentionUnavailable::FlashHeadDim(head_dim))
                } else if !block_size.is_multiple_of(FLASH_BLOCK_MULTIPLE) {
                    Err(AttentionUnavailable::FlashBlockSize(block_size))
                } else {
                    Ok(())
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AttentionBackend::PagedCpu => "paged CPU kernel",
            AttentionBackend::Gathered => "gathered matmuls",
            AttentionBackend::FlashPaged => "paged FlashAttention-2",
        }
    }
}

/// Where one sequence's queries sit in the packed batch and which blocks hold its context.
#[derive(Debug, Clone)]
pub(crate) struct SeqSpan {
    /// First packed row of this sequence's queries.
    pub q_start: usize,
    pub q_len: usize,
    /// Position of the first query: the tokens before it are already cached.
    pub start: usize,
    pub blocks: Vec<u32>,
}

impl SeqSpan {
    /// Keys visible to the last query.
    pub(crate) fn context_len(&self) -> usize {
        self.start + self.q_len
    }
}

/// Head layout of the attention inputs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

#[derive(Debug)]
pub(crate) enum AttentionPlan {
    Paged {
        spans: Vec<SeqSpan>,
        block_size: usize,
        window: Option<usize>,
        /// Whether prefixes shared by several sequences are read once for all of them.
        cascade: bool,
        /// Items, tiles and shared prefixes, worked out at the first layer (which brings the
        /// head layout) and the same for every other.
        plan: std::sync::OnceLock<paged::BatchTiling>,
        /// The kernel's working memory, reused by every layer of the pass.
        scratch: std::sync::Mutex<Vec<f32>>,
    },
    Gathered(GatherPlan),
    #[cfg(feature = "flash-attn")]
    Flash(flash::FlashPlan),
}

/// `(num_blocks, block_size, kv_heads, head_dim)` viewed as `(slots, kv_heads * head_dim)`.
fn as_rows(cache: &Tensor) -> candle_core::Result<Tensor> {
    let (blocks, block_size, kvh, d) = cache.dims4()?;
    cache.reshape((blocks * block_size, kvh * d))
}

impl AttentionPlan {
    pub fn new(
        spans: Vec<SeqSpan>,
        block_size: usize,
        backend: AttentionBackend,
        window: Option<usize>,
        cascade: bool,
        device: &Device,
    ) -> candle_core::Result<Self> {
        match backend {
            AttentionBackend::PagedCpu => Ok(AttentionPlan::Paged {
                cascade,
                plan: Default::default(),
                spans,
                block_size,
                window,
                scratch: Default::default(),
            }),
            AttentionBackend::Gathered => Ok(AttentionPlan::Gathered(GatherPlan::new(
                &spans, block_size, window, device,
            )?)),
            #[cfg(feature = "flash-attn")]
            AttentionBackend::FlashPaged if window.is_some() => {
                candle_core::bail!("paged FlashAttention has no sliding window in this build")
            }
            #[cfg(feature = "flash-attn")]
            AttentionBackend::FlashPaged => Ok(AttentionPlan::Flash(flash::FlashPlan::new(
                &FlashInputs::new(&spans, block_size),
                block_size,
                device,
            )?)),
            #[cfg(not(feature = "flash-attn"))]
            AttentionBackend::FlashPaged => {
                candle_core::bail!("paged FlashAttention is not in this build")
            }
        }
    }

    /// Attends packed queries `q` `(T, heads, head_dim)` to the cached keys and values
    /// `(num_blocks, block_size, kv_heads, head_dim)`; returns `(T, heads * head_dim)`.
    pub fn attend(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        heads: Heads,
    ) -> candle_core::Result<Tensor> {
        match self {
            AttentionPlan::Paged {
                spans,
                block_size,
                window,
                cascade,
                plan,
                scratch,
            } if q.dtype() == DType::F32 => paged::attend(
                q,
                &as_rows(k_cache)?,
                &as_rows(v_cache)?,
                spans,
                *block_size,
                heads,
                *window,
                plan.get_or_init(|| {
                    paged::BatchTiling::new(spans, *block_size, heads, *window, *cascade)
                }),
                paged::Isa::best(),
                &mut scratch
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            ),
            // Queries of another dtype than the f32 cache (a caller mixing them): gather.
            AttentionPlan::Paged {
                spans,
                block_size,
                window,
                ..
            } => GatherPlan::new(spans, *block_size, *window, q.device())?.attend(
                q,
                &as_rows(k_cache)?,
                &as_rows(v_cache)?,
                heads,
            ),
            AttentionPlan::Gathered(plan) => {
                plan.attend(q, &as_rows(k_cache)?, &as_rows(v_cache)?, heads)
            }
            #[cfg(feature = "flash-attn")]
            AttentionPlan::Flash(plan) => plan.attend(q, k_cache, v_cache, heads),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gathered path (any device)
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
pub(crate) struct GatherPlan {
    decode: Option<DecodeGroup>,
    prefills: Vec<PrefillSeq>,
    /// `(T,)` u32: packed row -> row of the concatenated group outputs.
    unpermute: Tensor,
}

/// Every single-token query of the batch, padded to the longest context.
#[derive(Debug)]
struct DecodeGroup {
    /// `(B,)` packed rows of the queries.
    rows: Tensor,
    /// `(B * max_ctx,)` cache slots, padding points at slot 0 and is masked.
    slots: Tensor,
    /// `(B, 1, 1, max_ctx)` additive mask: 0 or -inf.
    mask: Tensor,
    batch: usize,
    max_ctx: usize,
}

#[derive(Debug)]
struct PrefillSeq {
    q_start: usize,
    q_len: usize,
    /// `(ctx,)` cache slots of positions `0..ctx`.
    slots: Tensor,
    /// `(q_len, ctx)` causal additive mask.
    mask: Tensor,
}

fn slots_of(span: &SeqSpan, block_size: usize, len: usize) -> impl Iterator<Item = u32> + '_ {
    (0..len).map(move |pos| {
        span.blocks[pos / block_size] * block_size as u32 + (pos % block_size) as u32
    })
}

/// The additive mask of a query at `q_pos` for the key at `pos`: causal, and within the
/// sliding window if there is one.
fn mask_value(pos: usize, q_pos: usize, window: Option<usize>) -> f32 {
    if pos <= q_pos && window.is_none_or(|w| q_pos - pos < w) {
        0.0
    } else {
        f32::NEG_INFINITY
    }
}

impl GatherPlan {
    fn new(
        spans: &[SeqSpan],
        block_size: usize,
        window: Option<usize>,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let total: usize = spans.iter().map(|s| s.q_len).sum();
        let (decodes, prefills): (Vec<&SeqSpan>, Vec<&SeqSpan>) =
            spans.iter().partition(|s| s.q_len == 1);
        let mut order: Vec<usize> = Vec::with_capacity(total);
        let decode = if decodes.is_empty() {
            None
        } else {
            let max_ctx = decodes.iter().map(|s| s.context_len()).max().unwrap_or(1);
            let mut slots = Vec::with_capacity(decodes.len() * max_ctx);
            let mut mask = Vec::with_capacity(decodes.len() * max_ctx);
            for span in &decodes {
                let ctx = span.context_len();
                slots.extend(slots_of(span, block_size, ctx));
                slots.extend(std::iter::repeat_n(0, max_ctx - ctx));
                mask.extend((0..ctx).map(|pos| mask_value(pos, ctx - 1, window)));
                mask.extend(std::iter::repeat_n(f32::NEG_INFINITY, max_ctx - ctx));
                order.push(span.q_start);
            }
            let batch = decodes.len();
            let rows: Vec<u32> = decodes.iter().map(|s| s.q_start as u32).collect();
            Some(DecodeGroup {
                rows: Tensor::from_vec(rows, batch, device)?,
                slots: Tensor::from_vec(slots, batch * max_ctx, device)?,
                mask: Tensor::from_vec(mask, (batch, 1, 1, max_ctx), device)?,
                batch,
                max_ctx,
            })
        };
        let prefills = prefills
            .into_iter()
            .map(|span| {
                let ctx = span.context_len();
                let slots: Vec<u32> = slots_of(span, block_size, ctx).collect();
                let mask: Vec<f32> = (0..span.q_len)
                    .flat_map(|r| (0..ctx).map(move |pos| mask_value(pos, span.start + r, window)))
                    .collect();
                order.extend(span.q_start..span.q_start + span.q_len);
                Ok(PrefillSeq {
                    q_start: span.q_start,
                    q_len: span.q_len,
                    slots: Tensor::from_vec(slots, ctx, device)?,
                    mask: Tensor::from_vec(mask, (span.q_len, ctx), device)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut unpermute = vec![0u32; total];
        for (group_row, &packed_row) in order.iter().enumerate() {
            unpermute[packed_row] = group_row as u32;
        }
        Ok(Self {
            decode,
            prefills,
            unpermute: Tensor::from_vec(unpermute, total, device)?,
        })
    }

    fn attend(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        heads: Heads,
    ) -> candle_core::Result<Tensor> {
        let (kvh, d, g) = (heads.num_kv_heads, heads.head_dim, heads.group());
        let dtype = q.dtype();
        let mut parts = Vec::with_capacity(self.prefills.len() + 1);
        if let Some(dec) = &self.decode {
            let b = dec.batch;
            // (B, kvh, g, d)
            let qd = q
                .index_select(&dec.rows, 0)?
                .to_dtype(DType::F32)?
                .reshape((b, kvh, g, d))?;
            // (B, kvh, max_ctx, d)
            let gather = |cache: &Tensor| -> candle_core::Result<Tensor> {
                cache
                    .index_select(&dec.slots, 0)?
                    .to_dtype(DType::F32)?
                    .reshape((b, dec.max_ctx, kvh, d))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let (k, v) = (gather(k_cache)?, gather(v_cache)?);
            // (B, kvh, g, max_ctx)
            let scores = (qd.matmul(&k.t()?)? * heads.scale() as f64)?.broadcast_add(&dec.mask)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            // (B, kvh, g, d) -> (B, heads * d)
            parts.push(probs.matmul(&v)?.reshape((b, heads.num_heads * d))?);
        }
        for pre in &self.prefills {
            let ctx = pre.mask.dim(1)?;
            // (q_len, kvh, g, d) -> (kvh, g * q_len, d)
            let qp = q
                .narrow(0, pre.q_start, pre.q_len)?
                .to_dtype(DType::F32)?
                .reshape((pre.q_len, kvh, g, d))?
                .permute((1, 2, 0, 3))?
                .contiguous()?
                .reshape((kvh, g * pre.q_len, d))?;
            // (kvh, ctx, d)
            let gather = |cache: &Tensor| -> candle_core::Result<Tensor> {
                cache
                    .index_select(&pre.slots, 0)?
                    .to_dtype(DType::F32)?
                    .reshape((ctx, kvh, d))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (k, v) = (gather(k_cache)?, gather(v_cache)?);
            // (kvh, g, q_len, ctx)
            let scores = (qp.matmul(&k.t()?)? * heads.scale() as f64)?
                .reshape((kvh, g, pre.q_len, ctx))?
                .broadcast_add(&pre.mask)?;
            let probs =
                candle_nn::ops::softmax_last_dim(&scores)?.reshape((kvh, g * pre.q_len, ctx))?;
            // (kvh, g * q_len, d) -> (q_len, heads * d)
            let out = probs
                .matmul(&v)?
                .reshape((kvh, g, pre.q_len, d))?
                .permute((2, 0, 1, 3))?
                .contiguous()?
                .reshape((pre.q_len, heads.num_heads * d))?;
            parts.push(out);
        }
        Tensor::cat(&parts, 0)?
            .index_select(&self.unpermute, 0)?
            .to_dtype(dtype)
    }
}

#[cfg(test)]
/// The paged kernel as a plan runs it: with its batch's shared prefixes.
fn paged_cpu(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spans: &[SeqSpan],
    block_size: usize,
    heads: Heads,
    window: Option<usize>,
) -> candle_core::Result<Tensor> {
    let plan = paged::BatchTiling::new(spans, block_size, heads, window, true);
    paged::attend(
        q,
        k,
        v,
        spans,
        block_size,
        heads,
        window,
        &plan,
        paged::Isa::best(),
        &mut Vec::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let data: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_softmax_exponential_is_accurate() {
        for i in 0..=10_000 {
            let x = -90.0 * i as f32 / 10_000.0;
            let (fast, exact) = (exp_nonpositive(x), x.exp());
            let tolerance = 4e-7 * exact + f32::MIN_POSITIVE * 2.0;
            assert!(
                (fast - exact).abs() <= tolerance.max(if x < -87.0 { 1e-37 } else { 0.0 }),
                "e^{x}: {fast} vs {exact}"
            );
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), exp_nonpositive(-87.0));
    }

    /// The CPU kernel and the gathered path (the CUDA path) must agree on a ragged batch
    /// of decodes and prefill chunks that share blocks, with full causal attention and with
    /// sliding windows shorter than some of the contexts (Mistral v0.1).
    #[test]
    fn paged_kernel_matches_gathered_matmuls() {
        for window in [None, Some(1), Some(3), Some(5), Some(64)] {
            for dtype in [DType::F32, DType::F16] {
                paged_kernel_matches_gathered_matmuls_with(window, dtype);
            }
        }
    }

    fn paged_kernel_matches_gathered_matmuls_with(window: Option<usize>, dtype: DType) {
        let heads = Heads {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 8,
        };
        let block_size = 4;
        let spans = vec![
            SeqSpan {
                q_start: 0,
                q_len: 1,
                start: 6,
                blocks: vec![0, 1],
            },
            SeqSpan {
                q_start: 1,
                q_len: 5,
                start: 0,
                blocks: vec![2, 3],
            },
            SeqSpan {
                q_start: 6,
                q_len: 1,
                start: 0,
                blocks: vec![4],
            },
            // shares block 0 with the first sequence (a common prefix)
            SeqSpan {
                q_start: 7,
                q_len: 3,
                start: 4,
                blocks: vec![0, 5],
            },
        ];
        let t = 10;
        let q = random((t, heads.num_heads * heads.head_dim), 1)
            .reshape((t, heads.num_heads, heads.head_dim))
            .unwrap();
        let k = random((6 * block_size, heads.num_kv_heads * heads.head_dim), 2);
        let v = random((6 * block_size, heads.num_kv_heads * heads.head_dim), 3);
        let (k, v) = (k.to_dtype(dtype).unwrap(), v.to_dtype(dtype).unwrap());
        let paged = paged_cpu(&q, &k, &v, &spans, block_size, heads, window).unwrap();
        let gathered = GatherPlan::new(&spans, block_size, window, &Device::Cpu)
            .unwrap()
            .attend(&q, &k, &v, heads)
            .unwrap();
        let diff = (paged - gathered)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            diff < 1e-5,
            "window {window:?}, {dtype:?}: max difference {diff}"
        );
    }
}
