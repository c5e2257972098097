//! The complete input of a request, as a key: what its reply is a function of. The engine is
//! batch invariant and its sampling is seeded per request, so two requests of one key get the
//! same reply from engines of the same identity: a run can take a reply recorded under its
//! key instead of computing it again.

use super::llm_engine::Engine;
use super::prompt_encoder::RequestKey;
use super::request::{Prompt, Request, RequestError, Response};

impl Engine {
    /// The key of `request` on this engine (see [`super::PromptEncoder::key`]).
    pub fn request_key(&self, request: &Request) -> Result<RequestKey, RequestError> {
        let encoder = self.prompt_encoder();
        let tokens = match &request.prompt {
            Prompt::Tokens(tokens) => std::borrow::Cow::Borrowed(tokens),
            other => std::borrow::Cow::Owned(encoder.tokens(other)?),
        };
        Ok(encoder.key(&tokens, request))
    }
}

/// Replies known before the model is asked: a request whose key it holds gets the reply an
/// engine of the same identity gave that key before, token for token (a run's `--reuse`
/// stores). The engine never consults one itself; whoever submits requests may look a key up
/// first, and the engine stays unaware of where such replies are kept.
pub trait KnownReplies: Send {
    /// The reply recorded under `key`, as the engine's response, or `None` when the model
    /// must compute it.
    fn lookup(&mut self, key: &RequestKey) -> Option<Response>;
}

/// One store of replies shared by its reader (who looks keys up) and its owner (who reads
/// its counts and warnings when the reader is done).
impl<T: KnownReplies> KnownReplies for std::sync::Arc<std::sync::Mutex<T>> {
    fn lookup(&mut self, key: &RequestKey) -> Option<Response> {
        // A reader that panicked mid-lookup left counts that are at worst one short.
        let mut replies = self
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        replies.lookup(key)
    }
}
