//! Ragged batches over a paged KV cache on any device and dtype, for tests that compare them
//! with solo runs and across devices. Logits come back as f32 rows on the CPU.

use candle_core::{DType, Device, IndexOp, Tensor};
use throng::model::{AttentionBackend, BatchInputs, CausalLm, KvCache, SeqChunk};

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Largest absolute logit, for tolerances relative to the logits' scale.
pub fn max_abs(a: &Tensor) -> f32 {
    a.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// `n` byte-range tokens, different for each seed.
pub fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 11 + 3) % 256)
        .collect()
}

fn row(logits: &Tensor, i: usize) -> Tensor {
    logits
        .i(i)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap()
}

/// The sequence alone in a fresh cache: its prompt `toks[..prompt]` at once, then one token
/// at a time; the logits after the prompt and after each later token.
pub fn solo(model: &dyn CausalLm, toks: &[u32], prompt: usize, block_size: usize) -> Vec<Tensor> {
    let blocks: Vec<u32> = (0..toks.len().div_ceil(block_size) as u32).collect();
    let mut kv = KvCache::new(
        model.config(),
        blocks.len(),
        block_size,
        model.dtype(),
        model.device(),
    )
    .unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < toks.len() {
        let end = if pos == 0 { prompt } else { pos + 1 };
        let batch = BatchInputs::new(
            &[SeqChunk {
                tokens: &toks[pos..end],
                start: pos,
                blocks: &blocks,
                wants_logits: true,
            }],
            &kv,
        )
        .unwrap();
        out.push(row(&model.forward(&batch, &mut kv).unwrap(), 0));
        pos = end;
    }
    out
}

/// All sequences in one pool, blocks handed out from the top down (no sequence gets
/// contiguous ids), prompts in chunks of at most `chunk` tokens, then decoding together:
/// the logits of each sequence after its prompt and after each later token, as [`solo`].
pub fn batched(
    model: &dyn CausalLm,
    seqs: &[Vec<u32>],
    prompts: &[usize],
    block_size: usize,
    chunk: usize,
) -> Vec<Vec<Tensor>> {
    batched_with(model, seqs, prompts, block_size, chunk, None)
}

/// [`batched`] with the given attention implementation (default: the cache's choice).
pub fn batched_with(
    model: &dyn CausalLm,
    seqs: &[Vec<u32>],
    prompts: &[usize],
    block_size: usize,
    chunk: usize,
    attention: Option<AttentionBackend>,
) -> Vec<Vec<Tensor>> {
    let total: usize = seqs.iter().map(|s| s.len().div_ceil(block_size)).sum();
    let mut kv = KvCache::new(
        model.config(),
        total,
        block_size,
        model.dtype(),
        model.device(),
    )
    .unwrap();
    if let Some(backend) = attention {
        kv.set_attention(backend).unwrap();
    }
    let mut free: Vec<u32> = (0..total as u32).collect();
    let blocks: Vec<Vec<u32>> = seqs
        .iter()
        .map(|t| {
            let need = t.len().div_ceil(block_size);
            free.split_off(free.len() - need)
                .into_iter()
                .rev()
                .collect()
        })
        .collect();
    let mut done = vec![0usize; seqs.len()];
    let mut got: Vec<Vec<Tensor>> = vec![Vec::new(); seqs.len()];
    loop {
        let mut chunks = Vec::new();
        let mut who = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if done[i] >= s.len() {
                continue;
            }
            let end = if done[i] < prompts[i] {
                (done[i] + chunk).min(prompts[i])
            } else {
                done[i] + 1
            };
            let wants_logits = end >= prompts[i];
            chunks.push(SeqChunk {
                tokens: &s[done[i]..end],
                start: done[i],
                blocks: &blocks[i],
                wants_logits,
            });
            who.push((i, end, wants_logits));
        }
        if chunks.is_empty() {
            break;
        }
        let batch = BatchInputs::new(&chunks, &kv).unwrap();
        let logits = model.forward(&batch, &mut kv).unwrap();
        let mut r = 0;
        for (i, end, wants) in who {
            done[i] = end;
            if wants {
                got[i].push(row(&logits, r));
                r += 1;
            }
        }
    }
    got
}
