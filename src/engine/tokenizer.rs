//! Text <-> token ids, and incremental detokenization for streaming.

use aho_corasick::{AhoCorasick, MatchKind};

#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(String);

/// A model's tokenizer with the ids that end a reply.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer, reading the control tokens' text (`<|im_end|>`) as text.
    as_text: tokenizers::Tokenizer,
    /// Finds the control tokens' text (the added tokens marked special).
    controls: Option<AhoCorasick>,
    /// The most bytes of text one token stands for, or more: a vocabulary entry's length as
    /// written (a byte-level entry writes a byte as one or two bytes, `<0x0A>` as six).
    longest_token: usize,
    eos_ids: Vec<u32>,
}

impl Tokenizer {
    pub fn new(inner: tokenizers::Tokenizer, eos_ids: Vec<u32>) -> Self {
        let mut as_text = inner.clone();
        as_text.set_encode_special_tokens(true);
        let controls: Vec<String> = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        let controls = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&controls)
            .ok()
            .filter(|_| !controls.is_empty());
        let longest_token = inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1);
        Self {
            inner,
            as_text,
            controls,
            longest_token,
            eos_ids,
        }
    }

    /// The fewest tokens `bytes` of text can be, found without tokenizing it: a bound that
    /// refuses a prompt far too long for the context before the work of tokenizing it.
    pub(crate) fn fewest_tokens(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.longest_token)
    }

    /// Whether `text` holds the text of a control token.
    pub(crate) fn holds_control(&self, text: &str) -> bool {
        self.controls.as_ref().is_some_and(|c| c.is_match(text))
    }

    /// `text` with every control token's text made inert and kept the same length: its first
    /// character replaced by as many ASCII letters as it has bytes, which no template escapes
    /// or trims. Rendered in its place, it shows where a message's own control text went.
    pub(crate) fn defused(&self, text: &str) -> String {
        let Some(controls) = &self.controls else {
            return text.to_string();
        };
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for m in controls.find_iter(text) {
            out.push_str(&text[last..m.start()]);
            let found = &text[m.start()..m.end()];
            let first = found
                .chars()
                .next()
                .expect("invariant: a match is not empty");
            let letter = if first == 'X' { "Y" } else { "X" };
            out.push_str(&letter.repeat(first.len_utf8()));
            out.push_str(&found[first.len_utf8()..]);
            last = m.end();
        }
        out.push_str(&text[last..]);
        out
    }

    /// Token ids of a rendered chat template whose control tokens are its own only where
    /// `shadow` (the same conversation rendered with its messages [`Tokenizer::defused`])
    /// still has them: the rest came from a message and go in as the text they spell.
    pub(crate) fn encode_rendered(
        &self,
        rendered: &str,
        shadow: &str,
    ) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode(rendered, false)
            .map_err(|e| TokenizerError(e.to_string()))?;
        let mut ids = Vec::with_capacity(encoding.len());
        for (&id, &(start, end)) in encoding.get_ids().iter().zip(encoding.get_offsets()) {
            let piece = rendered.get(start..end);
            let forged =
                piece.is_some_and(|p| self.holds_control(p)) && shadow.get(start..end) != piece;
            match piece {
                Some(piece) if forged => ids.extend(
                    self.as_text
                        .encode_fast(piece, false)
                        .map_err(|e| TokenizerError(e.to_string()))?
                        .get_ids(),
                ),
                _ => ids.push(id),
            }
        }
        Ok(ids)
    }

    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer's post-processor
    /// adds (Llama 3: `<|begin_of_text|>`). Rendered chat templates already carry theirs.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError(e.to_string()))
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError(e.to_string()))
    }

    pub(crate) fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Size of the vocabulary including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes of characters that are
/// not complete yet (a multi-byte character can span tokens). The state lives with the
/// sequence; the tokenizer is passed in, so sequences stay free of borrows.
#[derive(Debug, Clone, Default)]
pub(crate) struct Detokenizer {
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl Detokenizer {
    /// The text `id` adds, if it completes any characters.
    pub fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: u32,
    ) -> Result<Option<String>, TokenizerError> {
        tokenizers::tokenizer::step_decode_stream(
            &tokenizer.inner,
            vec![id],
            true,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|e| TokenizerError(e.to_string()))
    }
}
