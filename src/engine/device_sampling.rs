//! Grammar masks and sampling on the device: the logits of a step stay where the model wrote
//! them, the masks and one uniform draw per row go up, and one token id per row comes back.
//!
//! The kernel is `kernels/sampling.cu` (compiled to PTX by build.rs with the `cuda` feature);
//! [`mirror`] computes exactly what it computes, on the host, for the tests. Greedy rows give
//! the same token as the host sampler. Sampled rows draw from the same distribution as the host
//! sampler, with the sequence's own seeded draw, but walk the kept tokens in id order rather
//! than by decreasing probability, so the same draw can pick a different token; and ties at the
//! top-p boundary are all kept. Runs on a GPU are not bit-identical to the CPU's anyway.

use super::sampler::SamplingParams;
use toktrie::SimpleVob;

/// One row of a step's logits to sample on the device.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRow<'a> {
    /// Tokens the row's grammar allows; `None`: all.
    pub mask: Option<&'a SimpleVob>,
    pub params: SamplingParams,
    /// The row's draw in `[0, 1)` from its sequence's RNG (unused when greedy).
    pub uniform: f32,
}

/// Fixed-point scale of the kernel's weights `exp(s - max)`.
const WEIGHT_ONE: f64 = (1u64 << 40) as f64;

fn order_key(s: f32) -> u32 {
    let u = s.to_bits();
    if u & 0x8000_0000 != 0 {
        !u
    } else {
        u | 0x8000_0000
    }
}

fn weight(s: f32, max: f32) -> u64 {
    ((s - max).exp() as f64 * WEIGHT_ONE) as u64
}

/// The token the device kernel picks for `row` over `logits` (one row of the vocabulary), or
/// `None` when the mask and the logits leave no candidate. The tests hold the kernel to it.
pub fn mirror(logits: &[f32], row: &DeviceRow<'_>) -> Option<u32> {
    // As `constraint::apply_mask`: tokens past the mask's words are not masked.
    let allowed = |i: usize| {
        row.mask
            .is_none_or(|m| i / 32 >= m.as_slice().len() || m.get(i))
    };
    let p = &row.params;
    let greedy = p.is_greedy();
    let inv_t = if greedy { 1.0 } else { 1.0 / p.temperature };
    // (id, score) of every candidate, in id order.
    let candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|&(i, l)| allowed(i) && l.is_finite())
        .map(|(i, &l)| (i as u32, l * inv_t))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    if greedy {
        let mut best = candidates[0];
        for &c in &candidates[1..] {
            if c.1 > best.1 {
                best = c;
            }
        }
        return Some(best.0);
    }
    let max = candidates
        .iter()
        .map(|c| c.1)
        .fold(f32::NEG_INFINITY, f32::max);
    // top-k: keys above the k-th largest, and the first ties at it in id order.
    let kept_k: Vec<(u32, f32)> = match p.top_k {
        Some(k) if k < candidates.len() => {
            let mut keys: Vec<u32> = candidates.iter().map(|c| order_key(c.1)).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            let cut = keys[k - 1];
            let above = keys.iter().filter(|&&key| key > cut).count();
            let mut ties_left = k - above;
            candidates
                .iter()
                .copied()
                .filter(|c| {
                    let key = order_key(c.1);
                    if key > cut {
                        true
                    } else if key == cut && ties_left > 0 {
                        ties_left -= 1;
                        true
                    } else {
                        false
                    }
                })
                .collect()
        }
        _ => candidates,
    };
    let p_key = top_p_key(&kept_k, max, p.top_p);
    let kept: Vec<(u32, u64)> = kept_k
        .iter()
        .filter(|c| order_key(c.1) >= p_key)
        .map(|c| (c.0, weight(c.1, max)))
        .collect();
    let total: u64 = kept.iter().map(|c| c.1).sum();
    let target = ((row.uniform as f64 * total as f64) as u64).min(total - 1);
    let mut running = 0u64;
    for &(id, w) in &kept {
        running += w;
        if running > target {
            return Some(id);
        }
    }
    kept.last().map(|c| c.0)
}

