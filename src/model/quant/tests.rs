use super::*;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
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

/// Awkward shapes: widths that are not multiples of a block, one block exactly, several
/// and a partial one; channel counts below, at and past a panel.
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (7, 5),
    (33, 19),
    (70, 131),
    (45, 1100),
    (130, 64),
    (32, 576),
];
/// Row counts of a single decode, tiles with a remainder, and more than a block of rows.
const ROWS: [usize; 7] = [1, 2, 3, 4, 5, 17, 70];

/// A matrix of the file type `dtype` (`n` by `k`, `k` whole blocks of it) as throng keeps it
/// stored, and the f32 values it stands for.
fn stored(
    dtype: GgmlDType,
    n: usize,
    k: usize,
    seed: u64,
    precision: Precision,
) -> (QuantMatrix, Vec<f32>) {
    let dense = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&dense, dtype).unwrap();
    let values = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
    let data = q.data().unwrap();
    let row = data.len() / n;
    let kind = blocks::stored_kind(dtype).unwrap();
    let m = QuantMatrix::pack(kind, precision, n, k, |c| {
        let mut out = Vec::new();
        blocks::decode_row(dtype, &data[c * row..(c + 1) * row], &mut out);
        out
    });
    (m, values.to_vec1().unwrap())
}

/// Every matrix the tests run, at both precisions: 8-bit from f32 in every awkward shape,
/// and each stored file type in shapes its blocks allow.
fn matrices() -> Vec<(String, QuantMatrix, Vec<f32>)> {
    let mut all = Vec::new();
    for precision in [Precision::Eight, Precision::Sixteen] {
        for (n, k) in SHAPES {
            let w = random(n * k, 1 + n as u64);
            let m = QuantMatrix::quantize(&w, n, k, precision);
            // The values the 8-bit blocks stand for.
            let mut values = Vec::with_capacity(n * k);
            for c in 0..n {
                let mut b = Vec::new();
                blocks::quantize_row(&w[c * k..(c + 1) * k], &mut b);
                values.extend((0..k).map(|i| b[i / BLOCK].d * b[i / BLOCK].q[i % BLOCK] as f32));
            }
            all.push((format!("q8 {n}x{k} {precision:?}"), m, values));
        }
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
            for (n, k) in [(1, 32), (17, 96), (48, 576)] {
                let (m, values) = stored(dtype, n, k, 7 + n as u64, precision);
                all.push((format!("{dtype:?} {n}x{k} {precision:?}"), m, values));
            }
        }
        let (m, values) = stored(GgmlDType::Q4K, 20, 512, 9, precision);
        all.push((format!("Q4K 20x512 {precision:?}"), m, values));
    }
    all
}

/// The bound of one output against the f32 product of the weights' own values: each input
/// is held to within half its block's step (`dx / 2` in 8 bits; `dx / 512`, a hair more where
/// the residual clamps, in two parts), so an output is off by at most the sum of `|w|` times
/// that, plus the f32 rounding of the joins.
fn error_bound(x: &[f32], w: &[f32], exact: f32, precision: Precision) -> f32 {
    let step = |i: usize| {
        let b = i / BLOCK;
        let end = ((b + 1) * BLOCK).min(x.len());
        let dx = x[b * BLOCK..end].iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        match precision {
            Precision::Eight => dx / 2.0,
            Precision::Sixteen => dx / 256.0 * 1.6,
        }
    };
    let sum: f32 = w.iter().enumerate().map(|(i, w)| w.abs() * step(i)).sum();
    sum * 1.001 + 1e-5 * exact.abs() + 1e-6
}

#[test]
fn products_match_the_f32_product_of_the_stored_values_within_the_rounding_bound() {
    for (name, m, w) in matrices() {
        let (n, k) = (m.out_features, m.in_features);
        for rows in ROWS {
            let x = random(rows * k, 2 + rows as u64);
            let want = reference(&x, &w, rows, n, k);
            for kernel in Kernel::all() {
                let got = m.forward_with(&x, rows, kernel);
                for r in 0..rows {
                    for c in 0..n {
                        let (g, e) = (got[r * n + c], want[r * n + c]);
                        let bound = error_bound(
                            &x[r * k..(r + 1) * k],
                            &w[c * k..(c + 1) * k],
                            e,
                            m.precision,
                        );
                        assert!(
                            (g - e).abs() <= bound,
                            "{name}, {kernel:?}, {rows} rows, ({r}, {c}): {g} vs {e}, bound {bound}"
                        );
                    }
                }
            }
        }
    }
}

/// Every kernel gives the portable kernel's bits, for every row count and weight kind:
/// results cannot depend on the machine or the batch.
#[test]
fn every_kernel_gives_the_portable_bits() {
    for (name, m, _) in matrices() {
        let k = m.in_features;
        for rows in ROWS {
            let x = random(rows * k, 40 + rows as u64);
            let want = m.forward_with(&x, rows, Kernel::Portable);
            for kernel in Kernel::all() {
                let got = m.forward_with(&x, rows, kernel);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name}, {kernel:?}, {rows} rows");
            }
        }
    }
}

