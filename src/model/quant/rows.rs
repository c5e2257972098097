//! Activation rows quantized as the kernels read them, per block of [`BLOCK`] inputs with
//! `dx = max|x| / 127`: in one signed 8-bit part, `x ~ dx c` (llama.cpp's `q8_0`), or in two,
//! `x ~ dx (c + r / 256)`, `|c|, |r| <= 127` ([`Precision`]).
//!
//! **Why two parts exist.** One 8-bit part per block holds an input to within `dx / 2`; on the
//! default model that costs 0.15% perplexity against f32 and 96.3% top-1 agreement, inside the
//! quality gate but near its edge (96%), and flips decisions both ways. The residual part holds
//! every input to within `dx / 512`, some 16 bits: the same weights then give f32's next-token
//! distributions to a KL divergence of 1e-6, at the price of a second integer product per
//! block, which a single stream (bound by reading the weights) barely pays and a batch (bound
//! by the integer units) pays in full.
//!
//! Per block the kernels also take `scale` (the step of the joined sum: `dx`, or `dx / 256`
//! for `J = 256 sum w c + sum w r`), `S = sum c` (or `sum (256 c + r)`), what a weight's min
//! multiplies and what 8-bit weights stored as `q + 128` add (`128 S`), and `sum = scale * S`.
//!
//! Plain arithmetic shared by every kernel, so that every CPU rounds every row alike;
//! compiled a second time for AVX2, where the same operations run eight lanes at a time.

use super::blocks::round_even;
use super::layout::BLOCK;

const PART_MAX: f32 = 127.0;
/// The residual's step is the coarse step divided by this: a power of two, so exact.
const RESIDUAL_DIVISOR: f32 = 256.0;

/// How finely activations are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    /// One 8-bit part per input.
    Eight,
    /// Two 8-bit parts per input, some 16 bits.
    Sixteen,
}

impl Precision {
    pub(crate) const fn parts(self) -> usize {
        match self {
            Precision::Eight => 1,
            Precision::Sixteen => 2,
        }
    }
}

/// Rows of activations, quantized.
pub(crate) struct Rows {
    pub precision: Precision,
    /// Inputs per row, padded to whole blocks.
    pub depth: usize,
    /// Per row: its parts, `depth` bytes each (the coarse one first).
    data: Vec<i8>,
    /// Per row and block: the joined sum's step.
    pub scale: Vec<f32>,
    /// Per row and block: `scale * S`.
    pub sum: Vec<f32>,
    /// Per row and block: `S`.
    pub total: Vec<i32>,
}

impl Rows {
    /// Quantizes `x`, `rows` rows of `width` inputs each.
    pub(crate) fn quantize(
        x: &[f32],
        rows: usize,
        width: usize,
        depth: usize,
        precision: Precision,
    ) -> Self {
        use rayon::prelude::*;
        assert_eq!(x.len(), rows * width, "invariant: shape");
        let blocks = depth / BLOCK;
        let parts = precision.parts();
        let mut data = vec![0i8; rows * parts * depth];
        let mut scale = vec![0f32; rows * blocks];
        let mut sum = vec![0f32; rows * blocks];
        let mut total = vec![0i32; rows * blocks];
        data.par_chunks_mut(parts * depth)
            .zip(scale.par_chunks_mut(blocks))
            .zip(sum.par_chunks_mut(blocks))
            .zip(total.par_chunks_mut(blocks))
            .zip(x.par_chunks(width.max(1)))
            .with_min_len(8)
            .for_each(|((((data, scale), sum), total), x)| {
                quantize_row(x, data, scale, sum, total, precision)
            });
        Self {
            precision,
            depth,
            data,
            scale,
            sum,
            total,
        }
    }

    pub(crate) fn blocks(&self) -> usize {
        self.depth / BLOCK
    }

    pub(crate) fn len(&self) -> usize {
        self.scale.len() / self.blocks().max(1)
    }

    /// Part `p` (0: coarse, 1: residual) of row `r`.
    pub(crate) fn part(&self, r: usize, p: usize) -> &[i8] {
        let parts = self.precision.parts();
        debug_assert!(p < parts);
        let at = (r * parts + p) * self.depth;
        &self.data[at..at + self.depth]
    }
}

