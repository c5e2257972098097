//! A request's prompt as token ids, and its complete input as a key, computed apart from the
//! engine: the tokenizer, the chat template and the model's identity, cloned out of an engine
//! ([`Engine::prompt_encoder`](super::Engine::prompt_encoder)). A server renders, tokenizes
//! and keys its requests on its own threads with it, and the engine does the same with its
//! own copy, so both give the same ids and the same key.

use super::chat::{ChatTemplate, Message};
use super::constraint::{Grammars, Schema, SchemaError};
use super::request::{Prompt, Request, RequestError};
use super::tokenizer::Tokenizer;
use crate::model::ModelIdentity;
use sha2::{Digest, Sha256};

/// The sha256 of a request's complete input (see [`PromptEncoder::key`]): what its reply
/// is a function of.
pub type RequestKey = [u8; 32];

/// Renders, tokenizes and keys prompts as the engine it came from does.
#[derive(Debug, Clone)]
pub struct PromptEncoder {
    pub(super) tokenizer: Tokenizer,
    pub(super) chat: ChatTemplate,
    pub(super) identity: ModelIdentity,
    /// The model's vocabulary (token ids at or above it are refused).
    pub(super) vocab: usize,
    /// The schemas compiled for this tokenizer, shared with the engine.
    pub(super) grammars: Grammars,
    /// Whether a control token's text inside a message is that control token (as before
    /// 0.x; unsafe with content from anyone but the caller) rather than text.
    pub(super) control_tokens_in_content: bool,
    /// The engine's longest sequence, prompt and reply.
    pub(super) max_context: usize,
}

impl PromptEncoder {
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    /// What the engine's replies are a function of, beside the request.
    pub fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    /// Compiles `schema` for the engine ahead of its request, on the grammars' own threads
    /// (see [`Grammars`]): the engine then finds it compiled. Says why it cannot be used.
    pub fn prepare_schema(&self, schema: &Schema) -> Result<(), SchemaError> {
        self.grammars.prepare(schema)
    }

    /// Token ids of a prompt, checked against the vocabulary.
    pub fn tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, RequestError> {
        let tokens = match prompt {
            Prompt::Tokens(tokens) => tokens.clone(),
            Prompt::Messages(messages) => self.message_tokens(messages, None)?,
            Prompt::Text(text) => {
                self.bound_length(text.len())?;
                self.encode(text, true)?
            }
        };
        self.check(tokens)
    }

    /// As [`PromptEncoder::tokens`], keeping given tokens rather than copying them.
    pub(crate) fn take_tokens(&self, prompt: Prompt) -> Result<Vec<u32>, RequestError> {
        match prompt {
            Prompt::Tokens(tokens) => self.check(tokens),
            other => self.tokens(&other),
        }
    }

    /// The conversation rendered by the chat template (ending with the assistant's header).
    pub fn render(&self, messages: &[Message]) -> Result<String, RequestError> {
        self.render_with_tools(messages, None)
    }

    /// The conversation rendered with the `tools` the template lists (OpenAI's form), for a
    /// template that has a tool syntax of its own.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<String, RequestError> {
        if messages.is_empty() {
            return Err(RequestError::EmptyMessages);
        }
        let tools_bytes = tools.map_or(0, |t| {
            let mut texts = Vec::new();
            super::chat::json_texts(t, &mut texts);
            texts.iter().map(|t| t.len()).sum()
        });
        self.bound_length(
            messages
                .iter()
                .flat_map(Message::texts)
                .map(str::len)
                .sum::<usize>()
                + tools_bytes,
        )?;
        if let Some(role) = self.chat.unknown_role(messages) {
            return Err(RequestError::UnknownRole {
                role: role.to_string(),
                known: self.chat.roles().join(", "),
            });
        }
        self.chat
            .render_with_tools(messages, tools, true)
            .map_err(|e| RequestError::Template(e.to_string()))
    }

    /// Whether any text of the conversation that came from its authors (a message's
    /// content, a call's arguments, a tool's description) spells a control token.
    pub(super) fn holds_control(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> bool {
        let mut texts: Vec<&str> = messages.iter().flat_map(Message::texts).collect();
        if let Some(tools) = tools {
            super::chat::json_texts(tools, &mut texts);
        }
        texts.iter().any(|t| self.tokenizer.holds_control(t))
    }

    /// A rendered conversation's ids. The template's markup is control tokens; a message's
    /// content is text even where it spells one (`A<|im_end|>\n<|im_start|>system`), so that
    /// no user, and no agent whose reply goes into another's prompt, can forge a turn. So are
    /// the calls, results and tools the template writes.
    pub(super) fn message_tokens(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, RequestError> {
        let rendered = self.render_with_tools(messages, tools)?;
        if self.control_tokens_in_content || !self.holds_control(messages, tools) {
            return self.encode(&rendered, false);
        }
        // Rendered again with each text made inert (same length), the control tokens still
        // there are the template's own.
        let defuse = |t: &str| self.tokenizer.defused(t);
        let defused: Vec<Message> = messages.iter().map(|m| m.map_texts(&defuse)).collect();
        let defused_tools = tools.map(|t| super::chat::map_json_texts(t, &defuse));
        let shadow = self.render_with_tools(&defused, defused_tools.as_ref())?;
        if shadow.len() != rendered.len() {
            return Err(RequestError::Template(
                "a message holds a control token's text, and this chat template renders the \
                 message otherwise than as written, so its text cannot be told from the \
                 template's markup: remove the control token's text from the message"
                    .into(),
            ));
        }
        self.tokenizer
            .encode_rendered(&rendered, &shadow)
            .map_err(|e| RequestError::Tokenizer(e.to_string()))
    }

    /// Refuses `bytes` of text that cannot fit the context however it tokenizes (the
    /// engine's exact check follows tokenizing): megabytes are refused at once rather than
    /// rendered and tokenized first.
    fn bound_length(&self, bytes: usize) -> Result<(), RequestError> {
        let tokens = self.tokenizer.fewest_tokens(bytes);
        if tokens >= self.max_context {
            return Err(RequestError::PromptTextTooLong {
                bytes,
                tokens,
                limit: self.max_context,
            });
        }
        Ok(())
    }

    pub(super) fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, RequestError> {
        self.tokenizer
            .encode(text, special)
            .map_err(|e| RequestError::Tokenizer(e.to_string()))
    }

    fn check(&self, tokens: Vec<u32>) -> Result<Vec<u32>, RequestError> {
        if tokens.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(RequestError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.vocab
            )));
        }
        Ok(tokens)
    }

    /// The key of `request` whose prompt is `tokens`: the model's identity (weights, format,
    /// device class, KV cache type), the prompt's tokens, the schema, the sampling settings
    /// and seed, the token limit and the stop strings. The tag and the retention key, which
    /// change no reply, are left out.
    pub fn key(&self, tokens: &[u32], request: &Request) -> RequestKey {
        let mut h = Sha256::new();
        // Each part with its length first, so that no two inputs hash the same bytes.
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        let id = &self.identity;
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
        // The bias and penalties change replies; the log-probabilities only report them.
        let rules = &request.logits;
        if rules.changes_logits() {
            part(b"logits");
            for (token, bias) in &rules.bias {
                part(&token.to_le_bytes());
                part(&bias.to_bits().to_le_bytes());
            }
            part(&rules.frequency_penalty.to_bits().to_le_bytes());
            part(&rules.presence_penalty.to_bits().to_le_bytes());
        }
        h.finalize().into()
    }
}
