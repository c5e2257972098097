//! Int8 linear layers: weights quantized per output channel at load, activations quantized
//! per row when they arrive, products summed in 32-bit integers.
//!
//! `y[r, c] = (sx[r] * sw[c]) * sum_k qx[r, k] * qw[c, k]`, where `qw = round(w / sw)` with
//! `sw = max|w[c, :]| / 127` (one scale per output channel) and `qx = round(x / sx)` with
//! `sx = max|x[r, :]| / 127` (one scale per row, computed on the fly).
//!
//! **Batch invariance by construction.** The integer sum is exact, so no blocking, tiling,
//! thread split or instruction set can change it; the float work around it (quantizing a row,
//! scaling a result) reads only that row. Row `r` of a batch is therefore bit for bit the same
//! as row `r` computed alone, and the same on every CPU. That is what lets one kernel serve a
//! single stream (a matrix-vector product) and a batch (matrix-matrix) at full speed, where f32
//! gemm must run a single row as two to round the same way.
//!
//! The integer GEMM is `rten-gemm`'s `u8 x i8 -> i32` kernel (AVX-512 VNNI, AVX-512 and AVX2
//! on x86-64, NEON/dot-product/i8mm on Arm, a portable fallback), with the weight matrix packed
//! once at load. Activations enter as unsigned bytes `qx + 128` with zero point 128. Kernels
//! without VNNI sum pairs of `u8 x i8` products in saturating 16-bit lanes (`vpmaddubsw`);
//! on those CPUs weights use 7 bits (`|qw| <= 63`) so that no pair can saturate and the sum
//! stays exact.
//!
//! Accuracy: against the f32 product, an output's error is about `2^-8` of the row's largest
//! `|x|` times the channel's largest `|w|` times `sqrt(in_features)` (both roundings are at
//! most half a step and independent); see the tests for the bound they check.

#[cfg(target_arch = "x86_64")]
mod vnni;

use rayon::prelude::*;
use rten_gemm::{GemmExecutor, GemmInputA, GemmInputB, GemmOptions, PackedBMatrix, QuantParams};
use rten_tensor::NdTensorView;

#[cfg(target_arch = "x86_64")]
use vnni::DEPTH_STEP;
/// Depth is padded to whole cache lines everywhere, so that every CPU stores the same matrix.
#[cfg(not(target_arch = "x86_64"))]
const DEPTH_STEP: usize = 64;

/// Whether this CPU runs the few-rows VNNI kernel, detected once.
#[cfg(target_arch = "x86_64")]
static VNNI: std::sync::LazyLock<bool> = std::sync::LazyLock::new(vnni::available);

/// Activations are stored as `qx + 128` in a byte.
const ACTIVATION_ZERO_POINT: u8 = 128;
const ACTIVATION_MAX: f32 = 127.0;

/// Rows per rayon task when quantizing activations or scaling results: enough work per task
/// that the hand-off costs little, few enough tasks to spread a batch over every core.
const ROWS_PER_TASK: usize = 16;

/// Products of `in_features` terms of at most `255 * 128` must fit an `i32`.
pub(crate) const MAX_IN_FEATURES: usize = (i32::MAX as usize) / (255 * 128);

thread_local! {
    // The executor is not `Sync`; each thread detects the CPU once and picks the same kernel,
    // so a matrix packed on one thread is valid on every other.
    static EXECUTOR: GemmExecutor<u8, i8, i32> = GemmExecutor::default();
}

fn with_executor<R>(f: impl FnOnce(&GemmExecutor<u8, i8, i32>) -> R) -> R {
    EXECUTOR.with(f)
}

/// The integer kernel this CPU runs, e.g. `x86_64-u8i8i32-avx512`.
pub fn kernel_name() -> String {
    with_executor(|e| e.kernel_name().to_string())
}

/// Whether this CPU has a SIMD int8 kernel (and not only the portable fallback), which is
/// what makes int8 weights the fastest format on it.
pub fn has_simd_kernel() -> bool {
    !kernel_name().starts_with("generic")
}

/// The largest weight magnitude after quantization: 127, or 63 where the kernel sums pairs of
/// products in saturating 16-bit lanes.
fn weight_max() -> f32 {
    if with_executor(|e| e.may_saturate()) {
        63.0
    } else {
        127.0
    }
}

