//! The decision store at the scale of the million-agent study: what a reply costs on disk,
//! and what looking up every agent of a step costs, against writing them (the baseline a run
//! pays anyway).
//!
//! One step of `THRONG_BENCH_AGENTS` (default 1,000,000) replies of the guessing game's size
//! (a short JSON reply, ~60 prompt tokens, ~10 generated) is written in one transaction, as a
//! run writes a step; then every key is looked up through one reader, as `--reuse` does, in
//! the order they were written and in a shuffled order. Prints the file's bytes per reply and
//! the microseconds per lookup and per write.
//!
//! Run: `cargo bench --bench store`.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use sha2::{Digest, Sha256};
use std::time::Instant;
use throng::record::store::{Lookup, Source, Store, StoredReply};

fn key(i: u64) -> [u8; 32] {
    Sha256::digest(i.to_le_bytes()).into()
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let agents: u64 = std::env::var("THRONG_BENCH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let replies: Vec<([u8; 32], StoredReply)> = (0..agents)
        .map(|i| {
            (
                key(i),
                StoredReply {
                    text: format!("{{\"guess\": {}}}", i % 101),
                    stopped: true,
                    prompt_tokens: 60,
                    generated_tokens: 10,
                    token_ids: Vec::new(),
                },
            )
        })
        .collect();
    let store = Store::open(dir.path()).expect("a store");
    let started = Instant::now();
    store.insert(&replies).expect("written");
    let write = started.elapsed();
    drop(store);
    let bytes = std::fs::metadata(dir.path().join(throng::record::store::STORE))
        .expect("the store's file")
        .len();
    let source = Source::open(dir.path()).expect("opened");
    let reader = source.reader().expect("a reader");
    let mut order: Vec<u64> = (0..agents).collect();
    let timed = |what: &str, order: &[u64]| {
        let started = Instant::now();
        let mut found = 0u64;
        for &i in order {
            found += matches!(reader.get(&key(i)).expect("read"), Lookup::Hit(_)) as u64;
        }
        let took = started.elapsed();
        assert_eq!(found, agents);
        println!(
            "store: lookups of {agents} replies ({what}): {:.2} s a step, {:.2} us each",
            took.as_secs_f64(),
            took.as_secs_f64() * 1e6 / agents as f64
        );
    };
    timed("in written order", &order);
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(7));
    timed("shuffled", &order);
    println!(
        "store: {agents} replies written in {:.2} s ({:.2} us each), {:.1} bytes per reply on disk",
        write.as_secs_f64(),
        write.as_secs_f64() * 1e6 / agents as f64,
        bytes as f64 / agents as f64
    );
}
