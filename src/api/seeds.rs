//! The seed of a request that gives none. OpenAI draws a fresh one each time; a fixed one
//! would make a framework's retry (Concordia asks again, with the same prompt, when a reply
//! does not parse) get the same reply forever. So the k-th request with a given body gets
//! `derive(0, [k])`: retries differ, and a session replayed in the same order gets the same
//! replies however its requests interleave with other callers'. Requests that give a seed
//! get exactly that seed.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;

/// Distinct bodies remembered before the count starts over (32 bytes and a counter each).
const REMEMBERED: usize = 1 << 20;

#[derive(Default)]
pub struct Seeds(Mutex<HashMap<[u8; 32], u64>>);

impl Seeds {
    /// The seed for `body`, a chat request without `seed`, as sent to `model`.
    pub fn next(&self, body: &Value) -> u64 {
        let mut same = body.clone();
        if let Some(o) = same.as_object_mut() {
            // They change how a reply is delivered or cached, not what it says.
            for field in ["seed", "stream", "stream_options", "user"] {
                o.remove(field);
            }
        }
        let digest: [u8; 32] = Sha256::digest(same.to_string().as_bytes()).into();
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= REMEMBERED && !seen.contains_key(&digest) {
            seen.clear();
        }
        let k = seen.entry(digest).or_insert(0);
        let seed = crate::seed::derive(0, &[*k]);
        *k += 1;
        seed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_repeated_body_gets_a_new_seed_and_a_replay_the_same_ones() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let other = json!({"model": "m", "messages": [{"role": "user", "content": "ho"}]});
        let first = Seeds::default();
        let a = [first.next(&body), first.next(&other), first.next(&body)];
        assert_ne!(a[0], a[2], "a retry draws anew");
        let replay = Seeds::default();
        let b = [replay.next(&other), replay.next(&body), replay.next(&body)];
        assert_eq!(
            (a[0], a[1], a[2]),
            (b[1], b[0], b[2]),
            "interleaving does not matter"
        );
        let streamed = json!({"model": "m", "stream": true, "user": "agent-1",
                              "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(Seeds::default().next(&streamed), a[0]);
    }
}