/// Row counts up to this run the few-rows kernel (or `rten-gemm`'s matrix-vector path for a
/// single row on CPUs without VNNI); more rows run `rten-gemm`'s packed GEMM, whose 8-row
/// micro-kernel wins once the arithmetic, not the weight reads, is the work.
const FEW_ROWS: usize = 4;

/// An `(out_features, in_features)` weight matrix in int8.
pub(crate) struct Int8Matrix {
    /// `(out_features, depth)` row-major, each channel zero-padded to `depth`, a multiple
    /// of 64 bytes: the layout a matrix-vector product streams. Kept where memory allows
    /// (the loader decides); without it every row count runs the packed GEMM.
    plain: Option<Vec<i8>>,
    /// `B = W^T`, `(depth, out_features)`, in `rten-gemm`'s packed layout. Keeping both
    /// layouts doubles int8's memory (still half of f32's); packing per call would cost
    /// batches more than the copy costs memory.
    packed: PackedBMatrix<i8>,
    /// `128 * sum_k qw[c, k]`: what the activations' zero point adds to channel `c`'s sum.
    zero_point_sums: Vec<i32>,
    /// Dequantization scale of each output channel, `sw`.
    scales: Vec<f32>,
    in_features: usize,
    /// `in_features` rounded up to 64.
    depth: usize,
    out_features: usize,
}

impl std::fmt::Debug for Int8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Int8Matrix")
            .field("out_features", &self.out_features)
            .field("in_features", &self.in_features)
            .finish_non_exhaustive()
    }
}

impl Int8Matrix {
    /// Quantizes `w`, `(out_features, in_features)` row-major, one scale per output row,
    /// keeping the plain layout for one to four rows beside the packed one if `keep_plain`.
    pub fn quantize(w: &[f32], out_features: usize, in_features: usize, keep_plain: bool) -> Self {
        assert_eq!(w.len(), out_features * in_features, "invariant: shape");
        assert!(
            in_features <= MAX_IN_FEATURES,
            "invariant: the loader keeps wider layers dense"
        );
        let qmax = weight_max();
        let depth = in_features.next_multiple_of(DEPTH_STEP);
        let mut plain = vec![0i8; out_features * depth];
        let mut scales = vec![0f32; out_features];
        plain
            .par_chunks_mut(depth)
            .zip(w.par_chunks(in_features))
            .zip(scales.par_iter_mut())
            .for_each(|((q, w), scale)| *scale = quantize_row(w, qmax, &mut q[..in_features]));
        let zero_point_sums = plain
            .chunks(depth)
            .map(|q| ACTIVATION_ZERO_POINT as i32 * q.iter().map(|&v| v as i32).sum::<i32>())
            .collect();
        let view = NdTensorView::from_data([out_features, depth], &plain[..]);
        let packed = with_executor(|e| e.prepack_b(view.transposed()));
        Self {
            plain: keep_plain.then_some(plain),
            packed,
            zero_point_sums,
            scales,
            in_features,
            depth,
            out_features,
        }
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// `W` as a `(out_features, depth)` view, where it is kept.
    fn plain_view(&self) -> Option<NdTensorView<'_, i8, 2>> {
        let plain = self.plain.as_deref()?;
        Some(NdTensorView::from_data(
            [self.out_features, self.depth],
            plain,
        ))
    }

