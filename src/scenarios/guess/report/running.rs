//! Welford's running moments of guesses, merged across batches, and their interval cut at
//! the bounds a guess cannot leave.

use crate::analysis::stats::Summary;
use crate::scenarios::guess::rules;

/// Welford's running mean and variance.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Running {
    pub(super) n: usize,
    pub(super) mean: f64,
    m2: f64,
}

impl Running {
    pub(super) fn push(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Chan et al.'s parallel combination of two running moments.
    pub(super) fn merge(&mut self, other: &Running) {
        if other.n == 0 {
            return;
        }
        let n = self.n + other.n;
        let d = other.mean - self.mean;
        self.mean += d * other.n as f64 / n as f64;
        self.m2 += other.m2 + d * d * self.n as f64 * other.n as f64 / n as f64;
        self.n = n;
    }

    /// Student's t interval across agents (the moments are all a million agents leave),
    /// cut at the bounds a mean guess cannot leave: with few or skewed guesses the t interval
    /// would otherwise reach below 0 or above 100.
    pub(super) fn summary(&self) -> Option<Summary> {
        Summary::from_moments(self.n, self.mean, self.m2).map(within_guess_bounds)
    }
}

/// `s` with its interval cut at the guesses' bounds.
pub(super) fn within_guess_bounds(mut s: Summary) -> Summary {
    let top = rules::MAX_GUESS as f64 / rules::SCALE as f64;
    s.ci_low = s.ci_low.clamp(0.0, top);
    s.ci_high = s.ci_high.clamp(0.0, top);
    s
}
