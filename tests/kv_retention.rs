//! KV retention, as a simulation with history drives the engine: every caller once per round,
//! in the same order, each prompt its previous prompt and reply followed by new tokens. With
//! a KV cache too small for every caller's history the replies are exactly those of an
//! unbounded cache under either policy (eviction changes only the work done), and announcing
//! the callers (`next-call`) finds at least as much in the cache as LRU; strictly more when
//! callers come one at a time, where LRU evicts each history just before it is needed.

mod common;

use common::TinyLlama;
use throng::engine::{Engine, EngineConfig, KvPolicy, Prompt, Request};

const CALLERS: usize = 8;
const ROUNDS: usize = 4;
/// Prompt tokens every caller shares (two blocks of 16), and new ones per round.
const SHARED: usize = 32;
const OWN: usize = 16;
const REPLY: usize = 8;

/// Bytes of one KV block of 16 tokens of the tiny model in f32.
/// Bytes of a 16-token block in `auto`'s KV format on the CPU (f16).
fn block_bytes(spec: &TinyLlama) -> usize {
    2 * spec.num_layers * 16 * spec.num_kv_heads * (spec.hidden_size / spec.num_heads) * 2
}

fn tokens(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((seed * 131 + i * 17) % 250) as u32)
        .collect()
}

/// What a run did: every reply of every round, prompt tokens found in the cache (in all, and
/// per round), and blocks evicted.
#[derive(Debug)]
struct Outcome {
    replies: Vec<Vec<Vec<u32>>>,
    hit_tokens: u64,
    round_hits: Vec<u64>,
    evictions: u64,
}

/// `ROUNDS` rounds of every caller, each round announced to the engine and each request
/// keyed by its caller.
fn rounds(engine: &mut Engine) -> Outcome {
    let mut contexts: Vec<Vec<u32>> = (0..CALLERS).map(|_| tokens(0, SHARED)).collect();
    let key = |c: usize| format!("caller {c}");
    let mut replies = Vec::new();
    let mut round_hits = Vec::new();
    for round in 0..ROUNDS {
        let before = engine.totals().cache.hit_tokens;
        engine.expect_calls((0..CALLERS).map(key));
        let requests = contexts
            .iter_mut()
            .enumerate()
            .map(|(c, ctx)| {
                ctx.extend(tokens(1 + round * CALLERS + c, OWN));
                Request::new(Prompt::Tokens(ctx.clone()))
                    .with_max_tokens(REPLY)
                    .with_retention_key(key(c))
            })
            .collect();
        let got: Vec<Vec<u32>> = engine
            .generate(requests)
            .into_iter()
            .map(|r| r.unwrap().token_ids)
            .collect();
        for (ctx, reply) in contexts.iter_mut().zip(&got) {
            ctx.extend(reply);
        }
        replies.push(got);
        round_hits.push(engine.totals().cache.hit_tokens - before);
    }
    let cache = engine.totals().cache;
    Outcome {
        replies,
        hit_tokens: cache.hit_tokens,
        round_hits,
        evictions: cache.evictions,
    }
}

/// An engine with room for `blocks` KV blocks (`None`: plenty).
fn engine(
    dir: &std::path::Path,
    spec: &TinyLlama,
    blocks: Option<usize>,
    policy: KvPolicy,
    max_seqs: usize,
) -> Engine {
    let engine = common::engine(
        dir.to_str().unwrap(),
        EngineConfig {
            kv_memory: blocks.map(|b| b * block_bytes(spec)),
            kv_policy: policy,
            max_seqs,
            ..EngineConfig::default()
        },
    );
    if let Some(blocks) = blocks {
        assert_eq!(engine.num_kv_blocks(), blocks);
    }
    engine
}

/// The last round's contexts reach 32 + 4 * 16 + 3 * 8 = 120 tokens plus the reply: 8 blocks
/// a caller, 2 of them shared; 64 blocks would hold everyone. 24 hold the running caller and
/// about three others' histories.
const TIGHT: usize = 24;

#[test]
fn callers_one_at_a_time_next_call_keeps_histories_lru_evicts_them_just_before_use() {
    let spec = TinyLlama::default();
    let dir = common::tiny_model(&spec);
    let roomy = rounds(&mut engine(dir.path(), &spec, None, KvPolicy::NextCall, 1));
    assert_eq!(roomy.evictions, 0);
    let lru = rounds(&mut engine(
        dir.path(),
        &spec,
        Some(TIGHT),
        KvPolicy::Lru,
        1,
    ));
    let next = rounds(&mut engine(
        dir.path(),
        &spec,
        Some(TIGHT),
        KvPolicy::NextCall,
        1,
    ));
    assert_eq!(lru.replies, roomy.replies, "LRU changed a reply");
    assert_eq!(next.replies, roomy.replies, "next-call changed a reply");
    assert!(lru.evictions > 0 && next.evictions > 0, "{lru:?} {next:?}");
    // Once histories outgrow the cache (the last round), LRU finds the shared rules and not
    // one caller's history: the history it evicts is always the next caller's. Next-call
    // keeps some (here 576 prompt tokens of the 768 an unbounded cache finds, LRU 256).
    let last = ROUNDS - 1;
    assert_eq!(lru.round_hits[last], (CALLERS * SHARED) as u64, "{lru:?}");
    assert!(
        next.round_hits[last] > lru.round_hits[last] + (CALLERS * OWN) as u64,
        "next-call found {:?} prompt tokens in the cache per round, LRU {:?}",
        next.round_hits,
        lru.round_hits
    );
    assert!(next.hit_tokens > lru.hit_tokens);
    assert!(
        next.round_hits[last] < roomy.round_hits[last],
        "the cache is too small"
    );
}

