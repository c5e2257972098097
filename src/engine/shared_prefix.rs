//! A conversation's shared head (its system message), rendered and tokenized once for
//! thousands of requests, so that each request pays template and tokenizer time only for its
//! own messages.
//!
//! The split is made right after the special token that closes the system message
//! (`<|eot_id|>`, `<|im_end|>`): tokenizers cut text at special tokens before any other
//! rule, so tokenizing the two sides apart gives the tokens of the whole. That is checked
//! once, when the prefix is made; a template or tokenizer where it does not hold falls back
//! to rendering and tokenizing every prompt whole.

use super::chat::{ChatTemplate, Message};
use super::request::RequestError;
use super::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

/// Stands in for the system message when a request's own messages are rendered.
const MARK: &str = "\u{27E6}throng-shared-prefix\u{27E7}";

/// The system message of a group of requests, rendered and tokenized.
#[derive(Debug, Clone)]
pub struct SharedPrefix {
    system: String,
    /// Tokens of the template up to and including the system message's closing token.
    tokens: Vec<u32>,
    /// Rendered text before the system content, with [`MARK`] as the system message.
    head: String,
    /// Rendered text after the system content, up to and including its closing token.
    close: String,
    /// Whether split tokenization was checked to equal whole tokenization.
    exact: bool,
    /// SHA-256 state after the system message, for prompt hashes.
    hasher: Sha256,
}

/// Where a request's preparation time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PromptCost {
    pub template: Duration,
    pub tokenize: Duration,
}

impl std::ops::AddAssign for PromptCost {
    fn add_assign(&mut self, other: Self) {
        self.template += other.template;
        self.tokenize += other.tokenize;
    }
}

fn template_error(e: impl std::fmt::Display) -> RequestError {
    RequestError::Template(e.to_string())
}

fn tokenizer_error(e: impl std::fmt::Display) -> RequestError {
    RequestError::Tokenizer(e.to_string())
}

/// The end of the first special token in `text`.
fn end_of_first_special(text: &str, specials: &[String]) -> Option<usize> {
    specials
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()).map(|i| (i, i + s.len())))
        .min_by_key(|&(start, end)| (start, std::cmp::Reverse(end)))
        .map(|(_, end)| end)
}

fn hash_message(hasher: &mut Sha256, m: &Message) {
    hasher.update(m.role.as_bytes());
    hasher.update([0]);
    hasher.update(m.content.as_bytes());
    hasher.update([0]);
}

