//! Int8 linear layers: weights quantized in groups of 64 along each output channel at load,
//! activations quantized per row in two parts when they arrive, products summed exactly in
//! 32-bit integers per group and the groups joined in f32 in a fixed order.
//!
//! `y[r, c] = (sx[r] / 256) * sum_g sw[c, g] * J[r, c, g]`, where `qw = round(w / sw)` with
//! `sw[c, g] = max|w[c, group g]| / 127`, and `J` is the exact integer product of the
//! group's weights with the row's two activation parts (see [`quantize_activations`]):
//! `J = 256 * sum qx_coarse * qw + sum qx_residual * qw`.
//!
//! **Why this shape.** One scale per row of activations and one per output channel of
//! weights (the first design) cost SmolLM2 3.6% perplexity, a mean KL divergence from f32 of
//! 0.035 and replies that looped: language models' activations carry a few features
//! hundreds of times larger than the rest, which flatten every other feature to zero on a
//! shared 8-bit scale, and a channel's largest weight sets too coarse a step for the rest of
//! the channel. Two 8-bit parts per activation row hold it to about 16 bits; a scale per 64
//! weights follows the weights' local range, as llama.cpp's q8_0 does with 32. Measured by
//! `throng eval` (docs/src/models.md, "Weight formats").
//!
//! **Batch invariance by construction.** Each group's integer sum is exact, and every kernel
//! joins the groups of one output with the same float operations in the same order (one
//! conversion and one fused multiply-add per group, then one multiply), reading only that
//! row and that channel. Row `r` of a batch is therefore bit for bit the same as row `r`
//! computed alone, whichever kernel or thread computes it, on every CPU: the AVX-512 VNNI
//! kernel ([`vnni`]) and the portable one ([`portable`]) give the same bits.

mod panel;
mod portable;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub(crate) use panel::{GROUP, PANEL, Panel, STEPS};
use rayon::prelude::*;

/// Activations are stored as `q + 128` in a byte.
const ACTIVATION_ZERO_POINT: u8 = 128;
const ACTIVATION_MAX: f32 = 127.0;
const WEIGHT_MAX: f32 = 127.0;
/// The residual part's step is the coarse part's divided by this (a power of two, so that
/// joining the parts is a shift and the final scaling exact).
const RESIDUAL_DIVISOR: f32 = 256.0;

/// Rows per block of work: enough that a panel's weights, read once from memory, serve many
/// rows from the cache.
const ROWS_PER_BLOCK: usize = 64;

/// Products of `in_features` terms must keep each group's joined sum inside an `i32`;
/// groups bound that for any width, so only the row's size in memory limits it.
pub(crate) const MAX_IN_FEATURES: usize = 1 << 24;

/// Whether this CPU runs the AVX-512 VNNI kernel, detected once.
#[cfg(target_arch = "x86_64")]
static VNNI: std::sync::LazyLock<bool> = std::sync::LazyLock::new(vnni::available);

fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        *VNNI
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has a SIMD int8 kernel (and not only the portable one), which is what
/// makes int8 weights the fastest format on it.
pub fn has_simd_kernel() -> bool {
    has_vnni()
}

