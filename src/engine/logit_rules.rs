//! What a request asks of its logits beyond sampling: a bias on chosen tokens, penalties on
//! tokens it already generated (OpenAI's `logit_bias`, `frequency_penalty`,
//! `presence_penalty`), and the log-probabilities of what it was given (`logprobs`). Each
//! reads only its own sequence's row and tokens, so a reply never depends on its batch.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The most alternatives a token's log-probability comes with (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A request's rules for its logits; the default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogitRules {
    /// Added to a token's logit before the grammar's mask and sampling, by token id.
    pub bias: Vec<(u32, f32)>,
    /// Subtracted from a token's logit once per time the reply already holds it.
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit if the reply already holds it at all.
    pub presence_penalty: f32,
    /// Report each token's log-probability with this many of the likeliest alternatives
    /// (`None`: report none).
    pub logprobs: Option<usize>,
}

impl LogitRules {
    /// Whether these rules change the logits (the log-probabilities only read them).
    pub fn changes_logits(&self) -> bool {
        !self.bias.is_empty() || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// Whether anything is asked of the logits at all.
    pub fn is_neutral(&self) -> bool {
        !self.changes_logits() && self.logprobs.is_none()
    }

    /// Describes why these rules are unusable, if they are.
    pub fn problem(&self, vocab: usize) -> Option<String> {
        for (name, p) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&p) {
                return Some(format!("{name} must be between -2 and 2, got {p}"));
            }
        }
        if let Some(&(token, bias)) = self
            .bias
            .iter()
            .find(|(t, b)| *t as usize >= vocab || !(-100.0..=100.0).contains(b))
        {
            return Some(format!(
                "logit_bias: token {token} with bias {bias}: token ids are below the vocabulary's \
                 {vocab} and biases between -100 and 100"
            ));
        }
        if self.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Some(format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"));
        }
        None
    }

    /// Applies the bias and the penalties to `row`, the logits of the next token of a reply
    /// that so far holds `generated`.
    pub(crate) fn apply(&self, row: &mut [f32], generated: &[u32]) {
        for &(token, bias) in &self.bias {
            if let Some(l) = row.get_mut(token as usize) {
                *l += bias;
            }
        }
        if self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(l) = row.get_mut(t as usize) {
                    *l -= self.frequency_penalty * n as f32 + self.presence_penalty;
                }
            }
        }
    }
}

/// A generated token's log-probability and its likeliest alternatives, under the
/// distribution it was drawn from: the model's, with the bias and penalties applied and the
/// grammar's mask (renormalised over the tokens it allows), before temperature, top-k and
/// top-p. A token the grammar forced had no alternative: its log-probability is 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The likeliest tokens, most likely first (ties in id order).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// `token`'s entry from `row`, the masked logits it was drawn from (disallowed tokens at
    /// `-inf`), with `top` alternatives.
    pub(crate) fn of(row: &[f32], token: u32, top: usize) -> Self {
        let max = row
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let log_total = max
            + row
                .iter()
                .filter(|l| l.is_finite())
                .map(|l| ((l - max) as f64).exp())
                .sum::<f64>()
                .ln() as f32;
        let logprob = |t: u32| {
            row.get(t as usize)
                .filter(|l| l.is_finite())
                .map_or(f32::NEG_INFINITY, |l| l - log_total)
        };
        let mut ids: Vec<u32> = (0..row.len() as u32)
            .filter(|&t| row[t as usize].is_finite())
            .collect();
        let by_logit =
            |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        if top < ids.len() && top > 0 {
            ids.select_nth_unstable_by(top - 1, by_logit);
        }
        ids.truncate(top);
        ids.sort_unstable_by(by_logit);
        Self {
            token,
            logprob: logprob(token),
            top: ids.into_iter().map(|t| (t, logprob(t))).collect(),
        }
    }

    /// A token the grammar forced: certain.
    pub(crate) fn forced(token: u32) -> Self {
        Self {
            token,
            logprob: 0.0,
            top: vec![(token, 0.0)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_count_the_replys_own_tokens_and_bias_adds() {
        let rules = LogitRules {
            bias: vec![(0, 5.0)],
            frequency_penalty: 1.0,
            presence_penalty: 0.5,
            logprobs: None,
        };
        let mut row = vec![0.0; 4];
        rules.apply(&mut row, &[2, 2, 3]);
        assert_eq!(row, vec![5.0, 0.0, -2.5, -1.5]);
        assert!(LogitRules::default().is_neutral());
        assert!(rules.problem(4).is_none());
        assert!(rules.problem(0).unwrap().contains("logit_bias"));
    }

    #[test]
    fn logprobs_are_normalised_over_the_allowed_tokens() {
        let row = [2.0f32.ln(), f32::NEG_INFINITY, 1.0f32.ln(), 1.0f32.ln()];
        let e = TokenLogprob::of(&row, 2, 2);
        assert!((e.logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(e.top.len(), 2);
        assert_eq!(e.top[0].0, 0);
        assert!((e.top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        // Ties in id order.
        assert_eq!(e.top[1].0, 2);
        assert_eq!(TokenLogprob::of(&row, 1, 0).logprob, f32::NEG_INFINITY);
    }
}
