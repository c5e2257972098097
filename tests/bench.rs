//! `throng bench` on the CPU: the tiny shape runs three simulation steps, its JSON report has
//! every field, and from step 2 on the prefix cache serves each agent's previous turn.

use serde_json::Value;
use std::process::Command;

const STEP_FIELDS: [&str; 19] = [
    "step",
    "seconds",
    "engine_steps",
    "prompt_tokens",
    "cached_tokens",
    "prefill_tokens",
    "reply_tokens",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "decode_tokens_per_s_per_agent",
    "prefix_cache_hit_rate",
    "kv_blocks_peak",
    "kv_bytes_peak",
    "kv_evictions",
    "finished_stop",
    "finished_length",
    "failed",
    "phases",
    "shares",
];

const PHASES: [&str; 8] = [
    "inputs",
    "forward",
    "attention",
    "matmuls_and_rest",
    "masks",
    "sampling",
    "copies",
    "other",
];

const RUN_FIELDS: [&str; 23] = [
    "shape",
    "parameters",
    "device",
    "weights",
    "kv_format",
    "attention",
    "sampling_on",
    "block_size",
    "kv_blocks",
    "kv_bytes",
    "kv_policy",
    "agents",
    "shared_tokens",
    "own_tokens",
    "reply_tokens",
    "constrained",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "masks_overlap_forward",
    "load_seconds",
    "steps",
];

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

#[test]
fn bench_on_the_tiny_shape_reports_every_field_and_reuses_previous_turns() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let (shared, own) = (64, 48);
    let out = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args([
            "bench", "--shape", "tiny", "--device", "cpu", "--agents", "8",
        ])
        .args(["--shared", &shared.to_string(), "--own", &own.to_string()])
        .args(["--reply", "32", "--steps", "3", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "throng bench failed: {stderr}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("prefill tok/s"), "{table}");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(keys(&report), sorted(&RUN_FIELDS));
    assert_eq!(report["shape"], "tiny");
    assert_eq!(report["device"], "cpu");
    assert_eq!(report["attention"], "paged CPU kernel");
    assert_eq!(report["sampling_on"], "host");
    assert_eq!(report["kv_policy"], "next-call");
    assert_eq!(
        report["kv_format"], "F16",
        "auto keeps keys and values in f16 on the CPU"
    );
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(keys(step), sorted(&STEP_FIELDS), "step {}", i + 1);
        assert_eq!(step["step"], i + 1);
        assert_eq!(step["failed"], 0);
        for group in ["phases", "shares"] {
            assert_eq!(keys(&step[group]), sorted(&PHASES));
            for phase in PHASES {
                let x = step[group][phase].as_f64().unwrap();
                assert!(
                    x.is_finite() && x >= 0.0,
                    "step {} {group}.{phase} = {x}",
                    i + 1
                );
            }
        }
        for rate in ["prefill_tokens_per_s", "decode_tokens_per_s", "seconds"] {
            assert!(step[rate].as_f64().unwrap() > 0.0, "step {} {rate}", i + 1);
        }
        // The CPU kernel's attention is measured inside the forward pass.
        assert!(step["phases"]["attention"].as_f64().unwrap() > 0.0);
        assert!(
            step["phases"]["attention"].as_f64().unwrap()
                <= step["phases"]["forward"].as_f64().unwrap()
        );
    }
    // Step 2 extends each agent's step-1 prompt and reply: the cache serves more than the
    // shared rules alone.
    let shared_share = shared as f64 / (shared + own) as f64;
    let hit2 = steps[1]["prefix_cache_hit_rate"].as_f64().unwrap();
    assert!(
        hit2 > shared_share,
        "step-2 hit rate {hit2} is not above the shared share {shared_share}"
    );
    // Step 1 is cold: at most the shared prefix hits.
    assert!(steps[0]["prefix_cache_hit_rate"].as_f64().unwrap() <= shared_share);
}

#[test]
fn bench_refuses_contexts_longer_than_the_model_with_the_fix() {
    let out = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args([
            "bench", "--shape", "tiny", "--shared", "9000", "--steps", "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("lower --steps, --shared, --own or --reply"),
        "{stderr}"
    );
}

// Guards against issue 30, item 11: `throng bench --block-size 0` panicked (a division by
// zero), and `--max-seqs 0` quietly meant every agent. Every numeric flag of bench and
// generate that no run can use is refused by name, before any model is built or loaded.
#[test]
fn numeric_flags_that_cannot_work_are_refused_by_name_without_a_panic() {
    fn bench(args: &[&'static str]) -> Vec<&'static str> {
        [&["bench", "--shape", "tiny"][..], args].concat()
    }
    fn generate(args: &[&'static str]) -> Vec<&'static str> {
        [&["generate", "--prompt", "hi"][..], args].concat()
    }
    for args in [
        bench(&["--block-size", "0"]),
        bench(&["--max-seqs", "0"]),
        bench(&["--max-batch-tokens", "0"]),
        bench(&["--agents", "0"]),
        bench(&["--reply", "0"]),
        bench(&["--steps", "0"]),
        bench(&["--top-k", "0"]),
        bench(&["--temperature", "-1"]),
        bench(&["--temperature", "NaN"]),
        bench(&["--top-p", "0"]),
        generate(&["--max-tokens", "0"]),
        generate(&["--n", "0"]),
        generate(&["--top-k", "0"]),
        generate(&["--temperature", "inf"]),
        generate(&["--top-p", "1.5"]),
        generate(&["--max-seqs", "0"]),
        generate(&["--max-batch-tokens", "0"]),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_throng"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let flag = args[args.len() - 2];
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(args[args.len() - 1]),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// One bench run of 8 agents on the tiny shape under `policy`, with room for a quarter of their
/// contexts; the JSON report.
fn squeezed_bench(policy: &str, dir: &std::path::Path) -> Value {
    let json = dir.join(format!("bench-{policy}.json"));
    // 64 shared + 4 * 32 own + 3 * 16 reply tokens, and the last reply: 16 blocks of 16
    // tokens an agent at the end, 4 of them shared; 100 blocks would hold everyone. The tiny
    // model's f32 block is 8 KiB: 32 blocks hold the rules, the running agent and about a
    // quarter of the others' own tokens.
    let out = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args([
            "bench", "--shape", "tiny", "--device", "cpu", "--agents", "8",
        ])
        .args([
            "--shared", "64", "--own", "32", "--reply", "16", "--steps", "4",
        ])
        .args(["--no-schema", "--temperature", "0", "--max-seqs", "1"])
        .args(["--kv-memory", "128KiB", "--kv-policy", policy, "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "throng bench failed: {stderr}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&format!("{policy} eviction")), "{table}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

#[test]
fn bench_compares_kv_policies_under_a_small_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cached = |report: &Value| -> u64 {
        report["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["cached_tokens"].as_u64().unwrap())
            .sum()
    };
    let lru = squeezed_bench("lru", dir.path());
    let next = squeezed_bench("next-call", dir.path());
    assert_eq!(lru["kv_policy"], "lru");
    assert_eq!(next["kv_policy"], "next-call");
    assert_eq!(lru["kv_blocks"], 32);
    let evicted: u64 = lru["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kv_evictions"].as_u64().unwrap())
        .sum();
    assert!(evicted > 0, "the cache is too small for every agent");
    // Agents come one at a time, in the same order every step: LRU evicts each history just
    // before it is needed; the bench's announcements let next-call keep some.
    assert!(
        cached(&next) > cached(&lru),
        "next-call found {} prompt tokens in the cache, LRU {}",
        cached(&next),
        cached(&lru)
    );
}
