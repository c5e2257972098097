//! The tile kernel with AVX2: up to four rows against one panel, eight channels per vector,
//! one half of the panel at a time (its sums stay in registers).
//!
//! A 4-byte step broadcasts four inputs of a row's part to every lane and multiplies them
//! with four weights of eight channels: `vpmaddubsw` (unsigned by signed bytes, pairs summed
//! into 16 bits) then `vpmaddwd` (pairs of those summed into 32 bits), which is what one
//! `vpdpbusd` does. 4-bit weights are the unsigned operand as they are (products of at most
//! 15 * 127, so a block's eight steps sum in 16 bits without saturating). 8-bit weights are
//! signed: their magnitude is the unsigned operand and their sign moves onto the input
//! (`vpsignb`), products of at most 128 * 127, summed into 32 bits every step. Each block's
//! sums are exact and joined into floats as [`super::portable`] joins them, so both give the
//! same bits.

use super::layout::{BLOCK, Kind, PANEL, STEP};
use super::rows::{Precision, Rows};
use std::arch::x86_64::*;

/// # Safety
/// The CPU must have AVX2 and FMA; `n <= 4`; `panel` must hold `rows.blocks()` records of
/// `kind` and rows `first..first + n` must exist (the caller checks both).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(
    kind: Kind,
    rows: &Rows,
    first: usize,
    n: usize,
    panel: &[u8],
    acc: &mut [[f32; PANEL]; 4],
) {
    macro_rules! dispatch {
        ($($rows:literal)*) => {
            match (kind, rows.precision, n) {
                $(
                    (Kind::Q4, Precision::Eight, $rows) => tile_q4::<$rows, 1>(rows, first, panel, acc),
                    (Kind::Q4, Precision::Sixteen, $rows) => tile_q4::<$rows, 2>(rows, first, panel, acc),
                    (Kind::Q8, Precision::Eight, $rows) => tile_q8::<$rows, 1>(rows, first, panel, acc),
                    (Kind::Q8, Precision::Sixteen, $rows) => tile_q8::<$rows, 2>(rows, first, panel, acc),
                )*
                _ => unreachable!("invariant: tiles of one to four rows"),
            }
        };
    }
    // Safety: forwarded from the caller.
    unsafe { dispatch!(1 2 3 4) }
}

/// Four inputs of a part at `at`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn inputs(part: &[i8], at: usize) -> __m256i {
    debug_assert!(at + 4 <= part.len());
    // Safety: the caller keeps `at + 4` inside the part.
    _mm256_set1_epi32(unsafe { part.as_ptr().add(at).cast::<i32>().read_unaligned() })
}

/// One block's float join for eight channels of a row: `J` from the parts' 32-bit sums
/// (`256 coarse + residual` with two parts), then `y = fma(J, d * scale, y)` and, with
/// mins, `y = fma(m, sum, y)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn join<const P: usize>(
    parts: [__m256i; P],
    d: __m256,
    m: Option<__m256>,
    rows: &Rows,
    at: usize,
    y: __m256,
) -> __m256 {
    let joined = match P {
        1 => parts[0],
        _ => _mm256_add_epi32(_mm256_slli_epi32::<8>(parts[0]), parts[P - 1]),
    };
    let t = _mm256_mul_ps(d, _mm256_set1_ps(rows.scale[at]));
    let y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(joined), t, y);
    match m {
        Some(m) => _mm256_fmadd_ps(m, _mm256_set1_ps(rows.sum[at]), y),
        None => y,
    }
}

/// One part's 16-bit sums over block `b` for `R` rows (`x[i]`: row `i`'s part), eight
/// channels (half `h` of the panel) of the block's 4-bit record at `record`: at most
/// 8 * 2 * 15 * 127 = 30,480, so they never saturate.
///
/// Plain loops and no closures: a closure inside a `target_feature` function is compiled
/// without its features and called rather than inlined, and so were the first kernel's.
///
/// # Safety
/// As [`tile`]'s; `record` is a whole 4-bit record and each `x[i]` holds a block's inputs.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_sums<const R: usize>(
    record: *const u8,
    h: usize,
    nibble: __m256i,
    x: [*const i8; R],
) -> [__m256i; R] {
    let mut sum16 = [_mm256_setzero_si256(); R];
    for s in 0..BLOCK / 8 {
        // Safety: `s * STEP + 32 * h + 32 <= quant_bytes`, inside the record.
        let v = unsafe { _mm256_loadu_si256(record.add(s * STEP + 32 * h).cast()) };
        let lo = _mm256_and_si256(v, nibble);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
        for i in 0..R {
            // Safety: `8 s + 8 <= BLOCK` inputs of the row's block.
            let (a, c) = unsafe {
                (
                    _mm256_set1_epi32(x[i].add(8 * s).cast::<i32>().read_unaligned()),
                    _mm256_set1_epi32(x[i].add(8 * s + 4).cast::<i32>().read_unaligned()),
                )
            };
            let products =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, a), _mm256_maddubs_epi16(hi, c));
            sum16[i] = _mm256_add_epi16(sum16[i], products);
        }
    }
    sum16
}