/// The highest order key at which the weight of the candidates at or above it reaches the
/// `top_p` share of the total (0, keeping every candidate, when `top_p` is 1).
fn top_p_key(kept_k: &[(u32, f32)], max: f32, top_p: f32) -> u32 {
    // Not `>= 1.0`: a NaN keeps every candidate, as a `top_p` of 1 does.
    if top_p < 1.0 {
        let total: u64 = kept_k.iter().map(|c| weight(c.1, max)).sum();
        let goal = ((top_p as f64 * total as f64).ceil() as u64).max(1);
        let mut by_key: Vec<(u32, u64)> = kept_k
            .iter()
            .map(|c| (order_key(c.1), weight(c.1, max)))
            .collect();
        by_key.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
        let mut above = 0u64;
        let mut threshold = by_key.last().map_or(0, |x| x.0);
        let mut i = 0;
        while i < by_key.len() {
            let key = by_key[i].0;
            let mut at = 0u64;
            while i < by_key.len() && by_key[i].0 == key {
                at += by_key[i].1;
                i += 1;
            }
            if above + at >= goal {
                threshold = key;
                break;
            }
            above += at;
        }
        threshold
    } else {
        0
    }
}

#[cfg(feature = "cuda")]
pub use cuda::sample_on_device;

#[cfg(feature = "cuda")]
mod cuda {
    use super::DeviceRow;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::{Storage, Tensor};
    use std::time::{Duration, Instant};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sampling.ptx"));
    /// Threads per block, as `THREADS` in kernels/sampling.cu.
    const THREADS: u32 = 1024;

    /// Samples one token per row of `logits` `(rows.len(), vocab)` (f32 or bf16, on a CUDA
    /// device). Uploads the masks and parameters, runs the kernel, and downloads the ids: the
    /// download is the step's one wait for the device. Returns the ids and the time spent
    /// copying; with `profile`, the device is synchronised before the download so that the
    /// download's time is the copy's alone.
    pub fn sample_on_device(
        logits: &Tensor,
        rows: &[DeviceRow<'_>],
        profile: bool,
    ) -> candle_core::Result<(Vec<Option<u32>>, Duration)> {
        let (n, vocab) = logits.dims2()?;
        if n != rows.len() {
            candle_core::bail!("{} logit rows for {} sampling rows", n, rows.len());
        }
        if n == 0 {
            return Ok((Vec::new(), Duration::ZERO));
        }
        let logits = logits.to_dtype(candle_core::DType::F32)?.contiguous()?;
        let (storage, layout) = logits.storage_and_layout();
        let Storage::Cuda(storage) = &*storage else {
            candle_core::bail!("device sampling needs logits on a CUDA device");
        };
        let dev = &storage.device;
        let logits_slice = storage
            .as_cuda_slice::<f32>()?
            .slice(layout.start_offset()..);

        let words = vocab.div_ceil(32);
        let mut masks: Vec<u32> = Vec::new();
        let mut mask_of_row = Vec::with_capacity(n);
        for row in rows {
            match row.mask {
                None => mask_of_row.push(-1i32),
                Some(mask) => {
                    mask_of_row.push((masks.len() / words) as i32);
                    let bits = mask.as_slice();
                    let take = bits.len().min(words);
                    masks.extend_from_slice(&bits[..take]);
                    // As `constraint::apply_mask`: tokens past the mask's words are not masked.
                    masks.extend(std::iter::repeat_n(u32::MAX, words - take));
                }
            }
        }
        if masks.is_empty() {
            masks.push(0);
        }
        let temperature: Vec<f32> = rows.iter().map(|r| r.params.temperature).collect();
        let top_k: Vec<i32> = rows
            .iter()
            .map(|r| {
                r.params
                    .top_k
                    .map_or(0, |k| k.min(i32::MAX as usize) as i32)
            })
            .collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.params.top_p).collect();
        let uniform: Vec<f32> = rows.iter().map(|r| r.uniform).collect();

        let upload = Instant::now();
        let masks = dev.clone_htod(&masks)?;
        let mask_of_row = dev.clone_htod(&mask_of_row)?;
        let temperature = dev.clone_htod(&temperature)?;
        let top_k = dev.clone_htod(&top_k)?;
        let top_p = dev.clone_htod(&top_p)?;
        let uniform = dev.clone_htod(&uniform)?;
        let out = dev.alloc_zeros::<i32>(n)?;
        let mut copies = upload.elapsed();

        let func = dev.get_or_load_custom_func("throng_sample_rows", "throng_sampling", PTX)?;
        let (vocab_i32, words_i32) = (vocab as i32, words as i32);
        let mut builder = func.builder();
        builder.arg(&logits_slice);
        builder.arg(&vocab_i32);
        builder.arg(&masks);
        builder.arg(&words_i32);
        builder.arg(&mask_of_row);
        builder.arg(&temperature);
        builder.arg(&top_k);
        builder.arg(&top_p);
        builder.arg(&uniform);
        builder.arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's signature in kernels/sampling.cu; every
        // buffer holds the number of elements the kernel reads for `n` rows.
        unsafe { builder.launch(cfg) }.w()?;
        if profile {
            dev.cuda_stream().synchronize().w()?;
        }
        let download = Instant::now();
        let ids = dev.clone_dtoh(&out)?;
        if profile {
            copies += download.elapsed();
        }
        let ids = ids.into_iter().map(|id| u32::try_from(id).ok()).collect();
        Ok((ids, copies))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::Sampler;
    use rand::{Rng, SeedableRng};

    fn params(temperature: f32, top_k: Option<usize>, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: 0,
        }
    }

