//! Agent decisions per second on SmolLM2-135M (GGUF Q4_1, CPU): 64 agents, each a ~300-token
//! prompt of which ~250 tokens are rules shared by all, answering a 4-field JSON schema.
//!
//! - `a_one_at_a_time`: requests one after another, no prefix cache, no fast-forward (8 of
//!   the 64 agents: a sequential rate does not depend on how many there are).
//! - `b_batched`: all 64 in one continuous batch, no prefix cache, no fast-forward.
//! - `c_batched_prefix_cache`: (b) with the prefix cache.
//! - `d_batched_prefix_cache_ff`: (c) with grammar fast-forward.
//! - `mask/llama3`: one grammar mask over the real Llama 3 vocabulary (128k tokens), per
//!   token of a decision; p50 and p99 are printed.
//!
//! Each iteration is one simulation step: every agent's state (and so its prompt suffix)
//! changes, the shared rules stay, as in a running simulation. Throughput is reported in
//! decisions (elements) per second; the printed lines add tokens/s per agent and the share of
//! step time spent on masks and sampling.
//! Run: `cargo bench --bench agents`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use std::time::{Duration, Instant};
use throng::engine::constraint::Grammars;
use throng::engine::{Engine, EngineConfig, Message, Request, Schema, Tokenizer};
use throng::model::{LoadOptions, loader};

const AGENTS: usize = 64;

const RULES: &str = "You are a company in a simulated regional energy market. Producers (oil and gas, \
renewable, nuclear, coal) generate electricity and sell it to utilities; utilities buy from the \
producers they are connected to and sell to consumers, whose demand moves a little every step and \
barely reacts to price. Every step you see your own state and your neighbours' state from the previous \
step, then decide at once with everyone else. Producing costs money per unit; energy you do not sell \
earns nothing. Raising capacity costs 50000 and adds 10 units of capacity but also raises your cost \
per unit by 10. Utilities pay producers the producer's price and charge consumers their own price; a \
regulator may cap the consumer price. Your goal is to maximise your profit over many steps without \
going bankrupt: a company whose resources fall below zero leaves the market. Answer with one JSON \
object and nothing else: production_change is how many units to add or remove, energy_price_change \
is how much to move your price, upgrade_capacity says whether to buy capacity this step, and reason \
is a few words on why. Be consistent with your persona and with the state of the market.";

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {
        "production_change": {"type": "integer", "minimum": -50, "maximum": 50},
        "energy_price_change": {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.1},
        "upgrade_capacity": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 40}},
        "required": ["production_change", "energy_price_change", "upgrade_capacity", "reason"],
        "additionalProperties": false})
}

fn requests(step: usize, agents: usize) -> Vec<Request> {
    (0..agents)
        .map(|a| {
            let state = format!(
                "Step {step}. You are company {a}, a {} producer. Resources {}, production {}, capacity {}, \
                 price {:.1}, cost {}. Neighbours: company {} sells at {:.1}, company {} sells at {:.1}. \
                 Demand is {} units.",
                ["coal", "nuclear", "renewable", "oil and gas"][a % 4],
                1000 + 37 * a + 11 * step,
                100 + a % 9,
                200,
                50.0 + (a % 7) as f64 * 0.5,
                30 + a % 5,
                (a + 1) % agents,
                48.0 + (a % 5) as f64,
                (a + 3) % agents,
                52.0 - (a % 3) as f64,
                1000 + 13 * step
            );
            Request::chat(vec![Message::system(RULES), Message::user(state)])
                .with_schema(schema())
                .with_max_tokens(80)
        })
        .collect()
}