/// An `(out_features, in_features)` weight matrix in int8, in panels of [`PANEL`] channels.
pub(crate) struct Int8Matrix {
    /// Panel-major, then group, then 4-byte step, then channel, then the step's 4 bytes:
    /// byte `((((p * groups + g) * STEPS + t) * PANEL + j) * 4 + i)` is the weight of channel
    /// `p * PANEL + j` at depth `g * GROUP + t * 4 + i`. A kernel streams each panel front to
    /// back; channels past `out_features` and depths past `in_features` are zeros.
    weights: Vec<i8>,
    /// `sw[c, g]` per panel and group, [`PANEL`] channels each.
    scales: Vec<f32>,
    /// Per panel and group, what the activations' zero point adds to a channel's joined sum:
    /// `257 * 128 * sum qw` over the group (both parts carry the zero point; see
    /// [`join`]).
    zero_points: Vec<i32>,
    in_features: usize,
    /// `in_features` rounded up to [`GROUP`].
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
    /// Quantizes `w`, `(out_features, in_features)` row-major, one scale per channel and
    /// group of [`GROUP`] weights.
    pub fn quantize(w: &[f32], out_features: usize, in_features: usize) -> Self {
        assert_eq!(w.len(), out_features * in_features, "invariant: shape");
        assert!(
            in_features <= MAX_IN_FEATURES,
            "invariant: the loader keeps wider layers dense"
        );
        let depth = in_features.next_multiple_of(GROUP).max(GROUP);
        let groups = depth / GROUP;
        let panels = out_features.div_ceil(PANEL);
        let panel_bytes = groups * STEPS * PANEL * 4;
        let mut weights = vec![0i8; panels * panel_bytes];
        let mut scales = vec![0f32; panels * groups * PANEL];
        let mut zero_points = vec![0i32; panels * groups * PANEL];
        weights
            .par_chunks_mut(panel_bytes)
            .zip(scales.par_chunks_mut(groups * PANEL))
            .zip(zero_points.par_chunks_mut(groups * PANEL))
            .enumerate()
            .for_each(|(p, ((packed, scales), zero_points))| {
                let mut q = [0i8; GROUP];
                for j in 0..PANEL {
                    let c = p * PANEL + j;
                    if c >= out_features {
                        break;
                    }
                    let row = &w[c * in_features..(c + 1) * in_features];
                    for g in 0..groups {
                        let start = (g * GROUP).min(in_features);
                        let end = ((g + 1) * GROUP).min(in_features);
                        q.fill(0);
                        let scale = quantize_group(&row[start..end], &mut q[..end - start]);
                        scales[g * PANEL + j] = scale;
                        let sum: i32 = q.iter().map(|&v| v as i32).sum();
                        zero_points[g * PANEL + j] = 257 * ACTIVATION_ZERO_POINT as i32 * sum;
                        for t in 0..STEPS {
                            let at = ((g * STEPS + t) * PANEL + j) * 4;
                            packed[at..at + 4].copy_from_slice(&q[t * 4..t * 4 + 4]);
                        }
                    }
                }
            });
        Self {
            weights,
            scales,
            zero_points,
            in_features,
            depth,
            out_features,
        }
    }

    pub(crate) fn out_features(&self) -> usize {
        self.out_features
    }

    fn groups(&self) -> usize {
        self.depth / GROUP
    }

    fn panels(&self) -> usize {
        self.out_features.div_ceil(PANEL)
    }

