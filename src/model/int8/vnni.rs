//! The int8 product for a few rows at a time with AVX-512 VNNI, reading the weights in their
//! plain `(out_features, in_features)` layout.
//!
//! A decode step of one sequence multiplies one row by every weight matrix: the work is
//! reading the weights once, as fast as memory delivers them. A GEMM micro-kernel built for
//! 8-row tiles wastes most of its arithmetic there and reads its packed panels in an order
//! the prefetcher follows poorly. This kernel streams each output channel's weights
//! front to back, four channels at a time, with one `vpdpbusd` (64 `u8 x i8` products summed
//! into sixteen 32-bit lanes, without saturation) per 64 bytes of weights and row.
//!
//! The sums are exact integers, so they equal `rten-gemm`'s to the bit: which kernel a row
//! count takes cannot change a result (batch invariance).

use std::arch::x86_64::*;

/// Bytes of depth per vector: the padded depth of weights and activations is a multiple.
pub(super) const DEPTH_STEP: usize = 64;

/// Output channels per tile: four weight streams at once share each activation load.
const CHANNELS: usize = 4;

/// Whether this CPU runs the kernel.
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vnni")
}

/// `sums[c * R + r] = sum_k x[r, k] * w[c, k]` for the `R` rows of `x` (`R x depth` bytes,
/// activations stored with zero point 128) and every channel of `w` (`channels x depth`).
/// `depth` is a multiple of [`DEPTH_STEP`].
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn sums<const R: usize>(x: &[u8], w: &[i8], depth: usize, sums: &mut [i32]) {
    assert!(depth.is_multiple_of(DEPTH_STEP), "invariant: padded depth");
    assert_eq!(x.len(), R * depth, "invariant: activation rows");
    assert_eq!(w.len() % depth, 0, "invariant: whole channels");
    let channels = w.len() / depth;
    assert_eq!(
        sums.len(),
        channels * R,
        "invariant: one sum per row and channel"
    );
    let mut c = 0;
    while c + CHANNELS <= channels {
        // Safety: the asserts above keep every read inside `x` and `w`.
        let tile = unsafe { tile::<R, CHANNELS>(x.as_ptr(), w.as_ptr().add(c * depth), depth) };
        for (i, channel) in tile.iter().enumerate() {
            sums[(c + i) * R..(c + i + 1) * R].copy_from_slice(channel);
        }
        c += CHANNELS;
    }
    while c < channels {
        // Safety: as above, one channel.
        let tile = unsafe { tile::<R, 1>(x.as_ptr(), w.as_ptr().add(c * depth), depth) };
        sums[c * R..(c + 1) * R].copy_from_slice(&tile[0]);
        c += 1;
    }
}

/// The sums of `R` rows against `C` consecutive channels, `[channel][row]`.
///
/// # Safety
/// `x` must hold `R * depth` bytes and `w` `C * depth`, `depth` a multiple of 64.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    x: *const u8,
    w: *const i8,
    depth: usize,
) -> [[i32; R]; C] {
    // Plain loops rather than closures: a closure does not inherit this function's target
    // features, so its intrinsics would not inline (a call per load).
    let mut acc = [[_mm512_setzero_si512(); R]; C];
    let mut xs = [_mm512_setzero_si512(); R];
    let mut k = 0;
    while k < depth {
        for (r, xv) in xs.iter_mut().enumerate() {
            // Safety: `k + 64 <= depth` and the caller's sizes.
            *xv = unsafe { _mm512_loadu_si512(x.add(r * depth + k).cast()) };
        }
        for (c, acc) in acc.iter_mut().enumerate() {
            let wv = unsafe { _mm512_loadu_si512(w.add(c * depth + k).cast()) };
            for (acc, xv) in acc.iter_mut().zip(&xs) {
                *acc = _mm512_dpbusd_epi32(*acc, *xv, wv);
            }
        }
        k += DEPTH_STEP;
    }
    let mut sums = [[0i32; R]; C];
    for (sums, acc) in sums.iter_mut().zip(&acc) {
        for (sum, acc) in sums.iter_mut().zip(acc) {
            *sum = _mm512_reduce_add_epi32(*acc);
        }
    }
    sums
}
