//! The explicit context of one forward pass: which tokens of which sequences, where they sit,
//! where their keys and values go, and which rows need logits.

use super::attention::{AttentionPlan, AttentionTimer, Heads, SeqSpan};
use super::{KvCache, ModelError};
use candle_core::Tensor;

/// One sequence's share of a step: `tokens` are new, the first at position `start`.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    /// Tokens of this sequence already in the KV cache, i.e. the position of `tokens[0]`.
    pub start: usize,
    /// KV blocks covering positions `0..start + tokens.len()`, in order. Blocks may be shared
    /// with other sequences (a common prefix); only the slots at `start..` are written.
    pub blocks: &'a [u32],
    /// Whether to return next-token logits after the chunk's last token (false for every
    /// prefill chunk but the last).
    pub wants_logits: bool,
}

/// The cache row of each packed token's key and value.
#[derive(Debug)]
pub(crate) struct Slots {
    pub rows: Vec<u32>,
    /// On a GPU, `(T, kv_width)` u32: the rows repeated across each row's width, so that one
    /// `scatter_set` writes a whole layer. The CPU copies rows straight from `rows`.
    pub repeated: Option<Tensor>,
}

impl Slots {
    fn new(
        rows: Vec<u32>,
        width: usize,
        device: &candle_core::Device,
    ) -> candle_core::Result<Self> {
        let repeated = match device.is_cpu() {
            true => None,
            false => Some(
                Tensor::from_vec(rows.clone(), (rows.len(), 1), device)?
                    .broadcast_as((rows.len(), width))?
                    .contiguous()?,
            ),
        };
        Ok(Self { rows, repeated })
    }
}

/// Device-ready inputs of one ragged batch, built once per step and shared by every layer.
#[derive(Debug)]
pub struct BatchInputs {
    /// `(T,)` u32: the new tokens of all chunks, packed end to end.
    pub(crate) token_ids: Tensor,
    /// Position of each packed token; RoPE tables are built from these.
    pub(crate) positions: Vec<u32>,
    /// The cache row each token's key and value go to.
    pub(crate) slots: Slots,
    /// `(n,)` u32: packed rows whose logits the step returns.
    pub(crate) logit_rows: Tensor,
    num_logit_rows: usize,
    pub(crate) attention: AttentionPlan,
    /// Set by [`BatchInputs::time_attention`].
    attention_timer: Option<AttentionTimer>,
}

impl BatchInputs {
    /// Packs `chunks` for a forward pass against `kv`, checking that every chunk fits its
    /// blocks so that no kernel can ever index outside the cache.
    pub fn new(chunks: &[SeqChunk<'_>], kv: &KvCache) -> Result<Self, ModelError> {
        Self::build(chunks, kv, false)
    }

    /// As [`BatchInputs::new`], but a chunk that wants logits gets them after every one of
    /// its tokens, not only the last: the next-token distribution at each position of a
    /// text, which scoring it (perplexity, divergence between two weight formats) needs.
    pub(crate) fn with_every_logit(
        chunks: &[SeqChunk<'_>],
        kv: &KvCache,
    ) -> Result<Self, ModelError> {
        Self::build(chunks, kv, true)
    }

    fn build(chunks: &[SeqChunk<'_>], kv: &KvCache, every: bool) -> Result<Self, ModelError> {
        if chunks.is_empty() {
            return Err(ModelError::InvalidRequest(
                "a batch needs at least one sequence".into(),
            ));
        }
        let block_size = kv.block_size();
        let total: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let mut token_ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut slots = Vec::with_capacity(total);
        let mut logit_rows = Vec::new();
        let mut spans = Vec::with_capacity(chunks.len());
        for (i, chunk) in chunks.iter().enumerate() {
            if chunk.tokens.is_empty() {
                return Err(ModelError::InvalidRequest(format!(
                    "chunk {i} has no tokens"
                )));
            }
            let end = chunk.start + chunk.tokens.len();
            if chunk.blocks.len() * block_size < end {
                return Err(ModelError::InvalidRequest(format!(
                    "chunk {i} reaches position {end} but its {} blocks hold {}",
                    chunk.blocks.len(),
                    chunk.blocks.len() * block_size
                )));
            }
            if let Some(&b) = chunk
                .blocks
                .iter()
                .find(|&&b| b as usize >= kv.num_blocks())
            {
                return Err(ModelError::InvalidRequest(format!(
                    "chunk {i} names block {b}, the cache has {}",
                    kv.num_blocks()
                )));
            }
            let q_start = token_ids.len();
            for (offset, &token) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start + offset;
                token_ids.push(token);
                positions.push(pos as u32);
                slots.push(
                    chunk.blocks[pos / block_size] * block_size as u32 + (pos % block_size) as u32,
                );
            }
            if chunk.wants_logits && every {
                logit_rows.extend(q_start as u32..token_ids.len() as u32);
            } else if chunk.wants_logits {
                logit_rows.push((token_ids.len() - 1) as u32);
            }
            spans.push(SeqSpan {
                q_start,
                q_len: chunk.tokens.len(),
                start: chunk.start,
                blocks: chunk.blocks.to_vec(),
            });
        }
        let device = kv.device();
        let num_logit_rows = logit_rows.len();
        let slots = Slots::new(slots, kv.row_width(), device)?;
        Ok(Self {
            token_ids: Tensor::from_vec(token_ids, total, device)?,
            positions,
            slots,
            logit_rows: Tensor::from_vec(logit_rows, num_logit_rows, device)?,
            num_logit_rows,
            attention: AttentionPlan::new(
                spans,
                block_size,
                kv.attention(),
                kv.window(),
                kv.cascade(),
                device,
            )?,
            attention_timer: None,
        })
    }

    /// Measures the time the forward pass spends in attention (see
    /// [`BatchInputs::attention_time`]).
    pub(crate) fn time_attention(&mut self) {
        self.attention_timer = Some(AttentionTimer::default());
    }

    /// Time spent in attention by the forward passes over this batch, if measured. On CUDA
    /// this waits for them to finish.
    pub(crate) fn attention_time(&self) -> Result<Option<std::time::Duration>, ModelError> {
        self.attention_timer
            .as_ref()
            .map(|t| t.total())
            .transpose()
            .map_err(|e| ModelError::during("timing attention", e))
    }

    /// One layer's attention: packed queries `(T, heads, head_dim)` against the cached keys and
    /// values `(num_blocks, block_size, kv_heads, head_dim)`; returns `(T, heads * head_dim)`.
    pub(crate) fn attend(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        heads: Heads,
    ) -> candle_core::Result<Tensor> {
        match &self.attention_timer {
            None => self.attention.attend(q, k_cache, v_cache, heads),
            Some(timer) => timer.time(q.device(), || {
                self.attention.attend(q, k_cache, v_cache, heads)
            }),
        }
    }

    /// Number of packed tokens in the batch.
    pub(crate) fn num_tokens(&self) -> usize {
        self.positions.len()
    }

    /// Number of logit rows the forward pass returns.
    pub(crate) fn num_logit_rows(&self) -> usize {
        self.num_logit_rows
    }
}
