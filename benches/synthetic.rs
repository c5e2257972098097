//! Tokens per second per agent on a random-weight model, stepped as `throng bench` steps it
//! (the same code: `throng::bench::Bench`): every iteration is one simulation step of all
//! agents, each reusing its previous turn through the prefix cache.
//!
//! Criterion's throughput is reply tokens per agent per second (free replies of exactly
//! `reply` tokens, so the count is exact). The printed lines add the JSON-constrained variant's
//! figures and each phase's share of a step.
//!
//! Run: `cargo bench --bench synthetic` (tiny shape, CPU, 32 agents). On a GPU:
//! `THRONG_BENCH_SHAPE=llama-3.2-3b THRONG_BENCH_DEVICE=cuda:0 THRONG_BENCH_AGENTS=400
//! cargo bench --features cuda --bench synthetic`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;
use throng::bench::{Bench, BenchSpec};
use throng::engine::EngineConfig;
use throng::model::WeightFormat;
use throng::model::synthetic::Shape;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn device() -> candle_core::Device {
    let spec = std::env::var("THRONG_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    match spec.strip_prefix("cuda:") {
        None => candle_core::Device::Cpu,
        Some(n) => candle_core::Device::new_cuda(n.parse().expect("THRONG_BENCH_DEVICE=cuda:N"))
            .expect("a CUDA device"),
    }
}

fn shape() -> Shape {
    let name = std::env::var("THRONG_BENCH_SHAPE").unwrap_or_else(|_| "tiny".into());
    Shape::ALL
        .into_iter()
        .find(|s| s.name().eq_ignore_ascii_case(&name))
        .expect("THRONG_BENCH_SHAPE: tiny, llama-3.2-1b, llama-3.2-3b or llama-3.1-8b")
}

fn spec(constrained: bool) -> BenchSpec {
    BenchSpec {
        shape: shape(),
        agents: env("THRONG_BENCH_AGENTS", 32),
        shared: env("THRONG_BENCH_SHARED", 400),
        own: env("THRONG_BENCH_OWN", 200),
        reply: env("THRONG_BENCH_REPLY", 40),
        // Enough steps for every criterion iteration: contexts grow by one turn per step.
        steps: 12,
        constrained,
        temperature: 0.7,
        top_p: 1.0,
        top_k: None,
        seed: 0,
        weights: WeightFormat::Auto,
        engine: EngineConfig::default(),
    }
}

fn tokens_per_agent(c: &mut Criterion) {
    let device = device();
    let mut group = c.benchmark_group("synthetic");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(1));
    let free = spec(false);
    group.throughput(Throughput::Elements(free.reply as u64));
    for (name, spec) in [("free_replies", free), ("json_decisions", spec(true))] {
        let mut bench = Bench::new(spec.clone(), &device).expect("the benchmark's engine");
        // Step 1 is cold; criterion measures warm steps, as a running simulation has.
        bench.step().expect("the cold step");
        group.bench_function(
            format!("{}/{}_agents/{name}", spec.shape.name(), spec.agents),
            |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        // Each iteration is a fresh simulation once the contexts are full.
                        if bench.report().steps.len() >= spec.steps {
                            bench = Bench::new(spec.clone(), &device).expect("the engine");
                            bench.step().expect("the cold step");
                        }
                        total += Duration::from_secs_f64(bench.step().expect("a step").seconds);
                    }
                    total
                })
            },
        );
        let report = bench.report();
        let last = report.steps.last().expect("at least one step");
        let sh = &last.shares;
        println!(
            "{name}: {:.1} tokens/s per agent, {:.0} decode tok/s, {:.0}% cache hits; forward {:.0}% (attention {:.0}%), masks {:.0}%, sampling {:.0}%, copies {:.0}%",
            last.decode_tokens_per_s_per_agent,
            last.decode_tokens_per_s,
            100.0 * last.prefix_cache_hit_rate,
            100.0 * sh.forward,
            100.0 * sh.attention,
            100.0 * sh.masks,
            100.0 * sh.sampling,
            100.0 * sh.copies,
        );
    }
    group.finish();
}

criterion_group!(benches, tokens_per_agent);
criterion_main!(benches);
