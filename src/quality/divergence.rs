//! How far one model's next-token distributions are from another's over the same tokens:
//! perplexity of each, Kullback-Leibler divergence and top-1 agreement, the statistics
//! llama.cpp's `perplexity --kl-divergence` reports for its quantized formats.
//!
//! Both models read every sequence teacher-forced, in one forward pass per batch of
//! sequences that returns logits at every position ([`BatchInputs::with_every_logit`]), and
//! their distributions are compared row by row as they arrive: nothing of size vocabulary
//! times positions is ever kept.

use crate::model::{BatchInputs, CausalLm, KvCache, ModelError, SeqChunk};
use candle_core::DType;
use rayon::prelude::*;
use serde::Serialize;

/// Tokens scored per forward pass: the CPU engine's batch, a few hundred megabytes of logits
/// for a 128k vocabulary.
const TOKENS_PER_PASS: usize = 512;

/// KV block size of the scoring caches (any works: each pass starts from position 0).
const BLOCK: usize = 16;

/// A sequence to score: the distributions after positions `scored_from..` are compared, and
/// the tokens that follow them count towards perplexity.
#[derive(Debug, Clone)]
pub struct Scored {
    pub tokens: Vec<u32>,
    /// The first position whose next-token distribution counts; earlier tokens are context.
    pub scored_from: usize,
}

/// The divergence of a candidate's distributions from the reference's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Divergence {
    /// Positions whose distributions were compared.
    pub positions: usize,
    /// Of which positions with a known next token (perplexity's tokens).
    pub predicted: usize,
    pub reference_perplexity: f64,
    pub perplexity: f64,
    /// Standard error of the log of [`Divergence::perplexity_ratio`]: the mean of the
    /// per-token log-likelihood differences is that log, and this its uncertainty.
    pub log_ratio_se: f64,
    /// Mean of `KL(reference || candidate)` over positions, in nats.
    pub mean_kl: f64,
    /// The 99th percentile of the per-position divergence.
    pub p99_kl: f64,
    pub max_kl: f64,
    /// Share of positions where both put the same token first.
    pub top1_agreement: f64,
}

impl Divergence {
    /// `perplexity / reference_perplexity`: 1 is no loss.
    pub(crate) fn perplexity_ratio(&self) -> f64 {
        self.perplexity / self.reference_perplexity
    }
}

/// What one position contributed.
#[derive(Debug, Clone, Copy)]
struct Position {
    kl: f64,
    same_top1: bool,
    /// Negative log-likelihoods of the next token, when there is one.
    nll: Option<(f64, f64)>,
}

/// Compares `candidate` with `reference` over `sequences`. Both models must share a tokenizer
/// (the same model in two weight formats).
pub fn compare(
    reference: &dyn CausalLm,
    candidate: &dyn CausalLm,
    candidate_kv: DType,
    sequences: &[Scored],
) -> Result<Divergence, ModelError> {
    let vocab = reference.config().vocab_size;
    if candidate.config().vocab_size != vocab {
        return Err(ModelError::InvalidRequest(format!(
            "the models' vocabularies differ ({vocab} and {} tokens): compare one model in two formats",
            candidate.config().vocab_size
        )));
    }
    let longest = sequences.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
    // Each pass starts at block 0: a sequence's blocks round its length up, by less than one
    // block per sequence.
    let blocks =
        TOKENS_PER_PASS.max(longest).div_ceil(BLOCK) + sequences.len().min(TOKENS_PER_PASS);
    let cache =
        |m: &dyn CausalLm, dtype| KvCache::new(m.config(), blocks, BLOCK, dtype, m.device());
    let (mut ref_kv, mut cand_kv) = (
        cache(reference, reference.dtype())?,
        cache(candidate, candidate_kv)?,
    );
    let mut positions = Vec::new();
    for group in passes(sequences) {
        let mut next_block = 0u32;
        let block_lists: Vec<Vec<u32>> = group
            .iter()
            .map(|s| {
                let n = s.tokens.len().div_ceil(BLOCK) as u32;
                let list = (next_block..next_block + n).collect();
                next_block += n;
                list
            })
            .collect();
        let chunks: Vec<SeqChunk<'_>> = group
            .iter()
            .zip(&block_lists)
            .map(|(s, blocks)| SeqChunk {
                tokens: &s.tokens,
                start: 0,
                blocks,
                wants_logits: true,
            })
            .collect();
        let logits = |model: &dyn CausalLm, kv: &mut KvCache| -> Result<Vec<f32>, ModelError> {
            let batch = BatchInputs::with_every_logit(&chunks, kv)?;
            let logits = model.forward(&batch, kv)?;
            logits
                .flatten_all()
                .and_then(|l| l.to_vec1::<f32>())
                .map_err(|e| ModelError::during("reading logits", e))
        };
        let want = logits(reference, &mut ref_kv)?;
        let got = logits(candidate, &mut cand_kv)?;
        // Row r of the pass is position `p` of sequence `s`, in order.
        let rows: Vec<(usize, usize)> = group
            .iter()
            .enumerate()
            .flat_map(|(s, seq)| (0..seq.tokens.len()).map(move |p| (s, p)))
            .collect();
        positions.par_extend(
            rows.par_iter()
                .enumerate()
                .filter(|(_, (s, p))| *p >= group[*s].scored_from)
                .map(|(row, &(s, p))| {
                    let span = row * vocab..(row + 1) * vocab;
                    let next = group[s].tokens.get(p + 1).copied();
                    position(&want[span.clone()], &got[span], next)
                }),
        );
    }
    Ok(summarise(&positions))
}