fn engine(prefix_caching: bool, fast_forward: bool) -> Engine {
    let path =
        throng::assets::ensure_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
            .unwrap();
    let loaded = loader::load(path.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let cfg = EngineConfig {
        prefix_caching,
        fast_forward,
        kv_memory: Some(2 << 30),
        ..EngineConfig::default()
    };
    Engine::new(loaded, cfg).unwrap()
}

fn bench_variant(
    c: &mut Criterion,
    name: &str,
    mut engine: Engine,
    agents: usize,
    one_at_a_time: bool,
) {
    let mut step = 0;
    let mut decisions = 0usize;
    let mut generated = 0usize;
    let mut elapsed = Duration::ZERO;
    let mut group = c.benchmark_group("agents");
    group.throughput(Throughput::Elements(agents as u64));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                step += 1;
                let batch = requests(step, agents);
                let start = Instant::now();
                let results: Vec<_> = if one_at_a_time {
                    batch
                        .into_iter()
                        .flat_map(|r| engine.generate(vec![r]))
                        .collect()
                } else {
                    engine.generate(batch)
                };
                total += start.elapsed();
                for r in results {
                    let r = r.unwrap();
                    assert!(r.value.is_some(), "{}", r.text);
                    decisions += 1;
                    generated += r.generated_tokens;
                }
            }
            elapsed += total;
            total
        })
    });
    group.finish();
    let t = engine.totals();
    let secs = elapsed.as_secs_f64();
    let prompt_tokens = engine
        .prompt_tokens(&requests(1, agents)[0].prompt)
        .unwrap()
        .len();
    eprintln!(
        "{name}: {:.2} decisions/s, {:.1} generated tokens/s per agent ({:.1} tokens per decision, prompt {prompt_tokens} tokens), \
         prefix hits {:.0}%, masks+sampling {:.1}% of step time",
        decisions as f64 / secs,
        generated as f64 / secs / agents as f64,
        generated as f64 / decisions.max(1) as f64,
        100.0 * t.prefix_hit_rate(),
        100.0 * (t.masks + t.sampling).as_secs_f64()
            / (t.forward + t.masks + t.sampling).as_secs_f64(),
    );
    if let (Some(p50), Some(p99)) = (
        engine.mask_time_quantile(0.5),
        engine.mask_time_quantile(0.99),
    ) {
        eprintln!("{name}: mask time per token on SmolLM2's vocabulary: p50 {p50:?}, p99 {p99:?}");
    }
}

/// One grammar mask per token of a decision, over the real Llama 3 vocabulary.
fn bench_llama3_masks(c: &mut Criterion) {
    let dir = throng::assets::ensure("llama3-tokenizer").unwrap();
    let inner = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let tokenizer = Tokenizer::new(inner, vec![128001, 128009]);
    let start = Instant::now();
    let grammars = Grammars::new(&tokenizer, 128256);
    eprintln!(
        "mask/llama3: token trie and grammar engine built in {:?}",
        start.elapsed()
    );
    let schema = Schema::new(schema());
    let start = Instant::now();
    let _ = grammars.constraint(&schema).unwrap();
    eprintln!("mask/llama3: schema compiled in {:?}", start.elapsed());
    let answer = r#"{"production_change": -12, "energy_price_change": 2.5, "upgrade_capacity": false, "reason": "demand is flat and my neighbours undercut me"}"#;
    let tokens = tokenizer.encode(answer, false).unwrap();
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let mut group = c.benchmark_group("mask");
    group.bench_function("llama3_per_token", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let mut constraint = grammars.constraint(&schema).unwrap();
                let mut pos = 0;
                // Walk the answer as the engine would: forced tokens appended, one mask per
                // sampled token.
                while pos < tokens.len() && done < iters {
                    let forced = constraint.forced(usize::MAX);
                    if !forced.is_empty() {
                        // Forced tokens spell the same text; skip past it in the answer.
                        let text = tokenizer.decode(&forced, false).unwrap();
                        let mut consumed = String::new();
                        while pos < tokens.len() && consumed.len() < text.len() {
                            consumed
                                .push_str(&tokenizer.decode(&tokens[pos..pos + 1], false).unwrap());
                            pos += 1;
                        }
                        if consumed != text {
                            break;
                        }
                        continue;
                    }
                    let start = Instant::now();
                    let mask = constraint.mask().unwrap();
                    let took = start.elapsed();
                    total += took;
                    hist.record(took.as_nanos() as u64).unwrap();
                    done += 1;
                    if !mask.is_allowed(tokens[pos]) {
                        break;
                    }
                    constraint.accept(tokens[pos]).unwrap();
                    pos += 1;
                }
            }
            total
        })
    });
    group.finish();
    eprintln!(
        "mask/llama3: per token p50 {:?}, p99 {:?} over {} masks",
        Duration::from_nanos(hist.value_at_quantile(0.5)),
        Duration::from_nanos(hist.value_at_quantile(0.99)),
        hist.len()
    );
}

fn agents(c: &mut Criterion) {
    bench_llama3_masks(c);
    bench_variant(
        c,
        "d_batched_prefix_cache_ff",
        engine(true, true),
        AGENTS,
        false,
    );
    bench_variant(
        c,
        "c_batched_prefix_cache",
        engine(true, false),
        AGENTS,
        false,
    );
    bench_variant(c, "b_batched", engine(false, false), AGENTS, false);
    bench_variant(c, "a_one_at_a_time", engine(false, false), 8, true);
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! { name = benches; config = config(); targets = agents }
criterion_main!(benches);
