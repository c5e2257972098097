//! The tile kernel with AVX-512 VNNI: up to four rows against one panel, its sixteen channels
//! in one vector.
//!
//! A 4-byte step broadcasts four inputs of a row's part and `vpdpbusd` multiplies them with
//! four weights of every channel (unsigned by signed bytes, the four products summed into
//! each 32-bit lane, without saturation). The weights are the unsigned operand: 4-bit quants
//! as they are, 8-bit ones as stored (`q + 128`), whose extra `128 * sum(inputs)` is taken
//! off the joined sum (`128 S`, [`super::rows`]). The floats are joined as in
//! [`super::portable`], so every kernel gives the same bits.

use super::layout::{BLOCK, Kind, PANEL, STEP};
use super::rows::{Precision, Rows};
use std::arch::x86_64::*;

/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI; `n <= 4`; `panel` must hold `rows.blocks()`
/// records of `kind` and rows `first..first + n` must exist (the caller checks both).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
            match (rows.precision, n) {
                $(
                    (Precision::Eight, $rows) => tile_n::<$rows, 1>(kind, rows, first, panel, acc),
                    (Precision::Sixteen, $rows) => tile_n::<$rows, 2>(kind, rows, first, panel, acc),
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
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn inputs(part: &[i8], at: usize) -> __m512i {
    debug_assert!(at + 4 <= part.len());
    // Safety: the caller keeps `at + 4` inside the part.
    _mm512_set1_epi32(unsafe { part.as_ptr().add(at).cast::<i32>().read_unaligned() })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_n<const R: usize, const P: usize>(
    kind: Kind,
    rows: &Rows,
    first: usize,
    panel: &[u8],
    acc: &mut [[f32; PANEL]; 4],
) {
    let record = kind.record_bytes();
    let quants = kind.quant_bytes();
    let blocks = rows.blocks();
    let nibble = _mm512_set1_epi8(0x0F);
    let parts: [[&[i8]; P]; R] =
        std::array::from_fn(|i| std::array::from_fn(|p| rows.part(first + i, p)));
    let mut sums = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let p = panel[b * record..(b + 1) * record].as_ptr();
        let mut sum32 = [[_mm512_setzero_si512(); P]; R];
        match kind {
            Kind::Q4 => {
                for s in 0..BLOCK / 8 {
                    // Safety: `s * STEP + 64 <= quants < record`.
                    let v = unsafe { _mm512_loadu_si512(p.add(s * STEP).cast()) };
                    let lo = _mm512_and_si512(v, nibble);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                    let at = b * BLOCK + 8 * s;
                    for i in 0..R {
                        for q in 0..P {
                            // Safety: `at + 8 <= depth`.
                            let (a, c) =
                                unsafe { (inputs(parts[i][q], at), inputs(parts[i][q], at + 4)) };
                            sum32[i][q] = _mm512_dpbusd_epi32(sum32[i][q], lo, a);
                            sum32[i][q] = _mm512_dpbusd_epi32(sum32[i][q], hi, c);
                        }
                    }
                }
            }
            Kind::Q8 => {
                for t in 0..BLOCK / 4 {
                    // Safety: `t * STEP + 64 <= quants < record`.
                    let w = unsafe { _mm512_loadu_si512(p.add(t * STEP).cast()) };
                    let at = b * BLOCK + 4 * t;
                    for i in 0..R {
                        for q in 0..P {
                            // Safety: `at + 4 <= depth`.
                            let x = unsafe { inputs(parts[i][q], at) };
                            sum32[i][q] = _mm512_dpbusd_epi32(sum32[i][q], w, x);
                        }
                    }
                }
            }
        }
        // Safety: the scales (and mins) follow the quants inside the record.
        let d = unsafe { _mm512_loadu_ps(p.add(quants).cast()) };
        let m = match kind {
            // Safety: as above.
            Kind::Q4 => Some(unsafe { _mm512_loadu_ps(p.add(quants + 64).cast()) }),
            Kind::Q8 => None,
        };
        for i in 0..R {
            let at = (first + i) * blocks + b;
            let mut joined = match P {
                1 => sum32[i][0],
                _ => _mm512_add_epi32(_mm512_slli_epi32::<8>(sum32[i][0]), sum32[i][P - 1]),
            };
            if kind == Kind::Q8 {
                // The stored `q + 128` added 128 times the inputs' joined sum.
                joined = _mm512_sub_epi32(joined, _mm512_set1_epi32(128 * rows.total[at]));
            }
            let t = _mm512_mul_ps(d, _mm512_set1_ps(rows.scale[at]));
            sums[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(joined), t, sums[i]);
            if let Some(m) = m {
                sums[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(rows.sum[at]), sums[i]);
            }
        }
    }
    for (acc, sum) in acc.iter_mut().zip(&sums) {
        // Safety: each row of `acc` holds PANEL = 16 floats.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), *sum) };
    }
}