/// Sequences grouped so that each pass holds at most [`TOKENS_PER_PASS`] tokens (a longer
/// sequence goes alone).
fn passes(sequences: &[Scored]) -> Vec<Vec<&Scored>> {
    let mut groups: Vec<Vec<&Scored>> = Vec::new();
    let mut tokens = 0;
    for s in sequences.iter().filter(|s| !s.tokens.is_empty()) {
        match groups.last_mut() {
            Some(group) if tokens + s.tokens.len() <= TOKENS_PER_PASS => {
                group.push(s);
                tokens += s.tokens.len();
            }
            _ => {
                groups.push(vec![s]);
                tokens = s.tokens.len();
            }
        }
    }
    groups
}

/// Log-probabilities of one row of logits, summed in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let log_sum = sum.ln() + max;
    logits.iter().map(|&v| v as f64 - log_sum).collect()
}

fn argmax(values: &[f64]) -> usize {
    values
        .iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

fn position(reference: &[f32], candidate: &[f32], next: Option<u32>) -> Position {
    let (p, q) = (log_softmax(reference), log_softmax(candidate));
    let kl: f64 = p
        .iter()
        .zip(&q)
        .map(|(&lp, &lq)| {
            if lp.is_finite() {
                lp.exp() * (lp - lq)
            } else {
                0.0
            }
        })
        .sum();
    Position {
        // Rounding can leave a divergence of identical rows a hair below zero.
        kl: kl.max(0.0),
        same_top1: argmax(&p) == argmax(&q),
        nll: next.map(|t| (-p[t as usize], -q[t as usize])),
    }
}

fn summarise(positions: &[Position]) -> Divergence {
    let n = positions.len();
    let mut kls: Vec<f64> = positions.iter().map(|p| p.kl).collect();
    kls.sort_by(f64::total_cmp);
    let percentile = |q: f64| {
        if kls.is_empty() {
            0.0
        } else {
            kls[((q * (n - 1) as f64).round() as usize).min(n - 1)]
        }
    };
    let nlls: Vec<(f64, f64)> = positions.iter().filter_map(|p| p.nll).collect();
    let perplexity = |pick: fn(&(f64, f64)) -> f64| {
        (nlls.iter().map(pick).sum::<f64>() / nlls.len().max(1) as f64).exp()
    };
    let diffs: Vec<f64> = nlls.iter().map(|(r, c)| c - r).collect();
    let log_ratio_se = crate::analysis::stats::Summary::of(&diffs)
        .map_or(f64::NAN, |s| s.sd / (s.n as f64).sqrt());
    Divergence {
        positions: n,
        predicted: nlls.len(),
        reference_perplexity: perplexity(|n| n.0),
        perplexity: perplexity(|n| n.1),
        log_ratio_se,
        mean_kl: kls.iter().sum::<f64>() / n.max(1) as f64,
        p99_kl: percentile(0.99),
        max_kl: kls.last().copied().unwrap_or(0.0),
        top1_agreement: positions.iter().filter(|p| p.same_top1).count() as f64 / n.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_rows_diverge_by_nothing() {
        let row = [1.0f32, 2.0, -3.0, 0.5];
        let p = position(&row, &row, Some(1));
        assert_eq!(p.kl, 0.0);
        assert!(p.same_top1);
        let (a, b) = p.nll.unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn divergence_is_the_textbook_sum() {
        // p = (0.5, 0.5), q = (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1).
        let p = [0.0f32, 0.0];
        let q = [(0.9f32).ln(), (0.1f32).ln()];
        let got = position(&p, &q, None).kl;
        let want = 0.5 * (0.5f64 / 0.9).ln() + 0.5 * (0.5f64 / 0.1).ln();
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }

    #[test]
    fn passes_hold_whole_sequences_within_the_token_budget() {
        let seq = |n: usize| Scored {
            tokens: vec![1; n],
            scored_from: 0,
        };
        let seqs = [seq(300), seq(200), seq(100), seq(900), seq(10)];
        let sizes: Vec<Vec<usize>> = passes(&seqs)
            .iter()
            .map(|g| g.iter().map(|s| s.tokens.len()).collect())
            .collect();
        assert_eq!(sizes, [vec![300, 200], vec![100], vec![900], vec![10]]);
    }
}