    fn panel(&self, p: usize) -> Panel<'_> {
        let groups = self.groups();
        let bytes = groups * STEPS * PANEL * 4;
        let per = groups * PANEL;
        Panel {
            weights: &self.weights[p * bytes..(p + 1) * bytes],
            scales: &self.scales[p * per..(p + 1) * per],
            zero_points: &self.zero_points[p * per..(p + 1) * per],
            groups,
        }
    }

    /// `x` `(rows, in_features)` row-major -> `(rows, out_features)` row-major.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.forward_with(x, rows, Kernel::best())
    }

    /// [`forward`](Self::forward) through a chosen kernel; all give the same bits.
    fn forward_with(&self, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        let (k, depth, n) = (self.in_features, self.depth, self.out_features);
        assert_eq!(x.len(), rows * k, "invariant: shape");
        // Row r's two parts are rows 2r and 2r + 1 of `qx`. Padding bytes sit at the zero
        // point and meet zero weights: they add nothing.
        let mut qx = vec![ACTIVATION_ZERO_POINT; 2 * rows * depth];
        let mut sx = vec![0f32; rows];
        qx.par_chunks_mut(2 * depth)
            .zip(x.par_chunks(k.max(1)))
            .zip(sx.par_iter_mut())
            .with_min_len(16)
            .for_each(|((qx, x), sx)| {
                let (coarse, residual) = qx.split_at_mut(depth);
                *sx = quantize_activations(x, &mut coarse[..k], &mut residual[..k]);
            });
        // Blocks of rows by blocks of panels, enough of them to keep every thread busy.
        let panels = self.panels();
        let row_blocks = rows.div_ceil(ROWS_PER_BLOCK).max(1);
        let wanted = 2 * rayon::current_num_threads();
        let panel_blocks = wanted.div_ceil(row_blocks).clamp(1, panels);
        let per_block = panels.div_ceil(panel_blocks);
        let tasks: Vec<(usize, usize)> = (0..row_blocks)
            .flat_map(|rb| (0..panels.div_ceil(per_block)).map(move |pb| (rb, pb)))
            .collect();
        let results: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(rb, pb)| {
                let rows_here = (rb * ROWS_PER_BLOCK..((rb + 1) * ROWS_PER_BLOCK).min(rows))
                    .collect::<Vec<_>>();
                let panels_here = pb * per_block..((pb + 1) * per_block).min(panels);
                let width = panels_here.len() * PANEL;
                let mut out = vec![0f32; rows_here.len() * width];
                for (i, p) in panels_here.enumerate() {
                    let panel = self.panel(p);
                    for (t, tile) in rows_here.chunks(4).enumerate() {
                        let first = tile[0];
                        let parts = &qx[2 * first * depth..2 * (first + tile.len()) * depth];
                        let mut acc = [[0f32; PANEL]; 4];
                        kernel.tile(tile.len(), parts, depth, panel, &mut acc);
                        for (r, acc) in acc.iter().take(tile.len()).enumerate() {
                            let step = sx[first + r] / RESIDUAL_DIVISOR;
                            let row = &mut out[(t * 4 + r) * width + i * PANEL..][..PANEL];
                            for (y, &a) in row.iter_mut().zip(acc) {
                                *y = a * step;
                            }
                        }
                    }
                }
                out
            })
            .collect();
        let mut y = vec![0f32; rows * n];
        for (&(rb, pb), out) in tasks.iter().zip(&results) {
            let first_row = rb * ROWS_PER_BLOCK;
            let first_col = pb * per_block * PANEL;
            let width = out.len() / (ROWS_PER_BLOCK.min(rows - first_row));
            let cols = width.min(n - first_col);
            for (r, src) in out.chunks(width).enumerate() {
                let row = first_row + r;
                y[row * n + first_col..row * n + first_col + cols].copy_from_slice(&src[..cols]);
            }
        }
        y
    }
}

/// Which code computes a tile; every one gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// [`vnni`]: AVX-512 VNNI, sixteen channels per vector.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// [`portable`]: plain Rust, any CPU.
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        if *VNNI {
            return Kernel::Vnni;
        }
        Kernel::Portable
    }

    /// Every kernel this CPU runs.
    #[cfg(test)]
    fn all() -> Vec<Self> {
        let mut all = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if *VNNI {
            all.push(Kernel::Vnni);
        }
        all
    }

    /// `acc[r][j] = sum_g sw[j, g] * J[r, j, g]` for the `rows <= 4` rows whose parts are
    /// `parts` (`2 * rows * depth` bytes) and the panel's channels.
    fn tile(
        self,
        rows: usize,
        parts: &[u8],
        depth: usize,
        panel: Panel<'_>,
        acc: &mut [[f32; PANEL]; 4],
    ) {
        assert_eq!(parts.len(), 2 * rows * depth, "invariant: two parts a row");
        assert_eq!(depth, panel.groups * GROUP, "invariant: the panel's depth");
        match self {
            #[cfg(target_arch = "x86_64")]
            // Safety: `Kernel::Vnni` exists only where the CPU has AVX-512 F, BW and VNNI,
            // and the asserts above give the sizes the kernel reads.
            Kernel::Vnni => unsafe {
                match rows {
                    1 => vnni::tile::<1>(parts, depth, panel, acc),
                    2 => vnni::tile::<2>(parts, depth, panel, acc),
                    3 => vnni::tile::<3>(parts, depth, panel, acc),
                    4 => vnni::tile::<4>(parts, depth, panel, acc),
                    _ => unreachable!("invariant: tiles of at most four rows"),
                }
            },
            Kernel::Portable => portable::tile(rows, parts, depth, panel, acc),
        }
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

/// Symmetric quantization of one group of weights to `[-127, 127]`; returns its scale.
fn quantize_group(w: &[f32], q: &mut [i8]) -> f32 {
    let amax = abs_max(w);
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        return 0.0;
    }
    let inv = WEIGHT_MAX / amax;
    for (q, w) in q.iter_mut().zip(w) {
        *q = round_even((w * inv).clamp(-WEIGHT_MAX, WEIGHT_MAX)) as i8;
    }
    amax / WEIGHT_MAX
}