impl SharedPrefix {
    /// Renders and tokenizes `system` once under `chat`, and checks that requests can add
    /// their own messages' tokens to it.
    pub fn new(
        chat: &ChatTemplate,
        tokenizer: &Tokenizer,
        system: &str,
    ) -> Result<Self, RequestError> {
        let probe = [Message::system(MARK), Message::user("x")];
        let marked = chat.render(&probe, true).map_err(template_error)?;
        let mut hasher = Sha256::new();
        hash_message(&mut hasher, &Message::system(system));
        let whole = |s: &Self| -> Result<Self, RequestError> {
            Ok(Self {
                exact: false,
                ..s.clone()
            })
        };
        let fallback = Self {
            system: system.to_string(),
            tokens: Vec::new(),
            head: String::new(),
            close: String::new(),
            exact: false,
            hasher: hasher.clone(),
        };
        let Some(at) = marked.find(MARK) else {
            return whole(&fallback);
        };
        let (head, tail) = (&marked[..at], &marked[at + MARK.len()..]);
        let specials: Vec<String> = tokenizer
            .inner()
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special)
            .map(|t| t.content.clone())
            .collect();
        let Some(cut) = end_of_first_special(tail, &specials) else {
            return whole(&fallback);
        };
        let close = &tail[..cut];
        let tokens = tokenizer
            .encode(&format!("{head}{system}{close}"), false)
            .map_err(tokenizer_error)?;
        let prefix = Self {
            system: system.to_string(),
            tokens,
            head: head.to_string(),
            close: close.to_string(),
            exact: true,
            hasher,
        };
        // The check: split tokens equal whole tokens for a request like every other.
        let (split, _) = prefix.split_tokens(chat, tokenizer, &probe[1..])?;
        let full = chat
            .render(&[Message::system(system), Message::user("x")], true)
            .map_err(template_error)?;
        let full = tokenizer.encode(&full, false).map_err(tokenizer_error)?;
        if split != Some(full) {
            return whole(&prefix);
        }
        Ok(prefix)
    }

    /// Tokens of the shared part (empty when every prompt is tokenized whole).
    pub fn shared_tokens(&self) -> &[u32] {
        if self.exact { &self.tokens } else { &[] }
    }

    pub fn system(&self) -> &str {
        &self.system
    }

    /// `None` when this request's rendering does not start as the probe's did.
    fn split_tokens(
        &self,
        chat: &ChatTemplate,
        tokenizer: &Tokenizer,
        own: &[Message],
    ) -> Result<(Option<Vec<u32>>, PromptCost), RequestError> {
        let started = Instant::now();
        let mut messages = Vec::with_capacity(own.len() + 1);
        messages.push(Message::system(MARK));
        messages.extend_from_slice(own);
        let rendered = chat.render(&messages, true).map_err(template_error)?;
        let template = started.elapsed();
        let rest = rendered
            .strip_prefix(self.head.as_str())
            .and_then(|r| r.strip_prefix(MARK))
            .and_then(|r| r.strip_prefix(self.close.as_str()));
        let Some(rest) = rest else {
            return Ok((
                None,
                PromptCost {
                    template,
                    tokenize: Duration::ZERO,
                },
            ));
        };
        let started = Instant::now();
        let mut tokens = Vec::with_capacity(self.tokens.len() + rest.len() / 3);
        tokens.extend_from_slice(&self.tokens);
        tokens.extend(tokenizer.encode(rest, false).map_err(tokenizer_error)?);
        Ok((
            Some(tokens),
            PromptCost {
                template,
                tokenize: started.elapsed(),
            },
        ))
    }

    /// The prompt tokens of a request made of the system message and `own` messages, with
    /// what rendering and tokenizing them cost.
    pub fn tokens(
        &self,
        chat: &ChatTemplate,
        tokenizer: &Tokenizer,
        own: &[Message],
    ) -> Result<(Vec<u32>, PromptCost), RequestError> {
        if own.is_empty() {
            return Err(RequestError::EmptyMessages);
        }
        if self.exact {
            let (tokens, cost) = self.split_tokens(chat, tokenizer, own)?;
            if let Some(tokens) = tokens {
                return Ok((tokens, cost));
            }
        }
        let started = Instant::now();
        let mut messages = Vec::with_capacity(own.len() + 1);
        messages.push(Message::system(self.system.clone()));
        messages.extend_from_slice(own);
        let rendered = chat.render(&messages, true).map_err(template_error)?;
        let template = started.elapsed();
        let started = Instant::now();
        let tokens = tokenizer
            .encode(&rendered, false)
            .map_err(tokenizer_error)?;
        Ok((
            tokens,
            PromptCost {
                template,
                tokenize: started.elapsed(),
            },
        ))
    }

    /// SHA-256 (first 16 hex digits) of the whole conversation, as if hashed message by
    /// message from the start; the system message's share is computed once.
    pub fn hash(&self, own: &[Message]) -> String {
        let mut hasher = self.hasher.clone();
        for m in own {
            hash_message(&mut hasher, m);
        }
        hasher.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::loader::ChatSpec;

    #[test]
    fn the_first_special_token_ends_the_shared_part() {
        let specials = vec!["<|eot_id|>".to_string(), "<|start_header_id|>".to_string()];
        let tail = "<|eot_id|><|start_header_id|>user";
        assert_eq!(end_of_first_special(tail, &specials), Some(10));
        assert_eq!(
            end_of_first_special("\n<|im_end|>", &["<|im_end|>".into()]),
            Some(11)
        );
        assert_eq!(end_of_first_special("no specials", &specials), None);
    }

    #[test]
    fn a_template_without_the_system_message_falls_back_to_whole_prompts() {
        // A template that drops system messages: no mark, so no shared tokens.
        let chat = ChatTemplate::new(&ChatSpec {
            template: Some("{% for m in messages %}{% if m.role != 'system' %}{{ m.content }}{% endif %}{% endfor %}".into()),
            ..ChatSpec::default()
        })
        .unwrap();
        // The byte vocabulary spells any text; replies end at `<|eot_id|>` (id 257).
        let json = crate::model::synthetic::byte_tokenizer_json().to_string();
        let tokenizer = crate::engine::Tokenizer::new(json.parse().unwrap(), vec![257]);
        let prefix = SharedPrefix::new(&chat, &tokenizer, "rules").unwrap();
        assert!(prefix.shared_tokens().is_empty());
        let (tokens, _) = prefix
            .tokens(&chat, &tokenizer, &[Message::user("hi")])
            .unwrap();
        assert_eq!(tokens, tokenizer.encode("hi", false).unwrap());
    }
}