    /// `x` `(rows, in_features)` row-major -> `(rows, out_features)` row-major.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.forward_with(x, rows, Kernel::for_rows(rows, self.plain.is_some()))
    }

    /// [`forward`](Self::forward) through a chosen kernel; all give the same bits.
    fn forward_with(&self, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        let (k, depth, n) = (self.in_features, self.depth, self.out_features);
        assert_eq!(x.len(), rows * k, "invariant: shape");
        // Padding bytes sit at the zero point and meet zero weights: they add nothing.
        let mut qx = vec![ACTIVATION_ZERO_POINT; rows * depth];
        let mut sx = vec![0f32; rows];
        let quantize = |(qx, (x, sx)): (&mut [u8], (&[f32], &mut [f32]))| {
            for ((qx, x), sx) in qx.chunks_mut(depth).zip(x.chunks(k)).zip(sx) {
                *sx = quantize_activations(x, &mut qx[..k]);
            }
        };
        if rows <= FEW_ROWS {
            quantize((&mut qx, (x, &mut sx)));
        } else {
            qx.par_chunks_mut(ROWS_PER_TASK * depth)
                .zip(
                    x.par_chunks(ROWS_PER_TASK * k)
                        .zip(sx.par_chunks_mut(ROWS_PER_TASK)),
                )
                .for_each(quantize);
        }
        let b = match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::FewRows => return self.few_rows(&qx, &sx, rows),
            // The plain layout takes `rten-gemm`'s matrix-vector path.
            Kernel::Vector => GemmInputB::Unpacked(
                self.plain_view()
                    .expect("invariant: Kernel::for_rows checked the layout")
                    .transposed(),
            ),
            Kernel::Packed => GemmInputB::Packed(&self.packed),
        };
        let mut acc = vec![0i32; rows * n];
        let zero_points = vec![ACTIVATION_ZERO_POINT; rows];
        let a = NdTensorView::from_data([rows, depth], &qx[..]);
        with_executor(|e| {
            e.gemm(
                &mut acc,
                GemmInputA::Unpacked(a.view()),
                b,
                GemmOptions {
                    a_quant: Some(QuantParams {
                        zero_point: &zero_points,
                    }),
                    ..GemmOptions::default()
                },
            )
        })
        .expect("invariant: shapes checked above and the matrix packed for this CPU's kernel");
        let mut y = vec![0f32; rows * n];
        y.par_chunks_mut(ROWS_PER_TASK * n)
            .zip(
                acc.par_chunks(ROWS_PER_TASK * n)
                    .zip(sx.par_chunks(ROWS_PER_TASK)),
            )
            .for_each(|(y, (acc, sx))| {
                for ((y, acc), &sx) in y.chunks_mut(n).zip(acc.chunks(n)).zip(sx) {
                    dequantize_row(acc, sx, &self.scales, y);
                }
            });
        y
    }

    /// The product of `rows <= FEW_ROWS` quantized rows through the few-rows kernel, output
    /// channels split evenly over the threads.
    #[cfg(target_arch = "x86_64")]
    fn few_rows(&self, qx: &[u8], sx: &[f32], rows: usize) -> Vec<f32> {
        assert!(*VNNI, "invariant: Kernel::for_rows checked the CPU");
        let plain =
            (self.plain.as_deref()).expect("invariant: Kernel::for_rows checked the layout");
        let (depth, n) = (self.depth, self.out_features);
        // One task per thread in whole tiles of four channels: the product is bound by
        // memory, and two cores stream more of it than one.
        let per_task = n
            .div_ceil(rayon::current_num_threads())
            .next_multiple_of(4)
            .max(64);
        // Sums come out channel-major, `[channel][row]`, so that each task owns one slice.
        let mut sums = vec![0i32; n * rows];
        sums.par_chunks_mut(per_task * rows)
            .zip(plain.par_chunks(per_task * depth))
            .for_each(|(sums, w)| {
                // Safety: `VNNI` says the CPU has the kernel's instructions.
                unsafe {
                    match rows {
                        1 => vnni::sums::<1>(qx, w, depth, sums),
                        2 => vnni::sums::<2>(qx, w, depth, sums),
                        3 => vnni::sums::<3>(qx, w, depth, sums),
                        4 => vnni::sums::<4>(qx, w, depth, sums),
                        _ => unreachable!("invariant: at most FEW_ROWS rows"),
                    }
                }
            });
        // Row-major, less what the zero point added: the integers `rten-gemm` computes, scaled
        // by the same `dequantize_row`.
        let mut acc = vec![0i32; n];
        let mut y = vec![0f32; rows * n];
        for (r, (y, &sx)) in y.chunks_mut(n).zip(sx).enumerate() {
            for (c, acc) in acc.iter_mut().enumerate() {
                *acc = sums[c * rows + r] - self.zero_point_sums[c];
            }
            dequantize_row(&acc, sx, &self.scales, y);
        }
        y
    }
}

