//! The complete input of a request, as a key: what its reply is a function of. The engine is
//! batch invariant and its sampling is seeded per request, so two requests of one key get the
//! same reply from engines of the same identity: a run can take a reply recorded under its
//! key instead of computing it again.

use super::llm_engine::Engine;
use super::prompt_encoder::RequestKey;
use super::request::{Prompt, Request, RequestError};

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
