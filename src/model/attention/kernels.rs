//! The inner loops of the paged CPU kernel, once per instruction set.
//!
//! Every implementation adds the same products in the same order (sixteen lanes, pairwise
//! halving, then the tail; no fused multiply-add), so a machine's choice of instruction set
//! never changes a bit of attention, and neither does how many queries are computed together.

use super::paged::PagedKv;

/// `e^x` for `x <= 0` (softmax weights), in basic arithmetic only, so that the loop over a
/// row vectorises and gives the same bits on every instruction set: `x = n ln 2 + r` with
/// `|r| <= ln 2 / 2`, `e^r` by its degree-6 Taylor polynomial (relative error below 2e-7),
/// times `2^n` built from the exponent bits. Below -87 the weight is 0 (an f32 underflow).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
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
pub(super) trait Kernels {
    fn dot(a: &[f32], b: &[f32]) -> f32;

    /// `out[i] = dot(queries[i], key)`: one key against several queries (a kv head's group),
    /// each summed exactly as [`Kernels::dot`] would.
    #[inline(always)]
    fn dots(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
        for (o, q) in out.iter_mut().zip(queries) {
            *o = Self::dot(q, key);
        }
    }

    /// Fills `scores[i][pos]` with `dot(queries[i], key[pos]) * scale` for every
    /// `from <= pos < visible(i)` (and maybe a few positions beyond, up to the last query's
    /// `visible`, which nothing reads), each dot summed exactly as [`Kernels::dot`]; returns
    /// false where this instruction set has no blocked form for this head size, and the
    /// caller scores key by key. `visible` never decreases with `i`.
    #[inline(always)]
    fn score_blocked(
        _queries: &[&[f32]],
        _kv: &PagedKv<'_>,
        _from: usize,
        _visible: impl Fn(usize) -> usize,
        _scale: f32,
        _scores: &mut [&mut [f32]],
    ) -> bool {
        false
    }

    /// `dst[i] = src[i]` widened to f32 (exactly: every f16 is an f32).
    #[inline(always)]
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32_const();
        }
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

pub(super) struct Portable;

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

