//! A request being served: its tokens, how far the cache has them, and its decoding state.

use super::block_hash::BlockHash;
use super::block_manager::BlockId;
use super::constraint::Constraint;
use super::logit_rules::{LogitRules, TokenLogprob};
use super::sampler::Sampler;
use super::tokenizer::Detokenizer;
use std::time::Instant;

/// Identifies a request inside the engine; also its order of arrival.
pub(crate) type SeqId = u64;

#[derive(Debug)]
pub struct Sequence {
    pub id: SeqId,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose keys and values are in the cache; `tokens[computed..]` are pending.
    pub computed: usize,
    /// The block table: block `i` holds positions `i * block_size ..`.
    pub blocks: Vec<BlockId>,
    /// Content names of the full blocks of `tokens` (prefix caching).
    pub hashes: Vec<BlockHash>,
    /// Leading blocks registered in (or taken from) the prefix cache.
    pub registered: usize,
    /// Blocks `registered..in_flight_until` are announced as being computed by this sequence,
    /// so that requests sharing them wait for them instead of computing them again.
    pub in_flight_until: usize,
    /// Prompt tokens found in the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    pub sampler: Sampler,
    /// The grammar the reply must follow.
    pub constraint: Option<Constraint>,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Its bias, penalties and whether it reports log-probabilities.
    pub rules: LogitRules,
    /// The log-probability of each generated token, when `rules` asks for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Generated text so far, built incrementally for stop strings and streaming.
    pub text: String,
    /// Bytes of `text` handed out as stream deltas. It stays behind any point a stop string
    /// could still cut, so what was streamed is always a prefix of the reply.
    pub streamed: usize,
    pub detok: Detokenizer,
    pub tag: Option<String>,
    /// Its caller's key, under which its blocks are retained when it finishes.
    pub retention_key: Option<String>,
    pub arrived: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
}

impl Sequence {
    pub fn new(id: SeqId, prompt: Vec<u32>, sampler: Sampler, max_tokens: usize) -> Self {
        Self {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            registered: 0,
            in_flight_until: 0,
            cached_tokens: None,
            sampler,
            constraint: None,
            max_tokens,
            stop: Vec::new(),
            rules: LogitRules::default(),
            logprobs: Vec::new(),
            text: String::new(),
            streamed: 0,
            detok: Detokenizer::default(),
            tag: None,
            retention_key: None,
            arrived: Instant::now(),
            first_scheduled: None,
            first_token: None,
        }
    }

    /// The most tokens it may hold: its prompt and `max_tokens`, within the context.
    pub fn limit(&self, max_context: usize) -> usize {
        // Saturating: `--max-tokens` may be as large as a usize holds.
        self.prompt_len
            .saturating_add(self.max_tokens)
            .min(max_context)
    }

    /// Tokens still to run through the model.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.computed
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}
