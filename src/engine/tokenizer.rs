//! Text <-> token ids, and incremental detokenization for streaming.

#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(String);

/// A model's tokenizer with the ids that end a reply.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
}

impl Tokenizer {
    pub fn new(inner: tokenizers::Tokenizer, eos_ids: Vec<u32>) -> Self {
        Self { inner, eos_ids }
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
