//! The next token of every sequence that samples this step, picked from the step's logits:
//! on the host (the CPU path, or on request on a GPU), or on the device (GPUs), where the
//! logits stay and only one token id per row comes back.

use super::constraint::{GrammarError, apply_mask};
use super::logit_rules::TokenLogprob;
use super::sequence::Sequence;
use crate::model::ModelError;
use candle_core::Tensor;
use rayon::prelude::*;
use std::time::{Duration, Instant};
use toktrie::SimpleVob;

/// A sequence's grammar mask for this step, or why it could not be computed.
pub(crate) type Mask = Result<SimpleVob, GrammarError>;

/// Where the tokens are picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PickOn {
    /// Logits are copied to the host and sampled there, every row on its own thread.
    Host,
    /// Masks and draws go to the device; the kernel in kernels/sampling.cu picks the tokens.
    Device,
}

/// What [`pick`] found, per running sequence.
pub(crate) struct Picked {
    /// The token, or why there is none; `None` for sequences that do not sample this step.
    pub tokens: Vec<Option<Result<u32, NoToken>>>,
    /// Applying masks and sampling (on the device: uploading, launching and waiting for it).
    pub sampling: Duration,
    /// Copies between host and device: logits down (host), or masks and draws up and token
    /// ids down (device; the wait for the device counts as sampling only when `profile`
    /// synchronises before the download).
    pub copies: Duration,
}

/// Why no token could be picked for a row: the request fails with it, the others go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoToken {
    #[error("the grammar failed: {0}")]
    GrammarFailed(GrammarError),
    #[error("the grammar allowed no token (the schema may be unsatisfiable)")]
    GrammarAllowedNone,
    /// NaN or infinite logits, which only broken weights or an overflow make (a request
    /// without a schema was once told that its grammar had allowed no token).
    #[error(
        "the model gave no finite logit (NaN or infinity) to any token it could pick: its \
         weights or its computation are broken; check the model file (download it again), or \
         try another --weights format (f16 overflows where bf16 and f32 do not)"
    )]
    NoFiniteLogit,
}

/// Why no token could be picked for a row under `mask` (its grammar's, if it has one).
fn no_token(mask: Option<&SimpleVob>) -> NoToken {
    match mask {
        Some(mask) if mask.is_zero() => NoToken::GrammarAllowedNone,
        _ => NoToken::NoFiniteLogit,
    }
}

/// Picks a token for every running sequence `i` with `row_of[i] = Some(r)`, from row `r` of
/// `logits` `(rows, vocab)`, under its mask `masks[i]`.
pub(crate) fn pick(
    logits: Tensor,
    row_of: &[Option<usize>],
    running: &mut [Sequence],
    masks: &[Option<Mask>],
    on: PickOn,
    profile: bool,
) -> Result<Picked, ModelError> {
    match on {
        PickOn::Host => pick_on_host(logits, row_of, running, masks),
        PickOn::Device => pick_on_device(logits, row_of, running, masks, profile),
    }
}

fn pick_on_host(
    logits: Tensor,
    row_of: &[Option<usize>],
    running: &mut [Sequence],
    masks: &[Option<Mask>],
) -> Result<Picked, ModelError> {
    let start = Instant::now();
    let mut rows: Vec<Option<Vec<f32>>> = logits.to_vec2::<f32>()?.into_iter().map(Some).collect();
    let copies = start.elapsed();
    let start = Instant::now();
    let mut row_of_seq: Vec<Option<Vec<f32>>> = row_of
        .iter()
        .map(|r| r.and_then(|r| rows[r].take()))
        .collect();
    let tokens = running
        .par_iter_mut()
        .zip(row_of_seq.par_iter_mut())
        .zip(masks.par_iter())
        .map(|((seq, row), mask)| {
            let row = row.as_mut()?;
            if seq.rules.changes_logits() {
                seq.rules.apply(row, seq.generated());
            }
            let mask = match mask {
                Some(Err(e)) => return Some(Err(NoToken::GrammarFailed(e.clone()))),
                Some(Ok(mask)) => {
                    apply_mask(row, mask);
                    Some(mask)
                }
                None => None,
            };
            let token = seq.sampler.sample(row).ok_or_else(|| no_token(mask));
            if let (Ok(token), Some(top)) = (&token, seq.rules.logprobs) {
                seq.logprobs.push(TokenLogprob::of(row, *token, top));
            }
            Some(token)
        })
        .collect();
    Ok(Picked {
        tokens,
        sampling: start.elapsed(),
        copies,
    })
}