    fn row(params: SamplingParams, uniform: f32) -> DeviceRow<'static> {
        DeviceRow {
            mask: None,
            params,
            uniform,
        }
    }

    /// Greedy rows pick exactly what the host sampler picks: the largest allowed finite
    /// logit, the lowest id among equals.
    #[test]
    fn greedy_matches_the_host_sampler() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for case in 0..200 {
            let n = 1 + case % 70;
            let mut logits: Vec<f32> = (0..n).map(|_| rng.random_range(-3i32..3) as f32).collect();
            if case % 5 == 0 {
                logits[case % n] = f32::NAN;
            }
            let mut mask = SimpleVob::alloc(n);
            for i in 0..n {
                if rng.random_bool(0.6) {
                    mask.allow_token(i as u32);
                }
            }
            let mut masked = logits.clone();
            super::super::constraint::apply_mask(&mut masked, &mask);
            let host = Sampler::new(SamplingParams::greedy()).sample(&masked);
            let device = mirror(
                &logits,
                &DeviceRow {
                    mask: Some(&mask),
                    params: SamplingParams::greedy(),
                    uniform: 0.5,
                },
            );
            assert_eq!(device, host, "case {case}: {logits:?}");
        }
    }

    /// top-k and top-p keep the same tokens as the host sampler (no ties here), and the
    /// draws follow the kept tokens' probabilities.
    #[test]
    fn sampling_keeps_the_host_samplers_tokens_with_its_probabilities() {
        let logits = [2.0f32, 0.5, 1.5, -1.0, 1.0, 0.0, f32::NEG_INFINITY, 0.25];
        let cases = [
            params(1.0, None, 1.0),
            params(0.7, Some(3), 1.0),
            params(1.0, None, 0.8),
            params(1.3, Some(5), 0.9),
        ];
        for p in cases {
            // The host sampler's kept set, from many draws.
            let mut host = Sampler::new(SamplingParams { seed: 9, ..p });
            let mut host_counts = [0usize; 8];
            let mut device_counts = [0usize; 8];
            let draws = 20_000;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
            for _ in 0..draws {
                host_counts[host.sample(&logits).unwrap() as usize] += 1;
                let u: f32 = rng.random();
                device_counts[mirror(&logits, &row(p, u)).unwrap() as usize] += 1;
            }
            for i in 0..8 {
                assert_eq!(
                    host_counts[i] == 0,
                    device_counts[i] == 0,
                    "{p:?}: token {i} kept by one sampler only ({host_counts:?} vs {device_counts:?})"
                );
                let (h, d) = (
                    host_counts[i] as f64 / draws as f64,
                    device_counts[i] as f64 / draws as f64,
                );
                assert!((h - d).abs() < 0.02, "{p:?}: token {i}: {h} vs {d}");
            }
        }
    }

    /// The draw is the inverse CDF over the kept tokens in id order.
    #[test]
    fn the_uniform_draw_walks_the_kept_tokens_in_id_order() {
        let logits = [0.0f32; 4];
        let p = params(1.0, None, 1.0);
        assert_eq!(mirror(&logits, &row(p, 0.0)), Some(0));
        assert_eq!(mirror(&logits, &row(p, 0.26)), Some(1));
        assert_eq!(mirror(&logits, &row(p, 0.74)), Some(2));
        assert_eq!(mirror(&logits, &row(p, 0.999_999)), Some(3));
        // top-k ties at the cut are kept by lowest id.
        let tied = [1.0f32, 0.0, 1.0, 1.0];
        let k2 = params(1.0, Some(2), 1.0);
        assert_eq!(mirror(&tied, &row(k2, 0.9)), Some(2));
        assert_eq!(mirror(&tied, &row(k2, 0.1)), Some(0));
    }

    /// The CUDA kernel itself, compiled for the CPU with a C++ compiler and a shim of the CUDA
    /// it uses (kernels/emulate), 64 threads a block, picks exactly what its mirror picks: every
    /// kind of row (greedy, temperature, top-k with ties, top-p, masks, NaN and infinite logits,
    /// nothing allowed) over vocabularies that do not divide into the threads evenly.
    #[test]
    fn the_kernel_run_on_the_cpu_picks_what_its_mirror_picks() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/emulate");
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("harness");
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let built = Command::new(&compiler)
            .args(["-std=c++20", "-O2", "-DTHREADS=64", "-pthread"])
            .arg(root.join("sampling_harness.cpp"))
            .arg("-o")
            .arg(&exe)
            .status();
        match built {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("{compiler} failed to build the kernel's CPU harness: {s}"),
            Err(e) => {
                eprintln!(
                    "SKIPPED: no C++20 compiler ({compiler}: {e}) to run the kernel on the CPU"
                );
                return;
            }
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        // 48 rows in all: every combination of temperature, top-k and top-p once.
        let rows = 24;
        for (v, vocab) in [77usize, 1000].into_iter().enumerate() {
            let words = vocab.div_ceil(32);
            let mut input = String::new();
            let mut cases = Vec::new();
            for r in (v * rows)..((v + 1) * rows) {
                // Coarse logits make ties; some rows get NaN and -inf.
                let mut logits: Vec<f32> = (0..vocab)
                    .map(|_| (rng.random_range(-40i32..40) as f32) / 8.0)
                    .collect();
                if r % 7 == 0 {
                    logits[rng.random_range(0..vocab)] = f32::NAN;
                    logits[rng.random_range(0..vocab)] = f32::NEG_INFINITY;
                }
                let mask = (r % 3 != 0).then(|| {
                    let mut m = SimpleVob::alloc(vocab);
                    let density = if r % 11 == 0 {
                        0.0
                    } else {
                        [0.02, 0.3, 0.9][r % 3]
                    };
                    for i in 0..vocab {
                        if rng.random_bool(density) {
                            m.allow_token(i as u32);
                        }
                    }
                    m
                });
                let temperature = [0.0f32, 0.7, 1.0, 1.5][r % 4];
                let top_k = [None, Some(1), Some(3), Some(40)][(r / 4) % 4];
                let top_p = [1.0f32, 0.9, 0.5][(r / 16) % 3];
                let uniform: f32 = rng.random();
                input.push_str(&format!(
                    "{temperature} {} {top_p} {uniform} {}\n",
                    top_k.unwrap_or(0),
                    u8::from(mask.is_some())
                ));
                if let Some(m) = &mask {
                    for w in &m.as_slice()[..words] {
                        input.push_str(&format!("{w:x} "));
                    }
                    input.push('\n');
                }
                for l in &logits {
                    input.push_str(&format!("{:x} ", l.to_bits()));
                }
                input.push('\n');
                cases.push((logits, mask, params(temperature, top_k, top_p), uniform));
            }
            let mut child = Command::new(&exe)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let header = format!("{rows} {vocab} {words}\n");
            child
                .stdin
                .take()
                .unwrap()
                .write_all((header + &input).as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "the harness failed on vocabulary {vocab}"
            );
            let kernel: Vec<i64> = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| l.trim().parse().unwrap())
                .collect();
            assert_eq!(kernel.len(), rows);
            for (r, ((logits, mask, p, u), got)) in cases.iter().zip(kernel).enumerate() {
                let r = v * rows + r;
                let want = mirror(
                    logits,
                    &DeviceRow {
                        mask: mask.as_ref(),
                        params: *p,
                        uniform: *u,
                    },
                );
                assert_eq!(
                    got,
                    want.map_or(-1, i64::from),
                    "vocabulary {vocab}, row {r}: {p:?}, uniform {u}"
                );
            }
        }
    }

    #[test]
    fn a_row_with_nothing_allowed_has_no_token() {
        let mask = SimpleVob::alloc(4);
        let r = DeviceRow {
            mask: Some(&mask),
            params: params(1.0, None, 1.0),
            uniform: 0.3,
        };
        assert_eq!(mirror(&[1.0, 2.0, 3.0, 4.0], &r), None);
        assert_eq!(
            mirror(&[f32::NAN; 3], &row(SamplingParams::greedy(), 0.0)),
            None
        );
    }
}
