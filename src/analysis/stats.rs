//! Means with 95% confidence intervals, and Welch's t-test.

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// A sample's mean with its 95% confidence interval (Student's t).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub sd: f64,
    pub ci_low: f64,
    pub ci_high: f64,
}

impl Summary {
    /// `None` for an empty sample; a single value has a zero-width interval.
    pub fn of(values: &[f64]) -> Option<Self> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Some(Self {
                n,
                mean,
                sd: 0.0,
                ci_low: mean,
                ci_high: mean,
            });
        }
        let m2 = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>();
        Self::from_moments(n, mean, m2)
    }

    /// From a sample's size, mean and sum of squared deviations (Welford's `M2`).
    pub fn from_moments(n: usize, mean: f64, m2: f64) -> Option<Self> {
        if n == 0 {
            return None;
        }
        if n == 1 {
            return Some(Self {
                n,
                mean,
                sd: 0.0,
                ci_low: mean,
                ci_high: mean,
            });
        }
        let sd = (m2 / (n - 1) as f64).sqrt();
        let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
            .map(|d| d.inverse_cdf(0.975))
            .unwrap_or(1.96);
        let half = t * sd / (n as f64).sqrt();
        Some(Self {
            n,
            mean,
            sd,
            ci_low: mean - half,
            ci_high: mean + half,
        })
    }

    /// The 95% interval, or `None` for a sample too small to have one (n < 2).
    pub fn interval(&self) -> Option<(f64, f64)> {
        (self.n >= 2).then_some((self.ci_low, self.ci_high))
    }
}

/// Welch's unequal-variances t-test of two samples' means.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Welch {
    pub t: f64,
    pub df: f64,
    /// Two-sided.
    pub p: f64,
}

pub fn welch(a: &[f64], b: &[f64]) -> Option<Welch> {
    let (sa, sb) = (Summary::of(a)?, Summary::of(b)?);
    if sa.n < 2 || sb.n < 2 {
        return None;
    }
    let (va, vb) = (sa.sd.powi(2) / sa.n as f64, sb.sd.powi(2) / sb.n as f64);
    let se = (va + vb).sqrt();
    if se == 0.0 {
        return None;
    }
    let t = (sa.mean - sb.mean) / se;
    let df = (va + vb).powi(2) / (va.powi(2) / (sa.n - 1) as f64 + vb.powi(2) / (sb.n - 1) as f64);
    let p = StudentsT::new(0.0, 1.0, df)
        .map(|d| 2.0 * (1.0 - d.cdf(t.abs())))
        .ok()?;
    Some(Welch { t, df, p })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_interval_matches_a_textbook_example() {
        // n = 5, mean 3, sd 1.5811; t(0.975, 4) = 2.7764 -> half-width 1.9632.
        let s = Summary::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert!((s.mean - 3.0).abs() < 1e-12);
        assert!((s.ci_high - s.mean - 1.9632).abs() < 1e-3, "{s:?}");
    }

    #[test]
    fn welch_matches_scipy() {
        // scipy.stats.ttest_ind(a, b, equal_var=False): t = -3.4425, df = 6.5691, p = 0.011928
        let a = [19.1, 20.3, 21.0, 18.7, 20.0];
        let b = [22.1, 23.4, 20.9, 24.8, 21.7];
        let w = welch(&a, &b).unwrap();
        assert!((w.t + 3.4425).abs() < 1e-3, "{w:?}");
        assert!((w.df - 6.5691).abs() < 1e-3, "{w:?}");
        assert!((w.p - 0.011928).abs() < 1e-5, "{w:?}");
    }
}