#[cfg(not(feature = "cuda"))]
fn pick_on_device(
    logits: Tensor,
    row_of: &[Option<usize>],
    running: &mut [Sequence],
    masks: &[Option<Mask>],
    _profile: bool,
) -> Result<Picked, ModelError> {
    // Without CUDA every device is the host's.
    pick_on_host(logits, row_of, running, masks)
}

#[cfg(feature = "cuda")]
fn pick_on_device(
    logits: Tensor,
    row_of: &[Option<usize>],
    running: &mut [Sequence],
    masks: &[Option<Mask>],
    profile: bool,
) -> Result<Picked, ModelError> {
    use super::device_sampling::{DeviceRow, sample_on_device};
    let start = Instant::now();
    let num_rows = row_of.iter().flatten().count();
    // (running index, row) in logits order.
    let mut order: Vec<(usize, usize)> = row_of
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|r| (i, r)))
        .collect();
    order.sort_by_key(|&(_, r)| r);
    debug_assert!(order.iter().enumerate().all(|(k, &(_, r))| k == r));
    let mut rows = Vec::with_capacity(num_rows);
    for &(i, _) in &order {
        let seq = &mut running[i];
        let params = *seq.sampler.params();
        let uniform = if params.is_greedy() {
            0.0
        } else {
            seq.sampler.draw()
        };
        // A row whose grammar failed is still sampled (unmasked) to keep the rows aligned;
        // its result is discarded below.
        let mask = match &masks[i] {
            Some(Ok(mask)) => Some(mask),
            _ => None,
        };
        rows.push(DeviceRow {
            mask,
            params,
            uniform,
        });
    }
    let (ids, copies) = sample_on_device(&logits, &rows, profile)
        .map_err(|e| ModelError::during("sampling on the device", e))?;
    let mut tokens: Vec<Option<Result<u32, NoToken>>> = vec![None; running.len()];
    for (&(i, _), id) in order.iter().zip(ids) {
        tokens[i] = Some(match &masks[i] {
            Some(Err(e)) => Err(NoToken::GrammarFailed(e.clone())),
            Some(Ok(mask)) => id.ok_or_else(|| no_token(Some(mask))),
            None => id.ok_or_else(|| no_token(None)),
        });
    }
    Ok(Picked {
        tokens,
        sampling: start.elapsed().saturating_sub(copies),
        copies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::{Sampler, SamplingParams};
    use candle_core::Device;

    fn sequences(n: usize) -> Vec<Sequence> {
        (0..n)
            .map(|i| {
                Sequence::new(
                    i as u64,
                    vec![1, 2],
                    Sampler::new(SamplingParams::greedy()),
                    8,
                )
            })
            .collect()
    }

    // Guards against issue 30, item 21: NaN logits of a request with no schema were blamed on
    // "the grammar", which it did not have.
    #[test]
    fn nan_logits_are_blamed_on_the_model_and_an_empty_mask_on_the_grammar() {
        let vocab = 40;
        let logits = Tensor::from_vec(
            [
                vec![f32::NAN; vocab],
                vec![f32::NAN; vocab],
                vec![0.5; vocab],
            ]
            .concat(),
            (3, vocab),
            &Device::Cpu,
        )
        .unwrap();
        let mut running = sequences(3);
        let masks = vec![
            None,
            Some(Ok(SimpleVob::alloc_ones(vocab))),
            Some(Ok(SimpleVob::alloc(vocab))),
        ];
        let picked = pick(
            logits,
            &[Some(0), Some(1), Some(2)],
            &mut running,
            &masks,
            PickOn::Host,
            false,
        )
        .unwrap();
        let errors: Vec<String> = picked
            .tokens
            .into_iter()
            .map(|t| t.unwrap().unwrap_err().to_string())
            .collect();
        for e in &errors[..2] {
            assert!(
                e.contains("no finite logit") && !e.contains("grammar"),
                "{e}"
            );
        }
        assert!(
            errors[2].contains("the grammar allowed no token"),
            "{}",
            errors[2]
        );
    }
}
