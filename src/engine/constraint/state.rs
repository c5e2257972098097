//! One sequence's place in its grammar: the mask of the tokens it allows next, the tokens
//! it forces, and whether its value is complete.

use super::GrammarError;
use llguidance::Matcher;
use toktrie::SimpleVob;

/// One sequence's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    // Boxed: a matcher is large, and sequences move between queues by value.
    pub(super) matcher: Box<Matcher>,
    /// What the reply is held to, to read its value when it ends.
    pub(super) schema: super::Schema,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// The value of the whole reply `text` (`None` for words beside a frame).
    pub fn value_of(
        &self,
        text: &str,
    ) -> Result<Option<serde_json::Value>, super::frame::ReplyError> {
        self.schema.reply_value(text)
    }

    /// Tokens allowed next (the end-of-turn ids once the value is complete, which is also
    /// where a schema with one valid reply is after its forced tokens).
    pub fn mask(&mut self) -> Result<SimpleVob, GrammarError> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError(e.to_string()))
    }

    /// Advances past `token`, which the mask allowed.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError(e.to_string()))
    }

    /// Up to `room` of the tokens the grammar allows no alternative to (keys, punctuation),
    /// consumed: the caller appends them without sampling. Forced tokens past the reply's
    /// room would be cut from it anyway; a long `const` would otherwise be prefilled whole.
    pub fn forced(&mut self, room: usize) -> Vec<u32> {
        if room == 0 {
            return Vec::new();
        }
        let mut forced = self.matcher.compute_ff_tokens();
        forced.truncate(room);
        if forced.is_empty() || self.matcher.consume_tokens(&forced).is_err() {
            return Vec::new();
        }
        forced
    }

    /// Whether the grammar admits no further token: the value is complete.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

/// Sets the logits of tokens `mask` forbids to `-inf`.
pub(crate) fn apply_mask(logits: &mut [f32], mask: &SimpleVob) {
    for (word_index, &word) in mask.as_slice().iter().enumerate() {
        if word == u32::MAX {
            continue;
        }
        let start = word_index * 32;
        for bit in 0..32 {
            let i = start + bit;
            if i >= logits.len() {
                return;
            }
            if word & (1 << bit) == 0 {
                logits[i] = f32::NEG_INFINITY;
            }
        }
    }
}