/// Cuts `queries` into groups of up to four and scores each with `$group::<C, M>`, `M` being
/// the group's own size: a kv head's group of three (SmolLM2's nine heads over three)
/// computes no fourth product that nothing reads. A macro, not a function taking the group
/// kernel: each kernel is an `unsafe fn` inlined into its caller's target features, and the
/// sizes are const parameters, so a function would need one argument per size.
#[cfg(target_arch = "x86_64")]
macro_rules! score_in_groups {
    ($group:ident, $c:ident, $queries:ident, $kv:ident, $from:ident, $visible:ident,
     $scale:ident, $scores:ident) => {
        let n = $queries.len();
        for i0 in (0..n).step_by(4) {
            let m = 4.min(n - i0);
            let limit = $visible(i0 + m - 1);
            let (group, out) = (&$queries[i0..i0 + m], &mut $scores[i0..i0 + m]);
            // SAFETY: the caller's target features are the group kernel's.
            unsafe {
                match m {
                    4 => $group::<$c, 4>(group, $kv, $from, limit, $scale, out),
                    3 => $group::<$c, 3>(group, $kv, $from, limit, $scale, out),
                    2 => $group::<$c, 2>(group, $kv, $from, limit, $scale, out),
                    _ => $group::<$c, 1>(group, $kv, $from, limit, $scale, out),
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx2 {
    #[inline(always)]
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let full = n / 8 * 8;
        // SAFETY: `Avx2` runs where the CPU has AVX2 and F16C; each load reads 8 halves and
        // each store writes 8 floats at `i + 8 <= full <= n`.
        unsafe {
            for i in (0..full).step_by(8) {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        Portable::widen(&src[full..n], &mut dst[full..n]);
    }

    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: `Avx2` is only used from functions compiled with AVX2 and called where the
        // CPU has it.
        unsafe { dot_avx2(a, b) }
    }

    #[inline(always)]
    fn dots(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
        for (qs, os) in queries.chunks(4).zip(out.chunks_mut(4)) {
            // SAFETY: as above.
            unsafe { dots4_avx2(qs, key, os) };
        }
    }

    #[inline(always)]
    fn score_blocked(
        queries: &[&[f32]],
        kv: &PagedKv<'_>,
        from: usize,
        visible: impl Fn(usize) -> usize,
        scale: f32,
        scores: &mut [&mut [f32]],
    ) -> bool {
        // SAFETY (both): `Avx2` is only used from functions compiled with AVX2 and called
        // where the CPU has it.
        match kv.heads.head_dim {
            64 => unsafe { score4_avx2::<4>(queries, kv, from, visible, scale, scores) },
            128 => unsafe { score4_avx2::<8>(queries, kv, from, visible, scale, scores) },
            _ => return false,
        }
        true
    }
}

/// [`Kernels::score_blocked`] for a head of `C * 16` dimensions with AVX2: up to four queries
/// at a time against each key as it streams past once (see [`score_group_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn score4_avx2<const C: usize>(
    queries: &[&[f32]],
    kv: &PagedKv<'_>,
    from: usize,
    visible: impl Fn(usize) -> usize,
    scale: f32,
    scores: &mut [&mut [f32]],
) {
    // SAFETY: this function has AVX2 and F16C, and runs where the CPU has them.
    score_in_groups!(
        score_group_avx2,
        C,
        queries,
        kv,
        from,
        visible,
        scale,
        scores
    );
}

/// `M` (at most four) queries against each key `from..limit` as it streams past once, each
/// query's sixteen partial sums in two registers, and the sums reduced together by unpacking
/// pairs, which adds exactly the pairs [`Portable::dot`]'s halving adds.
///
/// # Safety
/// Only from a function compiled with AVX2 and F16C, into which it is inlined (which is why
/// it carries no target features of its own), on a CPU that has them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn score_group_avx2<const C: usize, const M: usize>(
    queries: &[&[f32]],
    kv: &PagedKv<'_>,
    from: usize,
    limit: usize,
    scale: f32,
    scores: &mut [&mut [f32]],
) {
    use std::arch::x86_64::*;
    let q: [*const f32; M] = std::array::from_fn(|j| queries[j].as_ptr());
    kv.for_each_row::<Avx2>(
        kv.k,
        from,
        limit,
        #[inline(always)]
        |pos, key| {
            // SAFETY: every query and key has `C * 16` floats (the head size), checked by
            // the caller's match.
            unsafe {
                let zero = _mm256_setzero_ps();
                let (mut lo, mut hi) = ([zero; M], [zero; M]);
                for c in 0..C {
                    let k_lo = _mm256_loadu_ps(key.as_ptr().add(16 * c));
                    let k_hi = _mm256_loadu_ps(key.as_ptr().add(16 * c + 8));
                    for j in 0..M {
                        let qj = q[j].add(16 * c);
                        lo[j] = _mm256_add_ps(lo[j], _mm256_mul_ps(_mm256_loadu_ps(qj), k_lo));
                        hi[j] =
                            _mm256_add_ps(hi[j], _mm256_mul_ps(_mm256_loadu_ps(qj.add(8)), k_hi));
                    }
                }
                // Lanes i + 8, then i + 4: four lanes per query (none for a missing one).
                let s4: [__m128; 4] = std::array::from_fn(|j| {
                    if j < M {
                        let s8 = _mm256_add_ps(lo[j], hi[j]);
                        _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1))
                    } else {
                        _mm_setzero_ps()
                    }
                });
                // Lanes i + 2 of a and b side by side ([a0+a2, b0+b2, a1+a3, b1+b3]), and
                // of c and d; then lane i + 1, one lane per query.
                let ab = _mm_add_ps(_mm_unpacklo_ps(s4[0], s4[1]), _mm_unpackhi_ps(s4[0], s4[1]));
                let cd = _mm_add_ps(_mm_unpacklo_ps(s4[2], s4[3]), _mm_unpackhi_ps(s4[2], s4[3]));
                let sums = _mm_add_ps(_mm_movelh_ps(ab, cd), _mm_movehl_ps(cd, ab));
                let mut out = [0f32; 4];
                _mm_storeu_ps(out.as_mut_ptr(), sums);
                for j in 0..M {
                    scores[j][pos] = out[j] * scale;
                }
            }
        },
    );
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
pub(super) fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0f32];
    dots4_avx2(&[a], b, &mut out);
    out[0]
}

#[inline(always)]
pub(super) fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o += w * x;
    }
}