/// Quantizes one activation row in two parts, bytes `q + 128` with `|q| <= 127` each:
/// `coarse` on the step `sx` (the row's largest magnitude / 127, returned) and `residual`,
/// what the coarse part leaves, on the step `sx / 256`. Together they hold every feature to
/// within about `sx / 512`, some 16 bits, so that one scale per row no longer flattens the
/// small features of a row that has a few large ones.
///
/// Plain arithmetic, so that every CPU rounds every row the same way; compiled a second time
/// for AVX-512, where the same operations run sixteen lanes at a time.
fn quantize_activations(x: &[f32], coarse: &mut [u8], residual: &mut [u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if *AVX512 {
        // Safety: the CPU has AVX-512 F and BW, checked once at start-up.
        return unsafe { quantize_activations_avx512(x, coarse, residual) };
    }
    quantize_activations_portable(x, coarse, residual)
}

#[cfg(target_arch = "x86_64")]
static AVX512: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
});

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_activations_avx512(x: &[f32], coarse: &mut [u8], residual: &mut [u8]) -> f32 {
    quantize_activations_portable(x, coarse, residual)
}

/// `v` clamped to [-127, 127] and rounded, as a stored byte `q + 128`; a NaN becomes -127.
#[inline(always)]
fn to_byte(v: f32) -> u8 {
    // `max` then `min` rather than `clamp`: `clamp` keeps a NaN, and its check per lane
    // stopped the loop from vectorising.
    #[allow(clippy::manual_clamp)] // `clamp` keeps NaNs; see above.
    let v = round_even(v.max(-ACTIVATION_MAX).min(ACTIVATION_MAX));
    // Safety: `v` is a whole number in [-127, 127] (`max` replaced any NaN), so the
    // conversion is exact; the checked `as` kept the loop scalar.
    let v: i32 = unsafe { v.to_int_unchecked() };
    (v + ACTIVATION_ZERO_POINT as i32) as u8
}

