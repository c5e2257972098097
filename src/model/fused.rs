//! Fused element-wise steps of the forward pass, for f32 activations on the CPU: the residual
//! addition with the RMSNorm that follows it, and SwiGLU.
//!
//! candle runs each of these as several single-threaded passes, each allocating its output
//! (add, square, mean, divide, multiply; silu, narrow, multiply), which on a 512-token step
//! costs as much as a matrix product. Here each is one pass over a row, rows spread over the
//! rayon pool. Every row is computed alone, in a fixed order, so results stay batch invariant.
//! Other devices and dtypes use candle's ops.

use super::attention::exp_nonpositive;
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

/// Rows per rayon task: enough to amortise the hand-off on a 576-wide row.
const ROWS_PER_TASK: usize = 8;

/// Lanes of the partial sums of squares: wide enough to vectorise, and a fixed order.
const LANES: usize = 16;

fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 || !t.device().is_cpu() {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(cpu), Some((lo, hi))) => {
            Some(f(&cpu.as_slice::<f32>().ok()?[lo..hi]))
        }
        _ => None,
    }
}

/// `x + delta` and its RMSNorm with `weight`: `(T, hidden)` each.
pub(crate) fn add_rms_norm(
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> candle_core::Result<(Tensor, Tensor)> {
    let fused = with_f32(x, |xs| {
        with_f32(delta, |ds| {
            with_f32(weight, |w| {
                let d = w.len();
                let mut sum = vec![0f32; xs.len()];
                let mut normed = vec![0f32; xs.len()];
                sum.par_chunks_mut(ROWS_PER_TASK * d)
                    .zip(normed.par_chunks_mut(ROWS_PER_TASK * d))
                    .zip(
                        xs.par_chunks(ROWS_PER_TASK * d)
                            .zip(ds.par_chunks(ROWS_PER_TASK * d)),
                    )
                    .for_each(|((sum, normed), (xs, ds))| {
                        for (((s, n), x), dl) in sum
                            .chunks_mut(d)
                            .zip(normed.chunks_mut(d))
                            .zip(xs.chunks(d))
                            .zip(ds.chunks(d))
                        {
                            for ((s, x), dl) in s.iter_mut().zip(x).zip(dl) {
                                *s = x + dl;
                            }
                            norm_row(s, w, eps, n);
                        }
                    });
                (sum, normed)
            })
        })
    });
    match fused {
        Some(Some(Some((sum, normed)))) => {
            let shape = x.shape();
            Ok((
                Tensor::from_vec(sum, shape, &Device::Cpu)?,
                Tensor::from_vec(normed, shape, &Device::Cpu)?,
            ))
        }
        _ => {
            let sum = (x + delta)?;
            let normed = candle_nn::ops::rms_norm(&sum, weight, eps)?;
            Ok((sum, normed))
        }
    }
}

/// RMSNorm of `x` `(T, hidden)` with `weight`.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> candle_core::Result<Tensor> {
    let fused = with_f32(x, |xs| {
        with_f32(weight, |w| {
            let d = w.len();
            let mut normed = vec![0f32; xs.len()];
            normed
                .par_chunks_mut(ROWS_PER_TASK * d)
                .zip(xs.par_chunks(ROWS_PER_TASK * d))
                .for_each(|(normed, xs)| {
                    for (n, x) in normed.chunks_mut(d).zip(xs.chunks(d)) {
                        norm_row(x, w, eps, n);
                    }
                });
            normed
        })
    });
    match fused {
        Some(Some(normed)) => Tensor::from_vec(normed, x.shape(), &Device::Cpu),
        _ => candle_nn::ops::rms_norm(x, weight, eps),
    }
}

/// `out = x / sqrt(mean(x^2) + eps) * w`, the mean summed in sixteen fixed lanes.
#[inline]
fn norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i] * c[i];
        }
    }
    let mut squares = acc.iter().sum::<f32>();
    for v in rest {
        squares += v * v;
    }
    let scale = 1.0 / (squares / x.len() as f32 + eps).sqrt();
    for ((o, x), w) in out.iter_mut().zip(x).zip(w) {
        *o = x * scale * w;
    }
}

/// `silu(gate) * up` of the fused projection `(T, 2 intermediate)`, gate first; returns
/// `(T, intermediate)`.
pub(crate) fn swiglu(gate_up: &Tensor) -> candle_core::Result<Tensor> {
    let (t, width) = gate_up.dims2()?;
    let inter = width / 2;
    let fused = with_f32(gate_up, |gu| {
        let mut out = vec![0f32; t * inter];
        out.par_chunks_mut(ROWS_PER_TASK * inter)
            .zip(gu.par_chunks(ROWS_PER_TASK * width))
            .for_each(|(out, gu)| {
                for (o, row) in out.chunks_mut(inter).zip(gu.chunks(width)) {
                    let (gate, up) = row.split_at(inter);
                    for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                        *o = silu(g) * u;
                    }
                }
            });
        out
    });
    match fused {
        Some(out) => Tensor::from_vec(out, (t, inter), &Device::Cpu),
        None => candle_nn::ops::swiglu(gate_up),
    }
}

/// `g * sigmoid(g)`, with `e^-|g|` from the attention kernel's vectorisable exponential.
#[inline(always)]
fn silu(g: f32) -> f32 {
    let e = exp_nonpositive(-g.abs());
    let sigmoid = if g >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    };
    g * sigmoid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let data: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| rng.random_range(-4.0..4.0))
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// The fused ops equal candle's within float rounding, on widths that are not a multiple
    /// of the sixteen lanes.
    #[test]
    fn fused_ops_match_candle() {
        for (t, d) in [(1, 7), (3, 64), (17, 100), (64, 576)] {
            let (x, delta) = (random((t, d), 1), random((t, d), 2));
            let w = random((1, d), 3).flatten_all().unwrap();
            let (sum, normed) = add_rms_norm(&x, &delta, &w, 1e-5).unwrap();
            let want_sum = (&x + &delta).unwrap();
            assert_eq!(max_diff(&sum, &want_sum), 0.0);
            let want = candle_nn::ops::rms_norm(&want_sum, &w, 1e-5).unwrap();
            assert!(max_diff(&normed, &want) < 1e-5, "rms norm {t}x{d}");
            let plain = rms_norm(&want_sum, &w, 1e-5).unwrap();
            assert_eq!(max_diff(&plain, &normed), 0.0);
            let gu = random((t, 2 * d), 4);
            let got = swiglu(&gu).unwrap();
            let want = candle_nn::ops::swiglu(&gu).unwrap();
            assert!(max_diff(&got, &want) < 1e-5, "swiglu {t}x{d}");
        }
    }

    /// Row r of a batch equals that row alone, bit for bit.
    #[test]
    fn fused_ops_are_batch_invariant() {
        let (t, d) = (33, 96);
        let (x, delta, gu) = (random((t, d), 5), random((t, d), 6), random((t, 2 * d), 7));
        let w = random((1, d), 8).flatten_all().unwrap();
        let (_, normed) = add_rms_norm(&x, &delta, &w, 1e-6).unwrap();
        let act = swiglu(&gu).unwrap();
        for r in [0, 9, 32] {
            let row = |a: &Tensor| a.narrow(0, r, 1).unwrap().contiguous().unwrap();
            let (_, alone) = add_rms_norm(&row(&x), &row(&delta), &w, 1e-6).unwrap();
            assert_eq!(max_diff(&alone, &row(&normed)), 0.0);
            assert_eq!(max_diff(&swiglu(&row(&gu)).unwrap(), &row(&act)), 0.0);
        }
    }
}
