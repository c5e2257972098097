//! Choosing the next token from logits: greedy, or temperature with top-k and top-p, driven
//! by a per-request seeded RNG so that the same request and seed give the same tokens.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How a request's tokens are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy (argmax), as does anything below [`GREEDY_BELOW`].
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Seeds the request's own RNG (ChaCha8): draws never depend on other requests.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        }
    }
}

/// Temperatures below this decode greedily. Logits are divided by the temperature, and below
/// about 3e-39 that overflows to infinity (and infinity minus infinity is NaN), so a draw at
/// 1e-45 picked garbage. Well before that a draw is greedy in all but name: two logits that
/// differ by 1e-18 or more (any two distinct f32 logits of magnitude above 1e-11 do) differ by
/// 100 or more once divided by 1e-20, and `exp(-100)` is negligible beside the top token's 1.
/// The cut keeps `logit / temperature` finite for every logit below 3e18, on the host and in
/// the device sampler alike.
pub const GREEDY_BELOW: f32 = 1e-20;

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW || self.top_k == Some(1)
    }

    /// Describes why these settings are unusable, if they are.
    pub fn problem(&self) -> Option<String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Some(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Some(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.top_k == Some(0) {
            return Some("top_k must be at least 1".into());
        }
        None
    }
}

/// A sequence's sampler: its parameters and its RNG.
#[derive(Debug, Clone)]
pub(crate) struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
        }
    }

    // This and `draw` serve the device sampler, which only the `cuda` build has.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next uniform draw in `[0, 1)` of this sequence's RNG, for a sampler that runs
    /// elsewhere (on the device); [`Sampler::sample`] takes exactly one per non-greedy token.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn draw(&mut self) -> f32 {
        self.rng.random::<f32>()
    }

    /// Picks a token. Disallowed tokens carry `-inf` logits (a grammar mask); `None` when
    /// every token is disallowed.
    pub fn sample(&mut self, logits: &[f32]) -> Option<u32> {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.params.temperature;
        let mut candidates: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l * inv_t))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        // Most likely first; equal logits in id order, so the order never depends on the sort.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if let Some(k) = self.params.top_k
            && k < candidates.len()
        {
            candidates.select_nth_unstable_by(k - 1, by_logit);
            candidates.truncate(k);
        }
        candidates.sort_unstable_by(by_logit);
        let max = candidates[0].1;
        let mut probs: Vec<f32> = candidates.iter().map(|(_, l)| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.params.top_p < 1.0 {
            let mut cumulative = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    cumulative += p;
                    cumulative >= self.params.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut draw = self.rng.random::<f32>() * total;
        for (i, p) in probs.iter().enumerate() {
            draw -= p;
            if draw < 0.0 {
                return Some(candidates[i].0);
            }
        }
        Some(candidates[probs.len() - 1].0)
    }
}

/// Index of the largest finite logit, the lowest index among equals.
pub(crate) fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: Option<usize>, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        }
    }

    #[test]
    fn greedy_takes_the_argmax_and_respects_masks() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 2.0]), Some(1));
        assert_eq!(s.sample(&[0.1, f32::NEG_INFINITY, 2.0]), Some(2));
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut s = Sampler::new(params(1.0, None, 1.0, seed));
            (0..30)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(5), draw(5));
        assert_ne!(draw(5), draw(6));
    }

    #[test]
    fn top_k_and_top_p_only_draw_from_the_head() {
        let logits = [5.0, 4.9, 0.0, -1.0, -2.0];
        let mut k = Sampler::new(params(1.0, Some(2), 1.0, 1));
        let mut p = Sampler::new(params(1.0, None, 0.9, 1));
        for _ in 0..200 {
            assert!(k.sample(&logits).unwrap() < 2);
            assert!(p.sample(&logits).unwrap() < 2);
        }
    }

    #[test]
    fn a_vanishing_temperature_is_greedy_not_garbage() {
        // 37 is invertible mod 101: every logit differs, so the top token is unique.
        let logits: Vec<f32> = (0..101)
            .map(|i| ((i * 37 % 101) as f32) * 0.3 - 12.0)
            .collect();
        let best = argmax(&logits);
        for t in [1e-45, 1e-40, 1e-38, 1e-30, 1e-21] {
            let mut s = Sampler::new(params(t, None, 1.0, 9));
            for _ in 0..20 {
                assert_eq!(s.sample(&logits), best, "temperature {t}");
            }
        }
        // Just above the cut, sampling proper still picks the top token.
        let mut s = Sampler::new(params(1e-19, None, 1.0, 9));
        assert_eq!(s.sample(&logits), best);
    }

    #[test]
    fn high_temperature_spreads_draws() {
        let logits = [1.0, 0.5, 0.0];
        let mut s = Sampler::new(params(5.0, None, 1.0, 3));
        let mut seen = [false; 3];
        for _ in 0..300 {
            seen[s.sample(&logits).unwrap() as usize] = true;
        }
        assert!(seen.iter().all(|&x| x));
    }
}
