//! The replies this server generated, by what a client sees of them, so that a conversation
//! that sends one back as an assistant message gets it as the token ids the model generated
//! ([`PromptEncoder::spliced_tokens`]): the prompt up to the end of the reply is then the one
//! that already ran, and the prefix cache holds it.
//!
//! A reply comes back as the client saw it: its content, or one call's name and arguments.
//! Its entry is keyed by that, per model. It is spliced in only where its generated text is
//! exactly the text the request renders for that turn: never does a remembered reply change
//! what a prompt says (an answer generated as `{"content": ...}` under `tools`, or a call
//! whose JSON the model spaced otherwise than history writes it, goes in as the client's
//! text). Replies are remembered in order of use up to a bound; one forgotten (or never
//! generated here, or edited by the client) is rendered from its text, as any history is.

use crate::engine::{PromptEncoder, Response};
use sha2::{Digest, Sha256};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// Replies remembered per server: about 2 KiB each for a short reply.
const REMEMBERED: usize = 1 << 20;

/// What a client sees of an assistant turn, hashed with the model's name.
pub(crate) type Seen = [u8; 32];

/// What a client sees of a reply that is text.
pub(crate) fn seen_text(model: &str, content: &str) -> Seen {
    seen(model, "text", &[content])
}

/// What a client sees of a reply that is one call.
pub(crate) fn seen_call(model: &str, name: &str, arguments: &str) -> Seen {
    seen(model, "call", &[name, arguments])
}

fn seen(model: &str, kind: &str, parts: &[&str]) -> Seen {
    let mut h = Sha256::new();
    for part in [model, kind].iter().chain(parts) {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// A reply as the model wrote it.
#[derive(Debug)]
pub struct Written {
    pub text: String,
    pub ids: Vec<u32>,
}

pub(crate) struct Memo(Mutex<lru::LruCache<Seen, Arc<Written>>>);

impl Default for Memo {
    fn default() -> Self {
        Memo(Mutex::new(lru::LruCache::new(
            NonZeroUsize::new(REMEMBERED).expect("invariant: a positive bound"),
        )))
    }
}

impl Memo {
    /// Remembers `reply`, seen by clients as `seen`, if its ids spell its text.
    pub(crate) fn remember(&self, seen: Seen, encoder: &PromptEncoder, reply: &Response) {
        if let Some(ids) = encoder.reply_ids(&reply.token_ids, &reply.text) {
            let written = Written {
                text: reply.text.clone(),
                ids,
            };
            self.lock().put(seen, Arc::new(written));
        }
    }

    pub fn get(&self, seen: &Seen) -> Option<Arc<Written>> {
        self.lock().get(seen).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<Seen, Arc<Written>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
