//! A channel's weights as [`Block`]s: decoded from a GGUF file's own blocks as they are
//! stored (the integer quants and their scales, no value rounded again), or quantized from
//! f32 to 8 bits.
//!
//! The GGUF layouts are ggml's (`ggml-common.h`): Q4_0 `{d: f16, qs[16]}` with
//! `w = d (q - 8)`, Q4_1 `{d, m: f16, qs[16]}` with `w = d q + m` (in both, byte `j` holds
//! element `j` in its low nibble and `j + 16` in its high one), Q8_0 `{d: f16, qs: i8[32]}`,
//! and Q4_K's super-blocks of 256 (`{d, dmin: f16, scales[12], qs[128]}`: eight blocks of 32
//! with 6-bit scales and mins, `w = d sc q - dmin mn`; `d sc` and `dmin mn` are exact in
//! f32, 11 bits times 6).

use super::layout::{BLOCK, Block, Kind};
use candle_core::quantized::GgmlDType;
use half::f16;

/// The kind a GGUF type is run as when kept as stored, if the kernels take it as it is.
pub(crate) fn stored_kind(dtype: GgmlDType) -> Option<Kind> {
    match dtype {
        GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q4K => Some(Kind::Q4),
        GgmlDType::Q8_0 => Some(Kind::Q8),
        _ => None,
    }
}

fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Appends the blocks of one row of `dtype` (a whole number of its blocks) to `out`.
///
/// # Panics
/// If `dtype` is not one [`stored_kind`] takes, or `row` is not whole blocks of it.
pub(crate) fn decode_row(dtype: GgmlDType, row: &[u8], out: &mut Vec<Block>) {
    let size = dtype.type_size();
    assert_eq!(row.len() % size, 0, "invariant: whole blocks");
    for raw in row.chunks_exact(size) {
        match dtype {
            GgmlDType::Q4_0 => {
                let d = half(raw, 0);
                out.push(nibbles(&raw[2..18], d, -8.0 * d));
            }
            GgmlDType::Q4_1 => out.push(nibbles(&raw[4..20], half(raw, 0), half(raw, 2))),
            GgmlDType::Q8_0 => {
                let mut q = [0i16; BLOCK];
                for (q, &b) in q.iter_mut().zip(&raw[2..34]) {
                    *q = b as i8 as i16;
                }
                out.push(Block {
                    q,
                    d: half(raw, 0),
                    m: 0.0,
                });
            }
            GgmlDType::Q4K => {
                let (d, dmin) = (half(raw, 0), half(raw, 2));
                let scales = &raw[4..16];
                let qs = &raw[16..144];
                for chunk in 0..4 {
                    let q = &qs[32 * chunk..32 * chunk + 32];
                    for (part, shift) in [(0, 0), (1, 4)] {
                        let (sc, mn) = scale_min_k4(2 * chunk + part, scales);
                        let mut block = Block {
                            q: [0; BLOCK],
                            d: d * sc as f32,
                            m: -(dmin * mn as f32),
                        };
                        for (out, &b) in block.q.iter_mut().zip(q) {
                            *out = ((b >> shift) & 0x0F) as i16;
                        }
                        out.push(block);
                    }
                }
            }
            other => panic!("invariant: {other:?} is not a stored kind"),
        }
    }
}

/// A Q4_0 or Q4_1 block: element `j` in the low nibble of byte `j`, `j + 16` in its high one.
fn nibbles(qs: &[u8], d: f32, m: f32) -> Block {
    let mut q = [0i16; BLOCK];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = (b & 0x0F) as i16;
        q[j + 16] = (b >> 4) as i16;
    }
    Block { q, d, m }
}

/// Q4_K's 6-bit scale and min of block `j` (0..8), as ggml packs them in 12 bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22` (see
/// [`super::rows`]).
#[inline(always)]
pub(crate) fn round_even(v: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    (v + ROUND) - ROUND
}

/// Appends `row` (f32) quantized to 8-bit blocks: per block `d = max|w| / 127`, `q =
/// round(w / d)`. The last block is padded with zeros.
pub(crate) fn quantize_row(row: &[f32], out: &mut Vec<Block>) {
    for chunk in row.chunks(BLOCK) {
        let amax = chunk.iter().fold(0f32, |a, w| a.max(w.abs()));
        if amax == 0.0 || !amax.is_finite() {
            out.push(Block::ZERO);
            continue;
        }
        let inv = 127.0 / amax;
        let mut q = [0i16; BLOCK];
        for (q, w) in q.iter_mut().zip(chunk) {
            *q = round_even((w * inv).clamp(-127.0, 127.0)) as i16;
        }
        out.push(Block {
            q,
            d: amax / 127.0,
            m: 0.0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// Every stored type decodes to the values ggml's own dequantization gives (candle's
    /// port of it), element for element.
    #[test]
    fn decoded_blocks_give_the_files_values() {
        let (rows, cols) = (3, 512);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 300.0)
            .collect();
        let dense = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
        ] {
            let q = QTensor::quantize(&dense, dtype).unwrap();
            let want = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let data = q.data().unwrap();
            let row_bytes = data.len() / rows;
            for (r, want) in want.iter().enumerate() {
                let mut blocks = Vec::new();
                decode_row(
                    dtype,
                    &data[r * row_bytes..(r + 1) * row_bytes],
                    &mut blocks,
                );
                assert_eq!(blocks.len(), cols / BLOCK);
                for (k, &w) in want.iter().enumerate() {
                    let b = &blocks[k / BLOCK];
                    let got = b.d * b.q[k % BLOCK] as f32 + b.m;
                    assert!(
                        (got - w).abs() <= 1e-6 * w.abs().max(1.0),
                        "{dtype:?} row {r} element {k}: {got} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_quantized_to_8_bits_is_within_half_a_step() {
        let row: Vec<f32> = (0..70).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let mut blocks = Vec::new();
        quantize_row(&row, &mut blocks);
        assert_eq!(blocks.len(), 3);
        for (k, &w) in row.iter().enumerate() {
            let b = &blocks[k / BLOCK];
            let got = b.d * b.q[k % BLOCK] as f32;
            assert!((got - w).abs() <= b.d / 2.0 * 1.0001, "{k}: {got} vs {w}");
        }
        assert!(blocks[2].q[6..].iter().all(|&q| q == 0), "padding is zero");
    }
}