/// `out[i] += sum over from <= pos < visible(i) of weights[i][pos] * value[pos]`, for `R`
/// queries at a time whose sums stay in registers while the values stream past once: the same
/// products added in the same order as one [`axpy`] per position, so the same bits, with a
/// quarter of the loads and no stores in the loop. Summing `a..b` then `b..c` into the same
/// `out` gives the bits of summing `a..c`.
#[inline(always)]
pub(super) fn weigh_values_blocked<K: Kernels + ?Sized, const D: usize, const R: usize>(
    kv: &PagedKv<'_>,
    weights: &[&[f32]],
    from: usize,
    visible: impl Fn(usize) -> usize,
    out: &mut [&mut [f32]],
) {
    let n = weights.len();
    for i0 in (0..n).step_by(R) {
        let r_used = R.min(n - i0);
        let seen: [usize; R] =
            std::array::from_fn(|r| if r < r_used { visible(i0 + r) } else { 0 });
        let mut acc: [[f32; D]; R] = std::array::from_fn(|r| {
            if r < r_used {
                out[i0 + r][..D]
                    .try_into()
                    .expect("invariant: head_dim is D")
            } else {
                [0f32; D]
            }
        });
        kv.for_each_row::<K>(
            kv.v,
            from,
            seen[r_used - 1],
            #[inline(always)]
            |pos, value| {
                let value: &[f32; D] = value.try_into().expect("invariant: head_dim is D");
                for r in 0..R {
                    if pos < seen[r] {
                        let w = weights[i0 + r][pos];
                        for j in 0..D {
                            acc[r][j] += w * value[j];
                        }
                    }
                }
            },
        );
        for (r, acc) in acc.iter().enumerate().take(r_used) {
            out[i0 + r][..D].copy_from_slice(acc);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx512 {
    #[inline(always)]
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let full = n / 16 * 16;
        // SAFETY: AVX-512F (as for every `Avx512` method); each load reads 16 halves and each
        // store writes 16 floats at `i + 16 <= full <= n`.
        unsafe {
            for i in (0..full).step_by(16) {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
        }
        Portable::widen(&src[full..n], &mut dst[full..n]);
    }

    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut out = [0f32];
        Self::dots(&[a], b, &mut out);
        out[0]
    }

    #[inline(always)]
    fn dots(queries: &[&[f32]], key: &[f32], out: &mut [f32]) {
        for (qs, os) in queries.chunks(8).zip(out.chunks_mut(8)) {
            // SAFETY: `Avx512` is only used from functions compiled with AVX-512F and called
            // where the CPU has it.
            unsafe { dots8_avx512(qs, key, os) };
        }
    }

    #[inline(always)]
    fn score_blocked(
        queries: &[&[f32]],
        kv: &PagedKv<'_>,
        from: usize,
        visible: impl Fn(usize) -> usize,
        scale: f32,
        scores: &mut [&mut [f32]],
    ) -> bool {
        // SAFETY (both): `Avx512` is only used from functions compiled with AVX-512F and
        // called where the CPU has it.
        match kv.heads.head_dim {
            64 => unsafe { score4_avx512::<4>(queries, kv, from, visible, scale, scores) },
            128 => unsafe { score4_avx512::<8>(queries, kv, from, visible, scale, scores) },
            _ => return false,
        }
        true
    }
}

/// [`Kernels::score_blocked`] for a head of `C * 16` dimensions with AVX-512: up to four
/// queries at a time against each key as it streams past once (see [`score_group_avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn score4_avx512<const C: usize>(
    queries: &[&[f32]],
    kv: &PagedKv<'_>,
    from: usize,
    visible: impl Fn(usize) -> usize,
    scale: f32,
    scores: &mut [&mut [f32]],
) {
    // SAFETY: this function has AVX-512F, and runs where the CPU has it.
    score_in_groups!(
        score_group_avx512,
        C,
        queries,
        kv,
        from,
        visible,
        scale,
        scores
    );
}

/// `M` (at most four) queries stay in registers while the keys `from..limit` stream past
/// once, and their sums are reduced together by a transposing tree that adds exactly the
/// pairs [`Portable::dot`]'s halving adds (a missing query's sums are zeros, never stored).
///
/// # Safety
/// Only from a function compiled with AVX-512F, into which it is inlined (which is why it
/// carries no target features of its own), on a CPU that has it; every query and key has
/// `C * 16` floats.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
// The chunk index `c` addresses the key pointer and the query registers alike.
#[allow(clippy::needless_range_loop)]
unsafe fn score_group_avx512<const C: usize, const M: usize>(
    queries: &[&[f32]],
    kv: &PagedKv<'_>,
    from: usize,
    limit: usize,
    scale: f32,
    scores: &mut [&mut [f32]],
) {
    use std::arch::x86_64::*;
    // SAFETY: as the function's contract says.
    unsafe {
        let q: [[__m512; C]; M] = std::array::from_fn(|j| {
            std::array::from_fn(|c| _mm512_loadu_ps(queries[j].as_ptr().add(16 * c)))
        });
        kv.for_each_row::<Avx512>(
            kv.k,
            from,
            limit,
            #[inline(always)]
            |pos, key| {
                let mut acc = [_mm512_setzero_ps(); 4];
                for c in 0..C {
                    let k = _mm512_loadu_ps(key.as_ptr().add(16 * c));
                    for j in 0..M {
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
                for j in 0..M {
                    scores[j][pos] = sums[4 * j] * scale;
                }
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 inner product sums in the portable order, bit for bit.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_and_portable_dot_products_are_identical() {
        use rand::{Rng, SeedableRng};
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for len in [1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
            // SAFETY: AVX2 checked above.
            let fast = unsafe { dot_avx2(&a, &b) };
            assert_eq!(
                fast.to_bits(),
                Portable::dot(&a, &b).to_bits(),
                "length {len}"
            );
        }
    }
}
