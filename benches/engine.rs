//! Engine throughput on SmolLM2-135M (GGUF Q4_1) on the CPU.
//!
//! - `prefill/<weights>`: one 256-token prompt (tokens/s).
//! - `decode/<weights>/<batch>`: one decode step of `batch` sequences at context 32..96
//!   (aggregate tokens/s; per sequence = aggregate / batch).
//! - `baseline/candle_quantized_llama`: candle-transformers' own `quantized_llama` on the same
//!   file, one sequence, as the reference point measured in the same run.
//!
//! Weight formats are what the loader may convert the Q4_1 file to: `gguf` (its blocks as
//! stored, run by throng's integer kernels: the CPU default where the CPU has AVX2 or AVX-512
//! VNNI), `int8` (8-bit blocks quantized at load: the default for other files there), `f32`
//! (the default on CPUs without either), `bf16` (the default for large models on such CPUs,
//! and on CUDA), `q8_0`, and `native` (Q4_1 through candle's kernels, batch 1 only: the slow
//! path being avoided). `THRONG_MAX_CPU_ISA=avx2` measures the AVX2 kernels on a CPU that
//! has AVX-512.
//! Run: `cargo bench --bench engine` (THRONG_BENCH_QUICK=1 for a short smoke run).

use candle_core::{Device, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::time::{Duration, Instant};
use throng::model::{BatchInputs, CausalLm, KvCache, LoadOptions, SeqChunk, WeightFormat, loader};

const CONTEXT: usize = 32;
const MAX_CONTEXT: usize = 96;
const BLOCK: usize = 16;

fn model_path() -> std::path::PathBuf {
    throng::assets::ensure_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
        .expect("the SmolLM2 asset (run scripts/fetch-models)")
}

fn load(weights: WeightFormat) -> throng::model::Llama {
    let opts = LoadOptions {
        weights,
        ..LoadOptions::default()
    };
    loader::load(model_path().to_str().unwrap(), &opts)
        .unwrap()
        .model
}

fn prompt(len: usize, seed: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104729) % 40000 + 100) as u32)
        .collect()
}

/// `batch` sequences prefilled to `CONTEXT` tokens, then decoded one token per step at
/// positions `CONTEXT..MAX_CONTEXT`, wrapping back (the cache slots are simply rewritten).
fn bench_decode(c: &mut Criterion, weights: WeightFormat, name: &str, batches: &[usize]) {
    let model = load(weights);
    let cfg = model.config().clone();
    let mut group = c.benchmark_group(format!("decode/{name}"));
    for &batch in batches {
        let per_seq = MAX_CONTEXT.div_ceil(BLOCK);
        let mut kv =
            KvCache::new(&cfg, batch * per_seq, BLOCK, model.dtype(), &Device::Cpu).unwrap();
        let seqs: Vec<(Vec<u32>, Vec<u32>)> = (0..batch)
            .map(|b| {
                (
                    prompt(MAX_CONTEXT, b),
                    ((b * per_seq) as u32..((b + 1) * per_seq) as u32).collect(),
                )
            })
            .collect();
        let chunks: Vec<SeqChunk> = seqs
            .iter()
            .map(|(t, blocks)| SeqChunk {
                tokens: &t[..CONTEXT],
                start: 0,
                blocks,
                wants_logits: true,
            })
            .collect();
        model
            .forward(&BatchInputs::new(&chunks, &kv).unwrap(), &mut kv)
            .unwrap();
        let mut pos = CONTEXT;
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(BenchmarkId::from_parameter(batch), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    if pos == MAX_CONTEXT {
                        pos = CONTEXT;
                    }
                    let chunks: Vec<SeqChunk> = seqs
                        .iter()
                        .map(|(t, blocks)| SeqChunk {
                            tokens: &t[pos..pos + 1],
                            start: pos,
                            blocks,
                            wants_logits: true,
                        })
                        .collect();
                    let start = Instant::now();
                    let batch = BatchInputs::new(&chunks, &kv).unwrap();
                    std::hint::black_box(model.forward(&batch, &mut kv).unwrap());
                    total += start.elapsed();
                    pos += 1;
                }
                total
            })
        });
    }
    group.finish();
}