/// Row r of a batch is bit for bit row r computed alone, for every batch size the engine
/// produces (a single decode, small and large batches, prefill chunks).
#[test]
fn every_row_of_a_batch_equals_that_row_alone() {
    for (name, m, _) in matrices() {
        let (n, k) = (m.out_features, m.in_features);
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
                    "{name}, {rows} rows: row {r} differs from its solo run"
                );
            }
        }
    }
}

/// Guards against the loss that made int8 change decisions (issue 17, item 0): with one
/// 8-bit scale per activation row, a row with a few large features (as language models'
/// activations have) rounded every small feature to zero. Here one feature is 500 times the
/// others, and channels that read only the small features keep their value to within 1%.
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
    let w: Vec<f32> = (0..n * k)
        .map(|j| {
            if j % k < BLOCK {
                0.0
            } else {
                ((j * 13 % 23) as f32 - 11.0) / 11.0
            }
        })
        .collect();
    let m = QuantMatrix::quantize(&w, n, k, Precision::Eight);
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

/// Zero rows and channels give zeros, not NaNs; so does a row with an infinity.
#[test]
fn zero_rows_and_channels_give_zeros() {
    let (n, k) = (3, 40);
    let mut w = random(n * k, 9);
    w[k..2 * k].fill(0.0);
    let m = QuantMatrix::quantize(&w, n, k, Precision::Sixteen);
    let mut x = random(2 * k, 10);
    x[..k].fill(0.0);
    let y = m.forward(&x, 2);
    assert!(y[..n].iter().all(|v| *v == 0.0), "{y:?}");
    assert_eq!(y[n + 1], 0.0);
    assert!(y.iter().all(|v| v.is_finite()));
}

/// The most an 8-bit block and its inputs can give stays exact: weights of -128 (which a
/// file may hold) and 127 against inputs at both ends, on every kernel.
#[test]
fn extreme_quants_sum_exactly_on_every_kernel() {
    let (n, k) = (16, 64);
    let m = QuantMatrix::pack(Kind::Q8, Precision::Sixteen, n, k, |c| {
        let mut block = Block::ZERO;
        for (i, q) in block.q.iter_mut().enumerate() {
            *q = if (i + c).is_multiple_of(2) { -128 } else { 127 };
        }
        block.d = 1.0;
        vec![block; 2]
    });
    let x: Vec<f32> = (0..k)
        .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    let want = m.forward_with(&x, 1, Kernel::Portable);
    for kernel in Kernel::all() {
        assert_eq!(m.forward_with(&x, 1, kernel), want, "{kernel:?}");
    }
    // x is +-1 (its parts +-127 and 0): a sum that saturated anywhere would be off by
    // thousands; only the scale's rounding (1 / 127) is allowed.
    for (c, y) in want.iter().enumerate() {
        let exact: f32 = (0..k)
            .map(|i| {
                let q = if (i % BLOCK + c).is_multiple_of(2) {
                    -128.0
                } else {
                    127.0
                };
                q * x[i]
            })
            .sum();
        assert!(
            (y - exact).abs() <= 1e-5 * 128.0 * k as f32,
            "channel {c}: {y} vs {exact}"
        );
    }
}

/// Not a test: GMAC/s of each kernel on SmolLM2's gate+up shape (`cargo test --release --lib
/// quant::tests::speed -- --ignored --nocapture`).
#[test]
#[ignore]
fn speed() {
    let (n, k) = (3072, 576);
    for precision in [Precision::Eight, Precision::Sixteen] {
        let (q4, _) = stored(GgmlDType::Q4_1, n, k, 3, precision);
        let q8 = QuantMatrix::quantize(&random(n * k, 4), n, k, precision);
        for rows in [1, 64, 256] {
            let x = random(rows * k, 5);
            for (name, m) in [("q4", &q4), ("q8", &q8)] {
                for kernel in Kernel::all().into_iter().filter(|k| *k != Kernel::Portable) {
                    let reps = 2000 / rows.min(100) + 3;
                    let _ = m.forward_with(&x, rows, kernel);
                    let start = std::time::Instant::now();
                    for _ in 0..reps {
                        std::hint::black_box(m.forward_with(&x, rows, kernel));
                    }
                    let secs = start.elapsed().as_secs_f64() / reps as f64;
                    eprintln!(
                        "{name} {precision:?} {kernel:?} rows {rows}: {:.1} GMAC/s ({:.0} us)",
                        (rows * n * k) as f64 / secs / 1e9,
                        secs * 1e6
                    );
                }
            }
        }
    }
}