#[inline(always)]
fn quantize_activations_portable(x: &[f32], coarse: &mut [u8], residual: &mut [u8]) -> f32 {
    let amax = abs_max(x);
    if amax == 0.0 || !amax.is_finite() {
        // A zero row gives zeros; a row with an infinity has no meaningful int8 form and
        // gives zeros rather than NaNs that would look like a kernel fault.
        coarse.fill(ACTIVATION_ZERO_POINT);
        residual.fill(ACTIVATION_ZERO_POINT);
        return 0.0;
    }
    let sx = amax / ACTIVATION_MAX;
    let inv = ACTIVATION_MAX / amax;
    let inv_residual = inv * RESIDUAL_DIVISOR;
    for ((c, r), &x) in coarse.iter_mut().zip(residual.iter_mut()).zip(x) {
        #[allow(clippy::manual_clamp)] // as in `to_byte`
        let q = round_even((x * inv).max(-ACTIVATION_MAX).min(ACTIVATION_MAX));
        *c = to_byte(q);
        // What the coarse part leaves, in residual steps: at most 128 (half a coarse step),
        // which `to_byte` clamps to 127, a rare loss of one residual step.
        *r = to_byte((x - q * sx) * inv_residual);
    }
    sx
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

    /// Awkward shapes: inner sizes that are not multiples of any SIMD width or of a group,
    /// one group exactly, several groups and a partial one; channel counts below, at and
    /// past a panel.
    const SHAPES: [(usize, usize); 7] = [
        (1, 1),
        (7, 5),
        (33, 19),
        (70, 131),
        (45, 1100),
        (130, 64),
        (32, 576),
    ];
    /// Row counts of a single decode, tiles with a remainder, and more than a block.
    const ROWS: [usize; 7] = [1, 2, 3, 4, 5, 17, 70];

    /// The bound of one output: a weight is rounded to within half its group's step
    /// `sw / 2`, an activation (two parts) to within `ex = sx / 512` (a hair more where the
    /// residual clamps), so one term `x w` is off by at most `|x| sw / 2 + |w| ex + ex sw / 2`,
    /// and an output by the sum of that over `k`, plus the f32 rounding of the joins.
    fn error_bound(x: &[f32], w: &[f32], exact: f32) -> f32 {
        let sx = x.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        let ex = sx / 512.0 * 1.6;
        let group_step = |k: usize| {
            let g = k / GROUP;
            let end = ((g + 1) * GROUP).min(w.len());
            w[g * GROUP..end].iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0
        };
        x.iter()
            .zip(w)
            .enumerate()
            .map(|(k, (x, w))| {
                let sw = group_step(k);
                x.abs() * sw / 2.0 + w.abs() * ex + ex * sw / 2.0
            })
            .sum::<f32>()
            * 1.001
            + 1e-5 * exact.abs()
            + 1e-6
    }

    /// Each output is within the rounding bound of the f32 product ([`error_bound`]).
    #[test]
    fn int8_products_match_f32_within_the_rounding_bound() {
        for (n, k) in SHAPES {
            let w = random(n * k, 1);
            let m = Int8Matrix::quantize(&w, n, k);
            for rows in ROWS {
                let x = random(rows * k, 2 + rows as u64);
                let want = reference(&x, &w, rows, n, k);
                for kernel in Kernel::all() {
                    let got = m.forward_with(&x, rows, kernel);
                    for r in 0..rows {
                        let xr = &x[r * k..(r + 1) * k];
                        for c in 0..n {
                            let wc = &w[c * k..(c + 1) * k];
                            let (g, e) = (got[r * n + c], want[r * n + c]);
                            let bound = error_bound(xr, wc, e);
                            assert!(
                                (g - e).abs() <= bound,
                                "{kernel:?}, {rows}x{k} by {k}x{n}, ({r}, {c}): {g} vs {e}, \
                                 bound {bound}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Guards against the loss that made int8 change decisions (issue 17, item 0): with one
    /// 8-bit scale per activation row, a row with a few large features (as language models'
    /// activations have) rounded every small feature to zero, and outputs that depend on the
    /// small features lost them. Here one feature is 500 times the others, and the outputs of
    /// channels that read only the small features must keep their value to within 1%.
    #[test]
    fn a_large_feature_does_not_flatten_the_small_ones() {
        let (n, k) = (8, 256);
        let x: Vec<f32> = (0..k)
            .map(|i| {
                if i == 0 {
                    500.0
                } else {
                    ((i * 37 % 19) as f32 - 9.0) / 9.0
                }
            })
            .collect();
        // Channels that ignore feature 0 and read the others with varied weights.
        let w: Vec<f32> = (0..n * k)
            .map(|j| {
                if j % k == 0 {
                    0.0
                } else {
                    ((j * 13 % 23) as f32 - 11.0) / 11.0
                }
            })
            .collect();
        let m = Int8Matrix::quantize(&w, n, k);
        let want = reference(&x, &w, 1, n, k);
        for kernel in Kernel::all() {
            let got = m.forward_with(&x, 1, kernel);
            for c in 0..n {
                let scale: f32 = x
                    .iter()
                    .zip(&w[c * k..(c + 1) * k])
                    .map(|(x, w)| (x * w).abs())
                    .sum();
                assert!(
                    (got[c] - want[c]).abs() <= 0.01 * scale,
                    "{kernel:?}, channel {c}: {} vs {} (sum of |x w| {scale})",
                    got[c],
                    want[c]
                );
            }
        }
    }

    /// Guards against the other half of that loss: with one scale per output channel, a
    /// channel whose first weights are large rounded its small weights elsewhere to zero.
    /// Groups of 64 keep the small weights of a later group.
    #[test]
    fn a_large_weight_does_not_flatten_the_small_ones_of_other_groups() {
        let k = 4 * GROUP;
        let mut w: Vec<f32> = (0..k)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 500.0)
            .collect();
        w[0] = 2.0;
        let x: Vec<f32> = (0..k)
            .map(|i| {
                if i < GROUP {
                    0.0
                } else {
                    ((i * 5 % 13) as f32 - 6.0) / 6.0
                }
            })
            .collect();
        let m = Int8Matrix::quantize(&w, 1, k);
        let want = reference(&x, &w, 1, 1, k)[0];
        let scale: f32 = x.iter().zip(&w).map(|(x, w)| (x * w).abs()).sum();
        for kernel in Kernel::all() {
            let got = m.forward_with(&x, 1, kernel)[0];
            assert!(
                (got - want).abs() <= 0.01 * scale,
                "{kernel:?}: {got} vs {want} (sum of |x w| {scale})"
            );
        }
    }

    /// Every kernel gives the portable kernel's bits, for every row count: results cannot
    /// depend on the machine or the batch.
    #[test]
    fn every_kernel_gives_the_portable_bits() {
        for (n, k) in SHAPES {
            let m = Int8Matrix::quantize(&random(n * k, 3), n, k);
            for rows in ROWS {
                let x = random(rows * k, 40 + rows as u64);
                let want = m.forward_with(&x, rows, Kernel::Portable);
                for kernel in Kernel::all() {
                    let got = m.forward_with(&x, rows, kernel);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{kernel:?}, {rows}x{k} by {k}x{n}");
                }
            }
        }
    }

    /// Row r of a batch is bit for bit row r computed alone, for every batch size the engine
    /// produces (a single decode, small and large batches, prefill chunks).
    #[test]
    fn every_row_of_a_batch_equals_that_row_alone() {
        for (n, k) in SHAPES {
            let m = Int8Matrix::quantize(&random(n * k, 5), n, k);
            for rows in ROWS {
                let x = random(rows * k, 60 + rows as u64);
                let batch = m.forward(&x, rows);
                for r in 0..rows {
                    let alone = m.forward(&x[r * k..(r + 1) * k], 1);
                    let same = batch[r * n..(r + 1) * n]
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{rows}x{k} by {k}x{n}: row {r} differs from its solo run"
                    );
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
                let len = x.len();
                let (mut a, mut ar) = (vec![0u8; len], vec![0u8; len]);
                let (mut b, mut br) = (vec![0u8; len], vec![0u8; len]);
                // Safety: AVX-512 checked above.
                let sa = unsafe { quantize_activations_avx512(&x, &mut a, &mut ar) };
                let sb = quantize_activations_portable(&x, &mut b, &mut br);
                assert_eq!(
                    (sa.to_bits(), &a, &ar),
                    (sb.to_bits(), &b, &br),
                    "row of {len}"
                );
            }
        }
    }

    /// Zero rows and channels give zeros, not NaNs.
    #[test]
    fn zero_rows_and_channels_give_zeros() {
        let (n, k) = (3, 8);
        let mut w = random(n * k, 9);
        w[k..2 * k].fill(0.0);
        let m = Int8Matrix::quantize(&w, n, k);
        let mut x = random(2 * k, 10);
        x[..k].fill(0.0);
        let y = m.forward(&x, 2);
        assert!(y[..n].iter().all(|v| *v == 0.0), "{y:?}");
        assert_eq!(y[n + 1], 0.0);
        assert!(y.iter().all(|v| v.is_finite()));
    }
}