fn quantize_row(
    x: &[f32],
    data: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    total: &mut [i32],
    precision: Precision,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::model::cpu::CPU.isa >= crate::model::cpu::Isa::Avx2 {
        // Safety: the CPU has AVX2 and FMA, checked once at start-up.
        return unsafe { quantize_row_avx2(x, data, scale, sum, total, precision) };
    }
    quantize_row_portable(x, data, scale, sum, total, precision)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn quantize_row_avx2(
    x: &[f32],
    data: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    total: &mut [i32],
    precision: Precision,
) {
    quantize_row_portable(x, data, scale, sum, total, precision)
}

#[inline(always)]
fn quantize_row_portable(
    x: &[f32],
    data: &mut [i8],
    scale: &mut [f32],
    sum: &mut [f32],
    total: &mut [i32],
    precision: Precision,
) {
    let depth = data.len() / precision.parts();
    let inputs = x.chunks(BLOCK).chain(std::iter::repeat(&[][..]));
    match precision {
        Precision::Eight => {
            for (b, (c, x)) in data.chunks_exact_mut(BLOCK).zip(inputs).enumerate() {
                let (s, t) = quantize_block(x, c, None);
                (scale[b], total[b], sum[b]) = (s, t, s * t as f32);
            }
        }
        Precision::Sixteen => {
            let (coarse, residual) = data.split_at_mut(depth);
            for (b, ((c, r), x)) in coarse
                .chunks_exact_mut(BLOCK)
                .zip(residual.chunks_exact_mut(BLOCK))
                .zip(inputs)
                .enumerate()
            {
                let (s, t) = quantize_block(x, c, Some(r));
                (scale[b], total[b], sum[b]) = (s, t, s * t as f32);
            }
        }
    }
}

/// `v` clamped to `[-127, 127]` and rounded; a NaN becomes -127.
#[inline(always)]
fn to_part(v: f32) -> i8 {
    // `max` then `min` rather than `clamp`: `clamp` keeps a NaN, and its check per lane
    // stopped the loop from vectorising.
    #[allow(clippy::manual_clamp)]
    let v = round_even(v.max(-PART_MAX).min(PART_MAX));
    // Safety: `v` is a whole number in [-127, 127] (`max` replaced any NaN), so the
    // conversion is exact; the checked `as` kept the loop scalar.
    unsafe { v.to_int_unchecked::<i32>() as i8 }
}

/// One block (`x` may be shorter than a block, or empty: the rest is padding): its parts,
/// and its `scale` and `S`.
#[inline(always)]
fn quantize_block(x: &[f32], coarse: &mut [i8], residual: Option<&mut [i8]>) -> (f32, i32) {
    let mut lanes = [0f32; 8];
    for chunk in x.chunks(8) {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l = l.max(v.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |m, v| m.max(*v));
    coarse.fill(0);
    if amax == 0.0 || !amax.is_finite() {
        // A zero block gives zeros; a block with an infinity has no meaningful 8-bit form
        // and gives zeros rather than NaNs that would look like a kernel fault.
        if let Some(r) = residual {
            r.fill(0);
        }
        return (0.0, 0);
    }
    let dx = amax / PART_MAX;
    let inv = PART_MAX / amax;
    let Some(residual) = residual else {
        let mut total = 0i32;
        for (c, &x) in coarse.iter_mut().zip(x) {
            *c = to_part(x * inv);
            total += *c as i32;
        }
        return (dx, total);
    };
    residual.fill(0);
    let inv_residual = inv * RESIDUAL_DIVISOR;
    let mut total = 0i32;
    for ((c, r), &x) in coarse.iter_mut().zip(residual.iter_mut()).zip(x) {
        *c = to_part(x * inv);
        // What the coarse part leaves, in residual steps: at most 128 (half a coarse step),
        // which `to_part` clamps to 127, a rare loss of one residual step.
        *r = to_part((x - *c as f32 * dx) * inv_residual);
        total += 256 * *c as i32 + *r as i32;
    }
    (dx / RESIDUAL_DIVISOR, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row values as the kernels see them: `scale * (c)` or `scale * (256 c + r)`.
    fn back(rows: &Rows, k: usize) -> f32 {
        let s = rows.scale[k / BLOCK];
        match rows.precision {
            Precision::Eight => s * rows.part(0, 0)[k] as f32,
            Precision::Sixteen => {
                s * (256.0 * rows.part(0, 0)[k] as f32 + rows.part(0, 1)[k] as f32)
            }
        }
    }

    #[test]
    fn each_input_is_held_to_half_a_step_of_its_precision() {
        let x: Vec<f32> = (0..100)
            .map(|i| {
                if i == 3 {
                    500.0
                } else {
                    (i as f32 * 0.77).cos()
                }
            })
            .collect();
        for precision in [Precision::Eight, Precision::Sixteen] {
            let rows = Rows::quantize(&x, 1, 100, 128, precision);
            for (k, &v) in x.iter().enumerate() {
                let s = rows.scale[k / BLOCK];
                // Half a step, a hair more where the residual clamps.
                let bound = if precision == Precision::Eight {
                    s / 2.0
                } else {
                    s * 1.01
                };
                assert!(
                    (back(&rows, k) - v).abs() <= bound * 1.0001,
                    "{precision:?} {k}"
                );
            }
            // The block with the large input alone loses precision; the others keep theirs.
            assert!(rows.scale[1] < rows.scale[0] / 100.0);
            // Padding is zero.
            assert!(rows.part(0, 0)[100..].iter().all(|&q| q == 0));
            assert_eq!(rows.len(), 1);
        }
    }
}