/// Which code computes a product; every one gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// [`vnni`]: up to [`FEW_ROWS`] rows, streaming the plain layout (AVX-512 VNNI).
    #[cfg(target_arch = "x86_64")]
    FewRows,
    /// `rten-gemm`'s matrix-vector product on the plain layout: one row, any CPU.
    Vector,
    /// `rten-gemm`'s GEMM on the packed layout.
    Packed,
}

impl Kernel {
    /// The fastest kernel for `rows` rows, given whether the plain layout is kept.
    fn for_rows(rows: usize, plain: bool) -> Self {
        #[cfg(target_arch = "x86_64")]
        if plain && rows <= FEW_ROWS && *VNNI {
            return Kernel::FewRows;
        }
        if plain && rows == 1 {
            Kernel::Vector
        } else {
            Kernel::Packed
        }
    }

    /// The kernels this CPU can run for `rows` rows with both layouts.
    #[cfg(test)]
    fn all_for(rows: usize) -> Vec<Self> {
        let mut all = vec![Kernel::Packed];
        if rows == 1 {
            all.push(Kernel::Vector);
        }
        #[cfg(target_arch = "x86_64")]
        if rows <= FEW_ROWS && *VNNI {
            all.push(Kernel::FewRows);
        }
        all
    }
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22`: adding and subtracting
/// `1.5 * 2^23` leaves no fraction bits. Unlike `f32::round_ties_even`, which the baseline
/// x86-64 target reaches through a library call per element, this vectorises on every CPU and
/// rounds identically on all of them.
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    (v + ROUND) - ROUND
}

/// The largest `|x|`, in sixteen lanes so that it vectorises (max is exact in any order).
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(c[i].abs());
        }
    }
    rest.iter().chain(&acc).fold(0f32, |m, v| m.max(v.abs()))
}

/// Symmetric quantization of one weight row to `[-qmax, qmax]`; returns its scale.
fn quantize_row(w: &[f32], qmax: f32, q: &mut [i8]) -> f32 {
    let amax = abs_max(w);
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let inv = qmax / amax;
    for (q, w) in q.iter_mut().zip(w) {
        *q = round_even((w * inv).clamp(-qmax, qmax)) as i8;
    }
    amax / qmax
}

/// Quantizes one activation row to bytes `qx + 128`, `|qx| <= 127`; returns its scale `sx`.
/// Plain arithmetic, so that every CPU rounds every row the same way; compiled a second time
/// for AVX-512, where the same operations run sixteen lanes at a time (the row's quantization
/// was 5% of a batched step in the baseline build).
fn quantize_activations(x: &[f32], q: &mut [u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if *AVX512 {
        // Safety: the CPU has AVX-512 F and BW, checked once at start-up.
        return unsafe { quantize_activations_avx512(x, q) };
    }
    quantize_activations_portable(x, q)
}

#[cfg(target_arch = "x86_64")]
static AVX512: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
});

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_activations_avx512(x: &[f32], q: &mut [u8]) -> f32 {
    quantize_activations_portable(x, q)
}

#[inline(always)]
fn quantize_activations_portable(x: &[f32], q: &mut [u8]) -> f32 {
    let amax = abs_max(x);
    if amax == 0.0 || !amax.is_finite() {
        // A zero row gives zeros; a row with an infinity has no meaningful int8 form and
        // gives zeros rather than NaNs that would look like a kernel fault.
        q.fill(ACTIVATION_ZERO_POINT);
        return 0.0;
    }
    let inv = ACTIVATION_MAX / amax;
    for (q, x) in q.iter_mut().zip(x) {
        // `max` then `min` rather than `clamp`: `clamp` keeps a NaN, and its check per lane
        // stopped the loop from vectorising. A NaN (which `abs_max` passes over) becomes -127.
        #[allow(clippy::manual_clamp)] // `clamp` keeps NaNs; see above.
        let v = round_even((x * inv).max(-ACTIVATION_MAX).min(ACTIVATION_MAX));
        // Safety: `v` is a whole number in [-127, 127] (`max` replaced any NaN), so the
        // conversion is exact; the checked `as` kept the loop scalar.
        let v: i32 = unsafe { v.to_int_unchecked() };
        *q = (v + ACTIVATION_ZERO_POINT as i32) as u8;
    }
    amax / ACTIVATION_MAX
}

/// `y[c] = acc[c] * (sx * sw[c])`, the same two roundings for every element on every CPU.
fn dequantize_row(acc: &[i32], sx: f32, sw: &[f32], y: &mut [f32]) {
    for ((y, &acc), &sw) in y.iter_mut().zip(acc).zip(sw) {
        *y = acc as f32 * (sx * sw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// The f32 product, summed in f64 so that the reference itself adds no rounding.
    fn reference(x: &[f32], w: &[f32], rows: usize, n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * n];
        for r in 0..rows {
            for c in 0..n {
                let dot: f64 = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[c * k + i] as f64)
                    .sum();
                y[r * n + c] = dot as f32;
            }
        }
        y
    }

    /// Awkward shapes: row counts 1, 3, 17 and 64, inner sizes that are not multiples of any
    /// SIMD width or of the kernel's 4-byte groups, one wider than the kernel's depth block, one
    /// exactly a vector deep with more channels than one thread's share.
    const SHAPES: [(usize, usize); 6] =
        [(1, 1), (7, 5), (33, 19), (70, 131), (45, 1100), (130, 64)];
    const ROWS: [usize; 4] = [1, 3, 17, 64];

    /// Each output is within the rounding bound of the f32 product. Both operands are
    /// rounded to within half a step (`sx / 2`, `sw / 2`), so one term `x w` is off by at most
    /// `|x| sw / 2 + |w| sx / 2 + 3 sx sw / 4`, and an output by the sum of that over `k`,
    /// plus the f32 rounding of the final scaling. For inputs uniform in [-1, 1] this is about
    /// 0.4% of the sum of `|x w|`.
    #[test]
    fn int8_products_match_f32_within_the_rounding_bound() {
        for (n, k) in SHAPES {
            let w = random(n * k, 1);
            let m = Int8Matrix::quantize(&w, n, k, true);
            let qmax = weight_max();
            for rows in ROWS {
                let x = random(rows * k, 2 + rows as u64);
                let got = m.forward(&x, rows);
                let want = reference(&x, &w, rows, n, k);
                for r in 0..rows {
                    let xr = &x[r * k..(r + 1) * k];
                    let sx = xr.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                    for c in 0..n {
                        let wc = &w[c * k..(c + 1) * k];
                        let sw = wc.iter().fold(0f32, |a, v| a.max(v.abs())) / qmax;
                        let (g, e) = (got[r * n + c], want[r * n + c]);
                        let bound: f32 = xr
                            .iter()
                            .zip(wc)
                            .map(|(x, w)| x.abs() * sw / 2.0 + w.abs() * sx / 2.0 + 0.75 * sx * sw)
                            .sum::<f32>()
                            * 1.001
                            + 1e-5 * e.abs()
                            + 1e-6;
                        assert!(
                            (g - e).abs() <= bound,
                            "{rows}x{k} by {k}x{n}, ({r}, {c}): {g} vs {e}, bound {bound}"
                        );
                    }
                }
            }
        }
    }

    /// Every kernel's integer sums equal a plain scalar loop, exactly: whichever code a row
    /// count takes (the few-rows VNNI kernel, `rten-gemm`'s matrix-vector or packed paths)
    /// and whichever SIMD path this CPU has (VNNI, AVX-512, AVX2, NEON or the portable one),
    /// it computes the same numbers as the portable arithmetic, so results cannot depend on
    /// the machine or the batch.
    #[test]
    fn integer_sums_equal_the_portable_scalar_loop_exactly() {
        for (n, k) in SHAPES {
            let w = random(n * k, 3);
            let m = Int8Matrix::quantize(&w, n, k, true);
            let qmax = weight_max();
            let mut qw = vec![0i8; n * k];
            let sw: Vec<f32> = qw
                .chunks_mut(k)
                .zip(w.chunks(k))
                .map(|(q, w)| quantize_row(w, qmax, q))
                .collect();
            for rows in ROWS.into_iter().chain(2..=FEW_ROWS + 1) {
                let x = random(rows * k, 40 + rows as u64);
                for kernel in Kernel::all_for(rows) {
                    let got = m.forward_with(&x, rows, kernel);
                    for r in 0..rows {
                        let mut qx = vec![0u8; k];
                        let sx = quantize_activations(&x[r * k..(r + 1) * k], &mut qx);
                        let acc: Vec<i32> = (0..n)
                            .map(|c| {
                                (0..k)
                                    .map(|i| (qx[i] as i32 - 128) * qw[c * k + i] as i32)
                                    .sum()
                            })
                            .collect();
                        let mut want = vec![0f32; n];
                        dequantize_row(&acc, sx, &sw, &mut want);
                        let got_bits: Vec<u32> = got[r * n..(r + 1) * n]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect();
                        let want_bits: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(
                            got_bits, want_bits,
                            "{kernel:?}, {rows}x{k} by {k}x{n}, row {r}"
                        );
                    }
                }
            }
        }
    }

    /// Row r of a batch is bit for bit row r computed alone, for every batch size the engine
    /// produces (a single decode, small and large batches, prefill chunks).
    #[test]
    fn every_row_of_a_batch_equals_that_row_alone() {
        for (n, k) in SHAPES {
            let m = Int8Matrix::quantize(&random(n * k, 5), n, k, true);
            for rows in ROWS.into_iter().chain(2..=FEW_ROWS + 1) {
                let x = random(rows * k, 60 + rows as u64);
                let batch = m.forward(&x, rows);
                for r in 0..rows {
                    for kernel in Kernel::all_for(1) {
                        let alone = m.forward_with(&x[r * k..(r + 1) * k], 1, kernel);
                        let same = batch[r * n..(r + 1) * n]
                            .iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{rows}x{k} by {k}x{n}: row {r} differs from its solo run ({kernel:?})"
                        );
                    }
                }
            }
        }
    }

    /// The AVX-512 build of activation quantization gives the portable bytes and scale, on
    /// random rows of awkward lengths and on rows built to hit rounding ties and a NaN.
    #[test]
    fn activation_quantization_is_the_same_on_every_instruction_set() {
        #[cfg(target_arch = "x86_64")]
        {
            if !*AVX512 {
                eprintln!("SKIPPED: this CPU has no AVX-512; nothing to compare");
                return;
            }
            let mut rows: Vec<Vec<f32>> = [1, 15, 16, 17, 576, 1100]
                .iter()
                .map(|&k| random(k, k as u64))
                .collect();
            // 127 * (i / 254) lands exactly on half-steps: ties to even must agree.
            rows.push((0..=254).map(|i| i as f32 / 254.0).collect());
            rows.push(vec![1.0, f32::NAN, -0.5, 0.25]);
            for x in rows {
                let (mut a, mut b) = (vec![0u8; x.len()], vec![0u8; x.len()]);
                // Safety: AVX-512 checked above.
                let sa = unsafe { quantize_activations_avx512(&x, &mut a) };
                let sb = quantize_activations_portable(&x, &mut b);
                assert_eq!((sa.to_bits(), &a), (sb.to_bits(), &b), "row of {}", x.len());
            }
        }
    }

    /// A matrix that keeps only the packed layout (a model too large for both) runs every row
    /// count through the packed GEMM and gives the same bits as one that keeps both.
    #[test]
    fn the_packed_layout_alone_gives_the_same_bits() {
        for (n, k) in SHAPES {
            let w = random(n * k, 11);
            let both = Int8Matrix::quantize(&w, n, k, true);
            let packed = Int8Matrix::quantize(&w, n, k, false);
            assert!(packed.plain.is_none(), "the plain copy is dropped");
            for rows in ROWS.into_iter().chain(2..=FEW_ROWS + 1) {
                let x = random(rows * k, 70 + rows as u64);
                let (a, b) = (both.forward(&x, rows), packed.forward(&x, rows));
                let same = a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{rows}x{k} by {k}x{n}");
            }
        }
    }

    /// Zero rows and channels give zeros, not NaNs.
    #[test]
    fn zero_rows_and_channels_give_zeros() {
        let (n, k) = (3, 8);
        let mut w = random(n * k, 9);
        w[k..2 * k].fill(0.0);
        let m = Int8Matrix::quantize(&w, n, k, true);
        let mut x = random(2 * k, 10);
        x[..k].fill(0.0);
        let y = m.forward(&x, 2);
        assert!(y[..n].iter().all(|v| *v == 0.0), "{y:?}");
        assert_eq!(y[n + 1], 0.0);
        assert!(y.iter().all(|v| v.is_finite()));
    }
}