#[test]
fn callers_in_one_batch_get_the_same_replies_and_next_call_hits_at_least_as_often() {
    let spec = TinyLlama::default();
    let dir = common::tiny_model(&spec);
    let roomy = rounds(&mut engine(
        dir.path(),
        &spec,
        None,
        KvPolicy::NextCall,
        256,
    ));
    // Everyone is submitted at once: the running sequences share the cache with what is kept
    // and the newest are preempted when it runs out, so hits depend on timing as well.
    for tight in [TIGHT, 32] {
        let lru = rounds(&mut engine(
            dir.path(),
            &spec,
            Some(tight),
            KvPolicy::Lru,
            256,
        ));
        let next = rounds(&mut engine(
            dir.path(),
            &spec,
            Some(tight),
            KvPolicy::NextCall,
            256,
        ));
        assert_eq!(lru.replies, roomy.replies, "LRU, {tight} blocks");
        assert_eq!(next.replies, roomy.replies, "next-call, {tight} blocks");
        assert!(lru.evictions > 0 && next.evictions > 0, "{tight} blocks");
        assert!(
            next.hit_tokens >= lru.hit_tokens,
            "{tight} blocks: next-call found {} prompt tokens in the cache, LRU {}",
            next.hit_tokens,
            lru.hit_tokens
        );
    }
}

/// A decision, as its record has it.
#[derive(Debug)]
struct Decision {
    step: u64,
    text: String,
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// The energy market with history under `cfg`: every decision, in order. (Its system prompt
/// is the same every step, so each agent's prompt extends its previous prompt and reply; the
/// guessing game's shows the last rounds' results and changes every step.)
fn market_with_history(model: &std::path::Path, cfg: EngineConfig) -> Vec<Decision> {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("exp.toml");
    let templates =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/energy_market");
    std::fs::write(
        &config,
        format!(
            "templates = {:?}\n{}",
            templates.display().to_string(),
            r#"name = "retention"
seed = 3
steps = 2
policy = "llm"
history = 1
agents = 8

[llm]
max_tokens = 24

[scenario]
name = "energy_market"
rules = "fixed"
"#
        ),
    )
    .unwrap();
    let out = tmp.path().join("run");
    let engine = common::engine(model.to_str().unwrap(), cfg);
    let (ended, _) = common::run_experiment(
        &config,
        &throng::sim::experiment::Overrides::default(),
        &out,
        throng::sim::runner::SimOptions::default(),
        Some(engine),
    );
    assert_eq!(ended, throng::sim::runner::Ended::Finished);
    std::fs::read_to_string(out.join("decisions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            Decision {
                step: r["step"].as_u64().unwrap(),
                text: r["text"].as_str().unwrap().to_string(),
                prompt_tokens: r["prompt_tokens"].as_u64().unwrap(),
                cached_tokens: r["cached_tokens"].as_u64().unwrap(),
            }
        })
        .collect()
}

/// A simulation whose agents keep their history announces them to the engine: with room for
/// a few agents' histories and one agent at a time, next-call finds more of step 2's prompts
/// in the cache than LRU (here 13104 tokens against 9488, of 15408 an unbounded cache finds),
/// and every decision is the same.
#[test]
fn a_simulation_with_history_announces_its_agents() {
    let spec = TinyLlama {
        max_position_embeddings: 8192,
        ..TinyLlama::default()
    };
    let dir = common::tiny_model(&spec);
    let roomy = market_with_history(
        dir.path(),
        EngineConfig {
            max_seqs: 1,
            ..EngineConfig::default()
        },
    );
    let last_step = roomy.iter().map(|d| d.step).max().unwrap();
    let cached = |decisions: &[Decision]| -> u64 {
        decisions
            .iter()
            .filter(|d| d.step == last_step)
            .map(|d| d.cached_tokens)
            .sum()
    };
    // Room for the running agent's whole context and two others' own step-1 prompts: the
    // rules every agent shares are most of a step-1 prompt.
    let first: Vec<&Decision> = roomy.iter().filter(|d| d.step == 1).collect();
    let shared = first.iter().skip(1).map(|d| d.cached_tokens).min().unwrap();
    let own = first.iter().map(|d| d.prompt_tokens).max().unwrap() - shared;
    let longest = roomy.iter().map(|d| d.prompt_tokens).max().unwrap();
    let blocks = (longest.div_ceil(16) + 2 * own.div_ceil(16) + 4) as usize;
    let tight = |policy| EngineConfig {
        max_seqs: 1,
        kv_memory: Some(blocks * block_bytes(&spec)),
        kv_policy: policy,
        ..EngineConfig::default()
    };
    let lru = market_with_history(dir.path(), tight(KvPolicy::Lru));
    let next = market_with_history(dir.path(), tight(KvPolicy::NextCall));
    let texts = |d: &[Decision]| -> Vec<String> { d.iter().map(|d| d.text.clone()).collect() };
    assert_eq!(texts(&lru), texts(&roomy));
    assert_eq!(texts(&next), texts(&roomy));
    assert!(
        cached(&next) > cached(&lru),
        "last step: next-call found {} prompt tokens in the cache, LRU {}",
        cached(&next),
        cached(&lru)
    );
}
