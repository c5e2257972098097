//! A step's third move: a sampled token appended to its sequence, with what its grammar
//! forces, the sequence's stop strings and limits checked, and its text made ready to stream.

use super::logit_rules::TokenLogprob;
use super::metrics::EngineTotals;
use super::request::FinishReason;
use super::sequence::Sequence;
use super::tokenizer::Tokenizer;

/// Internal outcome of a finished sequence.
pub(super) enum Ending {
    Finished(FinishReason),
    Failed(String),
}

/// What postprocessing needs of the engine, borrowed apart from the scheduler's sequences.
pub(super) struct Postprocess<'a> {
    pub tokenizer: &'a Tokenizer,
    pub fast_forward: bool,
    pub max_context: usize,
}

impl Postprocess<'_> {
    /// Appends a generated token to `seq`, with the tokens its grammar then forces; says how
    /// the sequence ends, if it does.
    pub(super) fn advance(
        &self,
        seq: &mut Sequence,
        token: u32,
        totals: &mut EngineTotals,
    ) -> Option<Ending> {
        if let Some(c) = seq.constraint.as_mut()
            && let Err(e) = c.accept(token)
        {
            return Some(Ending::Failed(format!(
                "the grammar rejected a token it allowed: {e}"
            )));
        }
        totals.generated_tokens += 1;
        push_token(self.tokenizer, seq, token);
        let limit = seq.limit(self.max_context);
        if self.fast_forward
            && let Some(c) = seq.constraint.as_mut()
        {
            let forced = c.forced(limit.saturating_sub(seq.tokens.len()));
            totals.forced_tokens += forced.len() as u64;
            for t in forced {
                if seq.rules.logprobs.is_some() {
                    seq.logprobs.push(TokenLogprob::forced(t));
                }
                push_token(self.tokenizer, seq, t);
            }
        }
        // Forced tokens may overshoot the limit: the reply is cut at it, its text too (a
        // stop string or the grammar's end past the cut was never generated).
        let overshot = seq.tokens.len() > limit;
        if overshot {
            seq.tokens.truncate(limit);
            seq.text = self
                .tokenizer
                .decode(seq.generated(), true)
                .unwrap_or_default();
        }
        if let Some(at) = find_stop(&seq.text, &seq.stop) {
            seq.text.truncate(at);
            return Some(Ending::Finished(FinishReason::Stop));
        }
        if !overshot && seq.constraint.as_ref().is_some_and(|c| c.is_finished()) {
            return Some(Ending::Finished(FinishReason::Stop));
        }
        if seq.tokens.len() >= limit {
            return Some(Ending::Finished(FinishReason::Length));
        }
        None
    }
}

/// Appends `token` to `seq` and its text. The text is streamed later, by [`streamable`]:
/// tokens a grammar forces at submit come before any step, and a stop string may yet cut it.
pub(super) fn push_token(tokenizer: &Tokenizer, seq: &mut Sequence, token: u32) {
    seq.tokens.push(token);
    if let Ok(Some(delta)) = seq.detok.push(tokenizer, token) {
        seq.text.push_str(&delta);
    }
}

/// The text of running `seq` that can be streamed now, moving its cursor past it. The last
/// `longest stop - 1` bytes are held back: a stop string that a later token completes starts
/// in them at the earliest (one that ended before them was found already), so no byte of it
/// is ever streamed. Slicing a `String` keeps every character whole.
pub(super) fn streamable(seq: &mut Sequence) -> Option<String> {
    let longest = seq.stop.iter().map(String::len).max().unwrap_or(0);
    let mut safe = seq.text.len().saturating_sub(longest.saturating_sub(1));
    while !seq.text.is_char_boundary(safe) {
        safe -= 1;
    }
    if safe <= seq.streamed {
        return None;
    }
    let delta = seq.text[seq.streamed..safe].to_string();
    seq.streamed = safe;
    Some(delta)
}

/// Byte offset of the first stop string in `text`.
fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}
