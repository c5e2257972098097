//! The complete input of a request, as a key: what its reply is a function of. The engine is
//! batch invariant and its sampling is seeded per request, so two requests of one key get the
//! same reply from engines of the same identity: a run can take a reply recorded under its
//! key instead of computing it again.

use super::llm_engine::Engine;
use super::request::{Prompt, Request, RequestError};
use sha2::{Digest, Sha256};

/// The sha256 of a request's complete input (see [`Engine::request_key`]).
pub type RequestKey = [u8; 32];

impl Engine {
    /// The key of `request` on this engine: the model's identity (weights, format, device
    /// class, KV cache type), the prompt's tokens, the schema, the sampling settings and seed, the token
    /// limit and the stop strings. The tag and the retention key, which change no reply, are
    /// left out.
    pub fn request_key(&self, request: &Request) -> Result<RequestKey, RequestError> {
        let tokens = match &request.prompt {
            Prompt::Tokens(tokens) => std::borrow::Cow::Borrowed(tokens),
            other => std::borrow::Cow::Owned(self.prompt_tokens(other)?),
        };
        let mut h = Sha256::new();
        // Each part with its length first, so that no two inputs hash the same bytes.
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        let id = self.identity();
        // 2: the KV cache's type joined the identity.
        part(b"throng request key 2");
        part(id.weights.as_bytes());
        part(id.format.as_bytes());
        part(id.device.as_bytes());
        part(id.kv.as_bytes());
        let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        part(&token_bytes);
        match &request.json_schema {
            Some(schema) => part(schema.value().to_string().as_bytes()),
            None => part(b""),
        }
        let s = &request.sampling;
        part(&s.temperature.to_bits().to_le_bytes());
        part(&s.top_p.to_bits().to_le_bytes());
        part(&s.top_k.map_or(u64::MAX, |k| k as u64).to_le_bytes());
        part(&s.seed.to_le_bytes());
        part(&(request.max_tokens as u64).to_le_bytes());
        for stop in &request.stop {
            part(stop.as_bytes());
        }
        Ok(h.finalize().into())
    }
}