fn bench_prefill(c: &mut Criterion, weights: WeightFormat, name: &str) {
    let model = load(weights);
    let cfg = model.config().clone();
    let len = 256;
    let mut kv = KvCache::new(&cfg, len / BLOCK, BLOCK, model.dtype(), &Device::Cpu).unwrap();
    let tokens = prompt(len, 1);
    let blocks: Vec<u32> = (0..(len / BLOCK) as u32).collect();
    let mut group = c.benchmark_group("prefill");
    group.throughput(Throughput::Elements(len as u64));
    group.bench_function(name, |b| {
        b.iter(|| {
            let chunk = [SeqChunk {
                tokens: &tokens,
                start: 0,
                blocks: &blocks,
                wants_logits: true,
            }];
            let batch = BatchInputs::new(&chunk, &kv).unwrap();
            model.forward(&batch, &mut kv).unwrap()
        })
    });
    group.finish();
}

/// candle-transformers' `quantized_llama` decoding one sequence from the same file.
fn bench_baseline(c: &mut Criterion) {
    use candle_transformers::models::quantized_llama::ModelWeights;
    let path = model_path();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut model = ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    let tokens = prompt(MAX_CONTEXT, 0);
    let input = |range: std::ops::Range<usize>| {
        Tensor::new(&tokens[range], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap()
    };
    let mut group = c.benchmark_group("baseline");
    group.throughput(Throughput::Elements(1));
    let mut pos = MAX_CONTEXT;
    group.bench_function("candle_quantized_llama_decode", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if pos == MAX_CONTEXT {
                    // index_pos 0 restarts its cache: refill the context, untimed.
                    model.forward(&input(0..CONTEXT), 0).unwrap();
                    pos = CONTEXT;
                }
                let start = Instant::now();
                std::hint::black_box(model.forward(&input(pos..pos + 1), pos).unwrap());
                total += start.elapsed();
                pos += 1;
            }
            total
        })
    });
    group.throughput(Throughput::Elements(256));
    let long = prompt(256, 1);
    group.bench_function("candle_quantized_llama_prefill", |b| {
        b.iter(|| {
            model
                .forward(
                    &Tensor::new(&long[..], &Device::Cpu)
                        .unwrap()
                        .unsqueeze(0)
                        .unwrap(),
                    0,
                )
                .unwrap()
        })
    });
    group.finish();
}

fn engine(c: &mut Criterion) {
    bench_baseline(c);
    bench_prefill(c, WeightFormat::Gguf, "gguf");
    bench_prefill(c, WeightFormat::Int8, "int8");
    bench_prefill(c, WeightFormat::F32, "f32");
    bench_prefill(c, WeightFormat::Q8_0, "q8_0");
    bench_prefill(c, WeightFormat::Bf16, "bf16");
    bench_decode(c, WeightFormat::Gguf, "gguf", &[1, 8, 32, 64]);
    bench_decode(c, WeightFormat::Int8, "int8", &[1, 8, 32, 64]);
    bench_decode(c, WeightFormat::F32, "f32", &[1, 8, 32, 64]);
    bench_decode(c, WeightFormat::Q8_0, "q8_0", &[1, 8, 32, 64]);
    bench_decode(c, WeightFormat::Bf16, "bf16", &[1, 8, 32, 64]);
    bench_decode(c, WeightFormat::Native, "native_q4_1", &[1]);
}

fn config() -> Criterion {
    let quick = std::env::var_os("THRONG_BENCH_QUICK").is_some();
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(if quick { 1 } else { 4 }))
}

criterion_group! { name = benches; config = config(); targets = engine }
criterion_main!(benches);
