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
mod timer;

#[cfg(feature = "flash-attn")]
pub(crate) use flash::FlashInputs;
pub(crate) use timer::AttentionTimer;

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

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
        "the paged CPU attention kernel runs f32 on the CPU, not {dtype:?} on {device:?}; use `gathered`"
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
        if device.is_cpu() && dtype == DType::F32 {
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
            AttentionBackend::PagedCpu if device.is_cpu() && dtype == DType::F32 => Ok(()),
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
        device: &Device,
    ) -> candle_core::Result<Self> {
        match backend {
            AttentionBackend::PagedCpu => Ok(AttentionPlan::Paged {
                spans,
                block_size,
                window,
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
            } if q.dtype() == DType::F32 => paged_cpu(
                q,
                &as_rows(k_cache)?,
                &as_rows(v_cache)?,
                spans,
                *block_size,
                heads,
                *window,
            ),
            // Queries of another dtype than the f32 cache (a caller mixing them): gather.
            AttentionPlan::Paged {
                spans,
                block_size,
                window,
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
// Paged CPU kernel
// ---------------------------------------------------------------------------------------------

/// Query rows per work item: small enough to spread a long prefill over every core.
const ROWS_PER_ITEM: usize = 16;

fn cpu_f32(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    // Contiguous f32 CPU tensors flatten without copying the storage twice.
    t.flatten_all()?.to_vec1::<f32>()
}

fn with_cpu_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(cpu), Some((lo, hi))) => Ok(f(&cpu.as_slice::<f32>()?[lo..hi])),
        _ => candle_core::bail!("paged attention needs contiguous f32 CPU tensors"),
    }
}

fn paged_cpu(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    spans: &[SeqSpan],
    block_size: usize,
    heads: Heads,
    window: Option<usize>,
) -> candle_core::Result<Tensor> {
    let (t, h, d) = q.dims3()?;
    let q = cpu_f32(&q.contiguous()?)?;
    let items: Vec<(usize, usize, usize, usize)> = spans
        .iter()
        .enumerate()
        .flat_map(|(s, span)| {
            (0..heads.num_kv_heads).flat_map(move |kvh| {
                (0..span.q_len)
                    .step_by(ROWS_PER_ITEM)
                    .map(move |r0| (s, kvh, r0, (r0 + ROWS_PER_ITEM).min(span.q_len)))
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = with_cpu_slice(k_cache, |k| {
        with_cpu_slice(v_cache, |v| {
            items
                .par_iter()
                .map(|&(s, kvh, r0, r1)| {
                    let cache = PagedKv {
                        k,
                        v,
                        blocks: &spans[s].blocks,
                        block_size,
                        heads,
                        kvh,
                    };
                    attend_rows(&q, &cache, &spans[s], r0..r1, heads, window)
                })
                .collect()
        })
    })??;
    let mut out = vec![0f32; t * h * d];
    let g = heads.group();
    for (&(s, kvh, r0, r1), result) in items.iter().zip(&results) {
        let span = &spans[s];
        for (i, r) in (r0..r1).enumerate() {
            let dst = ((span.q_start + r) * h + kvh * g) * d;
            out[dst..dst + g * d].copy_from_slice(&result[i * g * d..(i + 1) * g * d]);
        }
    }
    Tensor::from_vec(out, (t, h * d), &Device::Cpu)
}

/// One kv head of one sequence, read in place from the cache.
struct PagedKv<'a> {
    k: &'a [f32],
    v: &'a [f32],
    blocks: &'a [u32],
    block_size: usize,
    heads: Heads,
    kvh: usize,
}

impl PagedKv<'_> {
    /// Calls `f(pos, key_or_value_row)` for positions `0..len` in order, walking the block
    /// table once instead of dividing per position.
    #[inline(always)]
    fn for_each_row(&self, cache: &[f32], len: usize, mut f: impl FnMut(usize, &[f32])) {
        let d = self.heads.head_dim;
        let stride = self.heads.num_kv_heads * d;
        for (b, &block) in self.blocks.iter().enumerate() {
            let first = b * self.block_size;
            if first >= len {
                break;
            }
            let base = block as usize * self.block_size * stride + self.kvh * d;
            for o in 0..self.block_size.min(len - first) {
                let at = base + o * stride;
                f(first + o, &cache[at..at + d]);
            }
        }
    }
}

/// Attention of query rows `rows` of `span` (all heads of one kv group); returns
/// `(rows, group, head_dim)` flattened.
///
/// Compiled three times: with AVX-512 or AVX2 (chosen at run time where the CPU has it) and
/// for the baseline target. All run the same operations in the same order (no fused
/// multiply-add), so the results do not depend on which one a machine picks.
fn attend_rows(
    q: &[f32],
    kv: &PagedKv<'_>,
    span: &SeqSpan,
    rows: std::ops::Range<usize>,
    heads: Heads,
    window: Option<usize>,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F, checked just above.
        return unsafe { attend_rows_avx512(q, kv, span, rows, heads, window) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { attend_rows_avx2(q, kv, span, rows, heads, window) };
    }
    attend_rows_with::<Portable>(q, kv, span, rows, heads, window)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn attend_rows_avx512(
    q: &[f32],
    kv: &PagedKv<'_>,
    span: &SeqSpan,
    rows: std::ops::Range<usize>,
    heads: Heads,
    window: Option<usize>,
) -> Vec<f32> {
    attend_rows_with::<Avx512>(q, kv, span, rows, heads, window)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_rows_avx2(
    q: &[f32],
    kv: &PagedKv<'_>,
    span: &SeqSpan,
    rows: std::ops::Range<usize>,
    heads: Heads,
    window: Option<usize>,
) -> Vec<f32> {
    attend_rows_with::<Avx2>(q, kv, span, rows, heads, window)
}

#[inline(always)]
fn attend_rows_with<K: Kernels>(
    q: &[f32],
    kv: &PagedKv<'_>,
    span: &SeqSpan,
    rows: std::ops::Range<usize>,
    heads: Heads,
    window: Option<usize>,
) -> Vec<f32> {
    let (h, d, g) = (heads.num_heads, heads.head_dim, heads.group());
    let scale = heads.scale();
    let n = rows.len() * g;
    let ctx = span.start + rows.end; // keys visible to the last row
    // Row `ri` (query position start + rows.start + ri) sees positions 0..=that position.
    let first_row_seeing = |pos: usize| (pos + 1).saturating_sub(span.start + rows.start + 1);
    let queries: Vec<&[f32]> = rows
        .clone()
        .flat_map(|r| (0..g).map(move |gi| ((span.q_start + r) * h + kv.kvh * g + gi) * d))
        .map(|at| &q[at..at + d])
        .collect();
    // scores[(row, head)][pos]
    let mut scores = vec![0f32; n * ctx];
    let scored = K::score_blocked(
        &queries,
        kv,
        ctx,
        |i| span.start + rows.start + i / g + 1,
        scale,
        &mut scores,
    );
    if !scored {
        let mut dots = vec![0f32; n];
        kv.for_each_row(kv.k, ctx, |pos, key| {
            let first = first_row_seeing(pos) * g;
            K::dots(&queries[first..], key, &mut dots[first..]);
            for i in first..n {
                scores[i * ctx + pos] = dots[i] * scale;
            }
        });
    }
    let mut norms = vec![0f32; n];
    for (i, norm) in norms.iter_mut().enumerate() {
        let visible = span.start + rows.start + i / g + 1;
        // Keys before a sliding window get weight zero (adding zeros changes no sum).
        let first = window.map_or(0, |w| visible.saturating_sub(w));
        let row = &mut scores[i * ctx..][..visible];
        let max = row[first..]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        for s in row[first..].iter_mut() {
            *s = exp_nonpositive(*s - max);
        }
        row[..first].fill(0.0);
        *norm = K::sum(row);
    }
    let mut out = vec![0f32; n * d];
    // Query `i` sees positions `0..visible(i)`.
    let visible = |i: usize| span.start + rows.start + i / g + 1;
    match d {
        64 => weigh_values_blocked::<64, 4>(kv, &scores, ctx, n, visible, &mut out),
        128 => weigh_values_blocked::<128, 2>(kv, &scores, ctx, n, visible, &mut out),
        _ => kv.for_each_row(kv.v, ctx, |pos, value| {
            for i in first_row_seeing(pos) * g..n {
                axpy(&mut out[i * d..(i + 1) * d], scores[i * ctx + pos], value);
            }
        }),
    }
    for (chunk, norm) in out.chunks_exact_mut(d).zip(&norms) {
        let inv = 1.0 / norm;
        chunk.iter_mut().for_each(|x| *x *= inv);
    }
    out
}

/// `e^x` for `x <= 0` (softmax weights), in basic arithmetic only, so that the loop over a
/// row vectorises and gives the same bits on every instruction set: `x = n ln 2 + r` with
/// `|r| <= ln 2 / 2`, `e^r` by its degree-6 Taylor polynomial (relative error below 2e-7),
/// times `2^n` built from the exponent bits. Below -87 the weight is 0 (an f32 underflow).
#[inline(always)]
pub(super) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 and the rest (Cody-Waite).
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding then subtracting 1.5 * 2^23 rounds to the nearest integer in f32 arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// The inner products of the kernel, per instruction set. Every implementation sums in the
/// same order: sixteen lanes, then pairwise halving, then the tail.
trait Kernels {
    fn dot(a: &[f32], b: &[f32]) -> f32;

    /// `out[i] = dot(queries[i], key)`: one key against several queries (a kv head's group),
    /// each summed exactly as [`Kernels::dot`] would.
    #[inline(always)]
    fn dots(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
        for (o, q) in out.iter_mut().zip(queries) {
            *o = Self::dot(q, key);
        }
    }

    /// Fills `scores[i * ctx + pos]` with `dot(queries[i], key[pos]) * scale` for every
    /// `pos < visible(i)` (and maybe a few positions beyond, which nothing reads), each dot
    /// summed exactly as [`Kernels::dot`]; returns false where this instruction set has no
    /// blocked form for this head size, and the caller scores key by key.
    #[inline(always)]
    fn score_blocked(
        _queries: &[&[f32]],
        _kv: &PagedKv<'_>,
        _ctx: usize,
        _visible: impl Fn(usize) -> usize,
        _scale: f32,
        _scores: &mut [f32],
    ) -> bool {
        false
    }

    /// The sum of `a`, in the order of [`Kernels::dot`].
    #[inline(always)]
    fn sum(a: &[f32]) -> f32 {
        const LANES: usize = 16;
        let mut acc = [0f32; LANES];
        let chunks = a.chunks_exact(LANES);
        let rest = chunks.remainder();
        for x in chunks {
            for i in 0..LANES {
                acc[i] += x[i];
            }
        }
        let mut width = LANES / 2;
        while width > 0 {
            for i in 0..width {
                acc[i] += acc[i + width];
            }
            width /= 2;
        }
        rest.iter().fold(acc[0], |s, x| s + x)
    }
}

struct Portable;

impl Kernels for Portable {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        const LANES: usize = 16;
        let mut acc = [0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..LANES {
                acc[i] += x[i] * y[i];
            }
        }
        let mut width = LANES / 2;
        while width > 0 {
            for i in 0..width {
                acc[i] += acc[i + width];
            }
            width /= 2;
        }
        let mut sum = acc[0];
        for (x, y) in ra.iter().zip(rb) {
            sum += x * y;
        }
        sum
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx2 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: `Avx2` is only used from `attend_rows_avx2`, which runs on AVX2 CPUs.
        unsafe { dot_avx2(a, b) }
    }

    #[inline(always)]
    fn dots(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
        for (qs, os) in queries.chunks(4).zip(out.chunks_mut(4)) {
            // SAFETY: as above.
            unsafe { dots4_avx2(qs, key, os) };
        }
    }
}

/// Up to four dot products against one key, loading each slice of the key once; every
/// product is summed in [`Portable::dot`]'s order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn dots4_avx2(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let m = queries.len();
    let n = queries
        .iter()
        .map(|q| q.len())
        .min()
        .unwrap_or(0)
        .min(key.len());
    let full = n / 16 * 16;
    // SAFETY: loads read 8 floats at `i` or `i + 8` with `i + 16 <= full <= len` of every
    // slice; queries beyond `m` are never read.
    unsafe {
        let zero = _mm256_setzero_ps();
        let (mut lo, mut hi) = ([zero; 4], [zero; 4]);
        let mut i = 0;
        while i < full {
            let k_lo = _mm256_loadu_ps(key.as_ptr().add(i));
            let k_hi = _mm256_loadu_ps(key.as_ptr().add(i + 8));
            for j in 0..m {
                let q = queries[j].as_ptr().add(i);
                lo[j] = _mm256_add_ps(lo[j], _mm256_mul_ps(_mm256_loadu_ps(q), k_lo));
                hi[j] = _mm256_add_ps(hi[j], _mm256_mul_ps(_mm256_loadu_ps(q.add(8)), k_hi));
            }
            i += 16;
        }
        for j in 0..m {
            let s8 = _mm256_add_ps(lo[j], hi[j]);
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            let mut sum = _mm_cvtss_f32(s1);
            for t in full..n {
                sum += queries[j][t] * key[t];
            }
            out[j] = sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0f32];
    dots4_avx2(&[a], b, &mut out);
    out[0]
}

#[inline(always)]
fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o += w * x;
    }
}

/// `out[i] = sum over pos < visible(i) of scores[i][pos] * value[pos]`, for `R` queries at a
/// time whose sums stay in registers while the values stream past once: the same products
/// added in the same order as one [`axpy`] per position, so the same bits, with a quarter of
/// the loads and no stores in the loop.
#[inline(always)]
fn weigh_values_blocked<const D: usize, const R: usize>(
    kv: &PagedKv<'_>,
    scores: &[f32],
    ctx: usize,
    n: usize,
    visible: impl Fn(usize) -> usize,
    out: &mut [f32],
) {
    for i0 in (0..n).step_by(R) {
        let r_used = R.min(n - i0);
        let seen: [usize; R] =
            std::array::from_fn(|r| if r < r_used { visible(i0 + r) } else { 0 });
        let mut acc = [[0f32; D]; R];
        kv.for_each_row(kv.v, seen[r_used - 1], |pos, value| {
            let value: &[f32; D] = value.try_into().expect("invariant: head_dim is D");
            for r in 0..R {
                if pos < seen[r] {
                    let w = scores[(i0 + r) * ctx + pos];
                    for j in 0..D {
                        acc[r][j] += w * value[j];
                    }
                }
            }
        });
        for (r, acc) in acc.iter().enumerate().take(r_used) {
            out[(i0 + r) * D..(i0 + r + 1) * D].copy_from_slice(acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx512 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut out = [0f32];
        Self::dots(&[a], b, &mut out);
        out[0]
    }

    #[inline(always)]
    fn dots(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
        for (qs, os) in queries.chunks(8).zip(out.chunks_mut(8)) {
            // SAFETY: `Avx512` is only used from `attend_rows_avx512`, on AVX-512F CPUs.
            unsafe { dots8_avx512(qs, key, os) };
        }
    }

    #[inline(always)]
    fn score_blocked(
        queries: &[&[f32]],
        kv: &PagedKv<'_>,
        ctx: usize,
        visible: impl Fn(usize) -> usize,
        scale: f32,
        scores: &mut [f32],
    ) -> bool {
        // SAFETY (all three): `Avx512` is only used from `attend_rows_avx512`.
        match kv.heads.head_dim {
            64 => unsafe { score4_avx512::<4>(queries, kv, ctx, visible, scale, scores) },
            128 => unsafe { score4_avx512::<8>(queries, kv, ctx, visible, scale, scores) },
            _ => return false,
        }
        true
    }
}

/// [`Kernels::score_blocked`] for a head of `C * 16` dimensions: four queries at a time stay
/// in registers while the keys stream past once, and their four sums are reduced together by a
/// transposing tree that adds exactly the pairs [`Portable::dot`]'s halving adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
// The chunk index `c` addresses the key pointer and the query registers alike.
#[allow(clippy::needless_range_loop)]
fn score4_avx512<const C: usize>(
    queries: &[&[f32]],
    kv: &PagedKv<'_>,
    ctx: usize,
    visible: impl Fn(usize) -> usize,
    scale: f32,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = queries.len();
    for i0 in (0..n).step_by(4) {
        let m = 4.min(n - i0);
        let limit = visible(i0 + m - 1).min(ctx);
        // SAFETY: every query and key has `C * 16` floats (the head size), checked by the
        // caller's match; the missing queries of a last group are zeros and never stored.
        unsafe {
            let q: [[__m512; C]; 4] = std::array::from_fn(|j| {
                std::array::from_fn(|c| {
                    if j < m {
                        _mm512_loadu_ps(queries[i0 + j].as_ptr().add(16 * c))
                    } else {
                        _mm512_setzero_ps()
                    }
                })
            });
            kv.for_each_row(kv.k, limit, |pos, key| {
                let mut acc = [_mm512_setzero_ps(); 4];
                for c in 0..C {
                    let k = _mm512_loadu_ps(key.as_ptr().add(16 * c));
                    for j in 0..4 {
                        acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(q[j][c], k));
                    }
                }
                // Lanes i + 8, for a and b side by side, then c and d.
                let ab = _mm512_add_ps(
                    _mm512_shuffle_f32x4(acc[0], acc[1], 0b01_00_01_00),
                    _mm512_shuffle_f32x4(acc[0], acc[1], 0b11_10_11_10),
                );
                let cd = _mm512_add_ps(
                    _mm512_shuffle_f32x4(acc[2], acc[3], 0b01_00_01_00),
                    _mm512_shuffle_f32x4(acc[2], acc[3], 0b11_10_11_10),
                );
                // Lanes i + 4: one 128-bit lane per query.
                let v = _mm512_add_ps(
                    _mm512_shuffle_f32x4(ab, cd, 0b10_00_10_00),
                    _mm512_shuffle_f32x4(ab, cd, 0b11_01_11_01),
                );
                // Lanes i + 2, then i + 1, within each 128-bit lane.
                let y = _mm512_add_ps(v, _mm512_permute_ps(v, 0b11_10_11_10));
                let z = _mm512_add_ps(y, _mm512_permute_ps(y, 0b01_01_01_01));
                let mut sums = [0f32; 16];
                _mm512_storeu_ps(sums.as_mut_ptr(), z);
                for j in 0..m {
                    scores[(i0 + j) * ctx + pos] = sums[4 * j] * scale;
                }
            });
        }
    }
}

/// Up to eight dot products against one key, loading each slice of the key once; one 16-lane
/// register holds exactly the sixteen partial sums of [`Portable::dot`], reduced in its order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn dots8_avx512(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let m = queries.len();
    let n = queries
        .iter()
        .map(|q| q.len())
        .min()
        .unwrap_or(0)
        .min(key.len());
    let full = n / 16 * 16;
    // SAFETY: loads read 16 floats at `i` with `i + 16 <= full <= len` of every slice;
    // queries beyond `m` are never read.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 8];
        let mut i = 0;
        while i < full {
            let k = _mm512_loadu_ps(key.as_ptr().add(i));
            for j in 0..m {
                let q = _mm512_loadu_ps(queries[j].as_ptr().add(i));
                acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(q, k));
            }
            i += 16;
        }
        for j in 0..m {
            let s8 = _mm256_add_ps(
                _mm512_castps512_ps256(acc[j]),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[j]), 1)),
            );
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
            let mut sum = _mm_cvtss_f32(s1);
            for t in full..n {
                sum += queries[j][t] * key[t];
            }
            out[j] = sum;
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

    /// The AVX2 inner product sums in the portable order, bit for bit.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_and_portable_dot_products_are_identical() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        for len in [1, 15, 16, 17, 64, 100] {
            let a = random((1, len), len as u64)
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let b = random((1, len), 99)
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            // SAFETY: AVX2 checked above.
            let fast = unsafe { dot_avx2(&a, &b) };
            assert_eq!(
                fast.to_bits(),
                Portable::dot(&a, &b).to_bits(),
                "length {len}"
            );
        }
    }

    /// Every instruction set the CPU offers computes the paged kernel with the same bits as
    /// the portable code, for the head sizes with register-blocked value sums (64, 128) and
    /// one without (24), on decodes and on multi-row prefill chunks.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_instruction_set_gives_the_portable_bits() {
        for head_dim in [24, 64, 128] {
            let heads = Heads {
                num_heads: 6,
                num_kv_heads: 2,
                head_dim,
            };
            let block_size = 16;
            let spans = [
                SeqSpan {
                    q_start: 0,
                    q_len: 1,
                    start: 40,
                    blocks: vec![0, 1, 2],
                },
                SeqSpan {
                    q_start: 1,
                    q_len: 37,
                    start: 5,
                    blocks: vec![3, 4, 5],
                },
            ];
            let t = 38;
            let width = heads.num_heads * head_dim;
            let q = random((t, width), 11)
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let kv_width = heads.num_kv_heads * head_dim;
            let k = random((6 * block_size, kv_width), 12);
            let v = random((6 * block_size, kv_width), 13);
            let (k, v) = (cpu_f32(&k).unwrap(), cpu_f32(&v).unwrap());
            for (window, span) in [None, Some(20)]
                .into_iter()
                .flat_map(|w| spans.iter().map(move |s| (w, s)))
            {
                for kvh in 0..heads.num_kv_heads {
                    for r0 in (0..span.q_len).step_by(ROWS_PER_ITEM) {
                        let rows = r0..(r0 + ROWS_PER_ITEM).min(span.q_len);
                        let cache = PagedKv {
                            k: &k,
                            v: &v,
                            blocks: &span.blocks,
                            block_size,
                            heads,
                            kvh,
                        };
                        let bits = |x: Vec<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        let portable = bits(attend_rows_with::<Portable>(
                            &q,
                            &cache,
                            span,
                            rows.clone(),
                            heads,
                            window,
                        ));
                        if std::is_x86_feature_detected!("avx2") {
                            // SAFETY: AVX2 checked just above.
                            let avx2 = unsafe {
                                attend_rows_avx2(&q, &cache, span, rows.clone(), heads, window)
                            };
                            assert_eq!(bits(avx2), portable, "avx2, head_dim {head_dim}");
                        }
                        if std::is_x86_feature_detected!("avx512f") {
                            // SAFETY: AVX-512F checked just above.
                            let avx512 = unsafe {
                                attend_rows_avx512(&q, &cache, span, rows.clone(), heads, window)
                            };
                            assert_eq!(bits(avx512), portable, "avx512, head_dim {head_dim}");
                        }
                    }
                }
            }
        }
    }

    /// The CPU kernel and the gathered path (the CUDA path) must agree on a ragged batch
    /// of decodes and prefill chunks that share blocks, with full causal attention and with
    /// sliding windows shorter than some of the contexts (Mistral v0.1).
    #[test]
    fn paged_kernel_matches_gathered_matmuls() {
        for window in [None, Some(1), Some(3), Some(5), Some(64)] {
            paged_kernel_matches_gathered_matmuls_with(window);
        }
    }

    /// A window of `w` keys gives the same attention as the full context cut to its last
    /// `w` positions: the window drops what lies before it and nothing else.
    #[test]
    fn a_sliding_window_sees_exactly_its_last_keys() {
        let heads = Heads {
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 8,
        };
        let block_size = 4;
        let q = random((1, 16), 1).reshape((1, 2, 8)).unwrap();
        let k = random((3 * block_size, 8), 2);
        let v = random((3 * block_size, 8), 3);
        // A decode at position 9 with a window of 4 sees positions 6..=9, which are the
        // last four rows of the blocks [0, 1, 2]: block 1 offsets 2, 3 and block 2 offsets 0, 1.
        let windowed = SeqSpan {
            q_start: 0,
            q_len: 1,
            start: 9,
            blocks: vec![0, 1, 2],
        };
        let got = paged_cpu(&q, &k, &v, &[windowed], block_size, heads, Some(4)).unwrap();
        // The same four keys copied to the front of a fresh cache, seen in full.
        let rows = Tensor::new(&[6u32, 7, 8, 9], &Device::Cpu).unwrap();
        let (k4, v4) = (
            k.index_select(&rows, 0).unwrap(),
            v.index_select(&rows, 0).unwrap(),
        );
        let full = SeqSpan {
            q_start: 0,
            q_len: 1,
            start: 3,
            blocks: vec![0],
        };
        let expected = paged_cpu(&q, &k4, &v4, &[full], block_size, heads, None).unwrap();
        let diff = (got - expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6, "max difference {diff}");
    }

    fn paged_kernel_matches_gathered_matmuls_with(window: Option<usize>) {
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
        assert!(diff < 1e-5, "window {window:?}: max difference {diff}");
    }
}
