//! The int8 tile kernel with AVX-512 VNNI: up to four rows (eight activation parts) against
//! one panel of 32 channels, sixteen channels per vector.
//!
//! Each 4-byte step broadcasts four activation bytes of a part to every lane and multiplies
//! them with the step's four weight bytes of sixteen channels, one `vpdpbusd` (64 `u8 x i8`
//! products summed into sixteen 32-bit lanes, without saturation) per part and vector. At
//! the end of a group the two parts' sums are joined, converted and added to the channel's
//! f32 sum with the group's scale, exactly as [`super::portable`] does one lane at a time,
//! so both give the same bits.

use super::panel::{GROUP, PANEL, Panel, STEPS};
use std::arch::x86_64::*;

/// Whether this CPU runs the kernel.
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vnni")
}

/// `acc[r][j] = sum_g sw[j, g] * J[r, j, g]` for `R` rows whose parts are `parts`
/// (`2 * R * depth` bytes: row r's coarse part, then its residual).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI ([`available`]); `parts` must hold
/// `2 * R * depth` bytes and `depth` equal `panel.groups * GROUP` (the caller asserts both).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile<const R: usize>(
    parts: &[u8],
    depth: usize,
    panel: Panel<'_>,
    acc: &mut [[f32; PANEL]; 4],
) {
    debug_assert!(parts.len() >= 2 * R * depth && depth == panel.groups * GROUP);
    debug_assert!(panel.weights.len() == panel.groups * STEPS * PANEL * 4);
    let x = parts.as_ptr();
    let w = panel.weights.as_ptr();
    let mut sums = [[_mm512_setzero_ps(); 2]; R];
    for g in 0..panel.groups {
        // [part][vector]: parts 2r and 2r + 1 are row r's coarse and residual parts.
        let mut ints = [[[_mm512_setzero_si512(); 2]; 2]; R];
        // Safety (this block): offsets stay inside `panel.weights` (the panel holds `groups *
        // STEPS` steps of 128 bytes) and inside `parts` (`g * GROUP + t * 4 + 4 <= depth`).
        unsafe {
            let gw = w.add(g * STEPS * PANEL * 4);
            for t in 0..STEPS {
                let b0 = _mm512_loadu_si512(gw.add(t * 128).cast());
                let b1 = _mm512_loadu_si512(gw.add(t * 128 + 64).cast());
                let at = g * GROUP + t * 4;
                for (r, ints) in ints.iter_mut().enumerate() {
                    for (part, ints) in ints.iter_mut().enumerate() {
                        let a = x
                            .add((2 * r + part) * depth + at)
                            .cast::<i32>()
                            .read_unaligned();
                        let a = _mm512_set1_epi32(a);
                        ints[0] = _mm512_dpbusd_epi32(ints[0], a, b0);
                        ints[1] = _mm512_dpbusd_epi32(ints[1], a, b1);
                    }
                }
            }
        }
        for v in 0..2 {
            // Safety: `scales` and `zero_points` hold `groups * PANEL` entries.
            let (zp, scale) = unsafe {
                (
                    _mm512_loadu_si512(panel.zero_points.as_ptr().add(g * PANEL + v * 16).cast()),
                    _mm512_loadu_ps(panel.scales.as_ptr().add(g * PANEL + v * 16)),
                )
            };
            for (sum, ints) in sums.iter_mut().zip(&ints) {
                // `join`: (coarse << 8) + residual - zero point, wrapping as `i32` does.
                let joined = _mm512_sub_epi32(
                    _mm512_add_epi32(_mm512_slli_epi32::<8>(ints[0][v]), ints[1][v]),
                    zp,
                );
                sum[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(joined), scale, sum[v]);
            }
        }
    }
    for (acc, sum) in acc.iter_mut().zip(&sums) {
        // Safety: each row of `acc` holds PANEL = 32 floats.
        unsafe {
            _mm512_storeu_ps(acc.as_mut_ptr(), sum[0]);
            _mm512_storeu_ps(acc.as_mut_ptr().add(16), sum[1]);
        }
    }
}
