//! A conversation whose assistant turns repeat replies the engine generated, tokenized with
//! those replies as the ids the model generated rather than as their text tokenized again.
//!
//! Tokenizing a reply's text again need not give the ids the model sampled (a constrained
//! reply's forced tokens, or any text a tokenizer splits otherwise than a model wrote it), and
//! where the ids differ the next prompt leaves the prefix the cache holds at that reply: a
//! multi-turn agent would compute its whole history again every turn. Spliced, the prompt up
//! to the end of the reply is the previous prompt and the reply exactly as they ran, so the
//! prefix cache (and next-call retention) holds all of it.

use super::chat::Message;
use super::prompt_encoder::PromptEncoder;
use super::request::RequestError;

/// A prompt's token ids, and how many replies went in as their generated ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spliced {
    pub tokens: Vec<u32>,
    /// Replies spliced in: all of those given, or none where the chat template changes a
    /// message's text as it renders it (the ids would not be the text it renders).
    pub spliced: usize,
}

/// A stand-in for a reply in the rendered text: characters of Unicode's private use area,
/// which no chat template writes.
fn marker(k: usize) -> String {
    format!("\u{F8FE}throng-reply-{k}\u{F8FF}")
}

impl PromptEncoder {
    /// Token ids of `messages` (as [`PromptEncoder::tokens`] gives them), with the content
    /// of each message `replies` names (its index, and the ids it was generated as) tokenized
    /// as those ids. The text around each reply is tokenized on its own, as the prompt that
    /// asked for the reply was.
    pub fn spliced_tokens(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        replies: &[(usize, &[u32])],
    ) -> Result<Spliced, RequestError> {
        let whole = self.render_with_tools(messages, tools)?;
        let unspliced = |_: &str| -> Result<Spliced, RequestError> {
            Ok(Spliced {
                tokens: self.tokens(&super::Prompt::Tokens(
                    self.message_tokens(messages, tools)?,
                ))?,
                spliced: 0,
            })
        };
        // Segments tokenized on their own would read a message's control text as control
        // tokens; such a conversation is tokenized whole, where it is read as text.
        if replies.is_empty()
            || (!self.control_tokens_in_content && self.holds_control(messages, tools))
        {
            return unspliced(&whole);
        }
        let mut marked = messages.to_vec();
        for (k, &(at, _)) in replies.iter().enumerate() {
            match marked.get_mut(at) {
                Some(m) => m.content = marker(k),
                None => return unspliced(&whole),
            }
        }
        let marked = self.render_with_tools(&marked, tools)?;
        // The segments of text between the replies, each reply's marker found once, in order.
        let mut segments = Vec::with_capacity(replies.len() + 1);
        let mut rest = marked.as_str();
        for k in 0..replies.len() {
            let m = marker(k);
            let Some(at) = rest.find(&m) else {
                return unspliced(&whole);
            };
            segments.push(&rest[..at]);
            rest = &rest[at + m.len()..];
            if rest.contains(&m) {
                return unspliced(&whole);
            }
        }
        segments.push(rest);
        // The template must render each reply's text as it is (one that trims or escapes
        // it renders other text than the ids are).
        let mut rebuilt = String::with_capacity(whole.len());
        for (k, segment) in segments.iter().enumerate() {
            rebuilt.push_str(segment);
            if let Some(&(at, _)) = replies.get(k) {
                rebuilt.push_str(&messages[at].content);
            }
        }
        if rebuilt != whole {
            return unspliced(&whole);
        }
        let mut tokens = Vec::new();
        for (k, segment) in segments.iter().enumerate() {
            tokens.extend(self.encode(segment, false)?);
            if let Some(&(_, ids)) = replies.get(k) {
                tokens.extend_from_slice(ids);
            }
        }
        Ok(Spliced {
            tokens: self.tokens(&super::Prompt::Tokens(tokens))?,
            spliced: replies.len(),
        })
    }
}

impl PromptEncoder {
    /// The ids of a reply whose text is `text` and which was generated as `generated`: the
    /// generated ids without what ended it (an end-of-sequence token, a stop string's tokens),
    /// if they spell `text` exactly; `None` where they do not (a stop string cut a token).
    pub fn reply_ids(&self, generated: &[u32], text: &str) -> Option<Vec<u32>> {
        let mut ids = generated;
        while let Some((&last, rest)) = ids.split_last() {
            let spelled = self.tokenizer.decode(ids, false).ok()?;
            if spelled == text {
                return Some(ids.to_vec());
            }
            // Trailing tokens past the text: an end token, or a stop string's.
            if !(self.tokenizer.is_eos(last) || spelled.len() > text.len()) {
                return None;
            }
            ids = rest;
        }
        text.is_empty().then(Vec::new)
    }
}