/// 4-bit weights: per block, the coarse part's sums widened to 32 bits (times 256 where a
/// residual follows), then the residual part's added, then the float join. The two parts
/// run one after the other so that only one part's 16-bit sums are live at a time: with both,
/// four rows did not fit AVX2's sixteen registers.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_q4<const R: usize, const P: usize>(
    rows: &Rows,
    first: usize,
    panel: &[u8],
    acc: &mut [[f32; PANEL]; 4],
) {
    let record = Kind::Q4.record_bytes();
    let quants = Kind::Q4.quant_bytes();
    let blocks = rows.blocks();
    let nibble = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // The coarse sum's weight in `J = 256 coarse + residual`, applied while widening.
    let coarse_weight = _mm256_set1_epi16(if P == 1 { 1 } else { 256 });
    let mut coarse_rows = [std::ptr::null::<i8>(); R];
    let mut residual_rows = [std::ptr::null::<i8>(); R];
    for i in 0..R {
        coarse_rows[i] = rows.part(first + i, 0).as_ptr();
        residual_rows[i] = rows.part(first + i, P - 1).as_ptr();
    }
    let scale = rows.scale[first * blocks..(first + R) * blocks].as_ptr();
    let sum = rows.sum[first * blocks..(first + R) * blocks].as_ptr();
    for h in 0..2 {
        let mut sums = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            // Safety: the panel holds `blocks` records.
            let p = unsafe { panel.as_ptr().add(b * record) };
            let (mut c, mut r) = ([std::ptr::null::<i8>(); R], [std::ptr::null::<i8>(); R]);
            for i in 0..R {
                // Safety: every part holds `blocks` blocks of inputs.
                unsafe {
                    (c[i], r[i]) = (
                        coarse_rows[i].add(b * BLOCK),
                        residual_rows[i].add(b * BLOCK),
                    )
                };
            }
            // Safety: forwarded from the caller.
            let coarse = unsafe { block_sums::<R>(p, h, nibble, c) };
            let mut joined = [_mm256_setzero_si256(); R];
            for i in 0..R {
                joined[i] = _mm256_madd_epi16(coarse[i], coarse_weight);
            }
            if P == 2 {
                // Safety: as above.
                let residual = unsafe { block_sums::<R>(p, h, nibble, r) };
                for i in 0..R {
                    joined[i] = _mm256_add_epi32(joined[i], _mm256_madd_epi16(residual[i], ones));
                }
            }
            // Safety: the scales and mins follow the quants inside the record.
            let (d, m) = unsafe {
                (
                    _mm256_loadu_ps(p.add(quants + 32 * h).cast()),
                    _mm256_loadu_ps(p.add(quants + 64 + 32 * h).cast()),
                )
            };
            for i in 0..R {
                // Safety: `scale` and `sum` hold `R * blocks` values.
                let (s, m_sum) = unsafe { (*scale.add(i * blocks + b), *sum.add(i * blocks + b)) };
                let t = _mm256_mul_ps(d, _mm256_set1_ps(s));
                let y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(joined[i]), t, sums[i]);
                sums[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(m_sum), y);
            }
        }
        for (acc, sum) in acc.iter_mut().zip(&sums) {
            // Safety: each row of `acc` holds PANEL = 16 floats.
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * h), *sum) };
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_q8<const R: usize, const P: usize>(
    rows: &Rows,
    first: usize,
    panel: &[u8],
    acc: &mut [[f32; PANEL]; 4],
) {
    let record = Kind::Q8.record_bytes();
    let quants = Kind::Q8.quant_bytes();
    let blocks = rows.blocks();
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let parts: [[&[i8]; P]; R] =
        std::array::from_fn(|i| std::array::from_fn(|p| rows.part(first + i, p)));
    for h in 0..2 {
        let mut sums = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            let p = panel[b * record..(b + 1) * record].as_ptr();
            let mut sum32 = [[_mm256_setzero_si256(); P]; R];
            for t in 0..BLOCK / 4 {
                // Stored as `q + 128`: flipping the top bit gives `q`.
                // Safety: `t * STEP + 64 <= quants < record`.
                let w = _mm256_xor_si256(
                    unsafe { _mm256_loadu_si256(p.add(t * STEP + 32 * h).cast()) },
                    flip,
                );
                let magnitude = _mm256_abs_epi8(w);
                let at = b * BLOCK + 4 * t;
                for i in 0..R {
                    for q in 0..P {
                        // Safety: `at + 4 <= depth`.
                        let x = unsafe { inputs(parts[i][q], at) };
                        let products = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, w));
                        sum32[i][q] =
                            _mm256_add_epi32(sum32[i][q], _mm256_madd_epi16(products, ones));
                    }
                }
            }
            // Safety: the scales follow the quants inside the record.
            let d = unsafe { _mm256_loadu_ps(p.add(quants + 32 * h).cast()) };
            for i in 0..R {
                sums[i] = join::<P>(sum32[i], d, None, rows, (first + i) * blocks + b, sums[i]);
            }
        }
        for (acc, sum) in acc.iter_mut().zip(&sums) {
            // Safety: each row of `acc` holds PANEL = 16 floats.
            unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(8 * h), *sum) };
        }
    }
}
