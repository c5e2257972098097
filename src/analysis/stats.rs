//! Means with 95% confidence intervals, statistics of agents nested in independent
//! replicates, Welch's t-test and Holm's correction: what every scenario's report needs.
//!
//! Two intervals: Student's t for quantities without bounds (profits), and the bootstrap
//! percentile interval for quantities with bounds (prices, counts, shares, times), which
//! never leaves the range of the data and so never gives a price a negative bound.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// How an interval was computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Mean +/- t(0.975, n - 1) x sd / sqrt(n).
    #[default]
    StudentT,
    /// The 2.5th and 97.5th percentiles of the means of resamples drawn with replacement.
    BootstrapPercentile,
    /// Wilson's score interval of a share in [0, 1], at the effective number of observations
    /// the replicates' spread implies (see [`Summary::of_share`]).
    Wilson,
}

/// The values a column can take, as its values show: what interval its means get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bounds {
    /// Every value lies in [0, 1] (a yes/no column, a share): Wilson's interval.
    Share,
    /// Every value is at least 0 (a count, a price): Student's t, cut at 0.
    NonNegative,
    /// Values of either sign.
    Unbounded,
}

impl Bounds {
    /// The bounds of a column with these values (NaN, a missing value, is left out).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let (mut low, mut high) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.into_iter().filter(|v| !v.is_nan()) {
            low = low.min(v);
            high = high.max(v);
        }
        if low >= 0.0 && high <= 1.0 {
            Bounds::Share
        } else if low >= 0.0 {
            Bounds::NonNegative
        } else {
            Bounds::Unbounded
        }
    }
}

/// A sample's mean with its 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub sd: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub method: Method,
}

/// Resamples of a bootstrap interval: enough that the percentiles move by well under a
/// percent of the spread between reports, few enough for thousands of intervals per report.
const RESAMPLES: usize = 10_000;

impl Summary {
    /// Student's t interval. `None` for an empty sample; a single value has no interval
    /// ([`Summary::interval`] is `None`).
    pub fn of(values: &[f64]) -> Option<Self> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let m2 = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>();
        Self::from_moments(n, mean, m2)
    }

    /// From a sample's size, mean and sum of squared deviations (Welford's `M2`), with
    /// Student's t interval.
    pub(crate) fn from_moments(n: usize, mean: f64, m2: f64) -> Option<Self> {
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
                method: Method::StudentT,
            });
        }
        let sd = (m2 / (n - 1) as f64).sqrt();
        let half = t_quantile(n - 1) * sd / (n as f64).sqrt();
        Some(Self {
            n,
            mean,
            sd,
            ci_low: mean - half,
            ci_high: mean + half,
            method: Method::StudentT,
        })
    }

    /// The mean of a bounded quantity (a price, a count, a share, a time) with the bootstrap
    /// percentile interval, which lies within the sample's range and so respects any bound
    /// the quantity has. Resampling is seeded, so a report is the same every time.
    pub(crate) fn of_bounded(values: &[f64]) -> Option<Self> {
        let mut s = Self::of(values)?;
        s.method = Method::BootstrapPercentile;
        if let Some((lo, hi)) = bootstrap_mean_interval(values) {
            s.ci_low = lo;
            s.ci_high = hi;
        }
        Some(s)
    }

    /// The mean of replicate shares (each replicate's mean of values in [0, 1], such as a
    /// yes/no column) with Wilson's score interval, which never leaves [0, 1] where
    /// Student's t gave a 0/1 column [-0.38, 1.05].
    ///
    /// The replicate is the unit of independence, so the interval is Wilson's at the effective
    /// number of observations `n = p(1 - p) / se^2`, `se` the standard error of the mean over
    /// replicates (Kish's design effect), with Student's t quantile for the replicates: where
    /// the share is far from its bounds it matches Student's t. `n` is at most the
    /// `observations` (the agent values pooled): replicates that agree as much as independent
    /// agents would, or more, get the pooled agents' binomial interval (Wilson's at their
    /// count, the normal quantile), and so do replicates that agree exactly (`se` = 0): a
    /// share of 0 in every replicate still gets an upper bound above 0, and an interval never
    /// widens as replicates agree more (it did when `se` = 0 alone fell back to the pooled
    /// count at Student's quantile: 0.90 in three replicates of 20 agents got [0.632, 0.979],
    /// 0.90, 0.95, 0.90 got [0.816, 0.965]).
    pub(crate) fn of_share(values: &[f64], observations: usize) -> Option<Self> {
        let mut s = Self::of(values)?;
        s.method = Method::Wilson;
        if s.n < 2 {
            return Some(s);
        }
        let p = s.mean.clamp(0.0, 1.0);
        let se2 = s.sd.powi(2) / s.n as f64;
        let pooled = observations.max(s.n) as f64;
        let effective = match se2 > 0.0 {
            true => p * (1.0 - p) / se2,
            false => f64::INFINITY,
        };
        // The replicates' spread, estimated from few of them, sets the width (Student's t);
        // replicates that agree as much as independent agents would, or more, leave the
        // pooled agents' own binomial uncertainty (the normal quantile).
        let (n, z) = match effective < pooled {
            true => (effective, t_quantile(s.n - 1)),
            false => (pooled, NORMAL_95),
        };
        let (lo, hi) = wilson(p, n, z);
        s.ci_low = lo;
        s.ci_high = hi;
        Some(s)
    }

    /// `of` or `of_bounded`, as `method` says (Wilson's interval with the replicates as the
    /// observations).
    pub fn with(method: Method, values: &[f64]) -> Option<Self> {
        match method {
            Method::StudentT => Self::of(values),
            Method::BootstrapPercentile => Self::of_bounded(values),
            Method::Wilson => Self::of_share(values, values.len()),
        }
    }

    /// The 95% interval, or `None` for a sample too small to have one (n < 2).
    pub fn interval(&self) -> Option<(f64, f64)> {
        (self.n >= 2).then_some((self.ci_low, self.ci_high))
    }
}

/// Wilson's score interval of a share `p` over `n` observations at quantile `z`; within
/// [0, 1] whatever `p` and `n`.
fn wilson(p: f64, n: f64, z: f64) -> (f64, f64) {
    if n <= 0.0 || !n.is_finite() {
        return (p, p);
    }
    let z2n = z * z / n;
    let centre = (p + z2n / 2.0) / (1.0 + z2n);
    let half = z / (1.0 + z2n) * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt();
    // At a bound the interval starts exactly there (the formula's rounding says 1e-17).
    let low = if p <= 0.0 {
        0.0
    } else {
        (centre - half).max(0.0)
    };
    let high = if p >= 1.0 {
        1.0
    } else {
        (centre + half).min(1.0)
    };
    (low, high)
}

/// The normal distribution's 97.5th percentile.
const NORMAL_95: f64 = 1.959_963_984_540_054;

fn t_quantile(df: usize) -> f64 {
    StudentsT::new(0.0, 1.0, df as f64)
        .map(|d| d.inverse_cdf(0.975))
        .unwrap_or(1.96)
}

/// The 95% bootstrap percentile interval of the mean of `values` (`None` when n < 2).
pub(crate) fn bootstrap_mean_interval(values: &[f64]) -> Option<(f64, f64)> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    if values.iter().all(|&v| v == values[0]) {
        return Some((values[0], values[0]));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_b007);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..n).map(|_| values[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    Some((quantile(&means, 0.025), quantile(&means, 0.975)))
}

/// The `q` quantile of sorted `values`, interpolating between order statistics (the
/// definition R and numpy use by default).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    sorted[lo] + (h - h.floor()) * (sorted[hi] - sorted[lo])
}

/// Where pooled values lie: for description only, never for inference about a population
/// whose members are not independent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub n: usize,
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Self> {
        let s = Summary::of(values)?;
        Some(Self {
            n: s.n,
            mean: s.mean,
            sd: s.sd,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

/// A quantity measured on agents that live in independent replicates (markets, games).
/// Agents of one replicate influence each other, so the replicate is the unit of
/// independence: the interval is computed over replicate means, and the agents' values are
/// kept as descriptive spread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Nested {
    /// Over replicate means: n is the number of replicates with at least one agent.
    pub replicates: Option<Summary>,
    /// Over every agent's value, pooled.
    pub agents: Option<Spread>,
}

impl Nested {
    /// `groups` holds each replicate's agent values; empty groups (a replicate without such
    /// agents) are left out.
    pub fn of<G: AsRef<[f64]>>(groups: &[G], method: Method) -> Self {
        let means = replicate_means(groups);
        let pooled: Vec<f64> = groups
            .iter()
            .flat_map(|g| g.as_ref().iter().copied())
            .collect();
        Self {
            replicates: Summary::with(method, &means),
            agents: Spread::of(&pooled),
        }
    }
}

/// Each non-empty group's mean: what tests between replicate-level quantities compare.
pub(crate) fn replicate_means<G: AsRef<[f64]>>(groups: &[G]) -> Vec<f64> {
    groups
        .iter()
        .map(AsRef::as_ref)
        .filter(|g| !g.is_empty())
        .map(|g| g.iter().sum::<f64>() / g.len() as f64)
        .collect()
}

/// Welch's unequal-variances t-test of two samples' means.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Welch {
    pub t: f64,
    pub df: f64,
    /// Two-sided.
    pub p: f64,
}

/// `None` when either sample has fewer than two values, or neither varies.
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

/// Holm's step-down adjustment of a family of p-values, in their order: the smallest p is
/// multiplied by m, the next by m - 1, and so on, each kept at least as large as the one
/// before and at most 1. Controls the family-wise error rate under any dependence.
pub(crate) fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![0.0; m];
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
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
    fn a_single_value_has_no_interval() {
        assert_eq!(Summary::of(&[4.0]).unwrap().interval(), None);
        assert_eq!(Summary::of_bounded(&[4.0]).unwrap().interval(), None);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn a_bounded_quantity_never_gets_a_bound_outside_its_data() {
        // A step time with one slow step: Student's t dips below zero, the bootstrap cannot.
        let times = [0.5, 0.6, 0.4, 0.5, 0.7, 0.5, 0.6, 0.4, 0.5, 200.0];
        let t = Summary::of(&times).unwrap();
        assert!(t.ci_low < 0.0, "{t:?}");
        let b = Summary::of_bounded(&times).unwrap();
        let (lo, hi) = b.interval().unwrap();
        assert!(
            lo >= 0.4 && hi <= 200.0 && lo < b.mean && b.mean < hi,
            "{b:?}"
        );
        assert_eq!(b.method, Method::BootstrapPercentile);
        // Three values: 1 resample in 27 is all the smallest, more than 2.5%, so the interval
        // is the range.
        let b = Summary::of_bounded(&[10.0, 11.0, 15.0]).unwrap();
        assert_eq!(b.interval(), Some((10.0, 15.0)));
        // Seeded: the same data give the same interval.
        assert_eq!(Summary::of_bounded(&times), Summary::of_bounded(&times));
    }

    // Guards against issue 30, item 23: a 0/1 column's mean over three replicates got
    // Student's t interval [-0.38, 1.05], beyond what a share can be.
    #[test]
    fn a_share_gets_a_wilson_interval_within_zero_and_one() {
        let shares = [0.0, 1.0, 0.4];
        let t = Summary::of(&shares).unwrap();
        assert!(t.ci_low < 0.0 && t.ci_high > 1.0, "the premise: {t:?}");
        let w = Summary::of_share(&shares, 30).unwrap();
        let (lo, hi) = w.interval().unwrap();
        assert!(
            (0.0..w.mean).contains(&lo) && hi > w.mean && hi <= 1.0,
            "{w:?}"
        );
        assert_eq!((w.method, w.mean), (Method::Wilson, t.mean));
        // Away from the bounds, with many replicates, it is Student's t.
        let middle: Vec<f64> = (0..200)
            .map(|i| 0.4 + 0.2 * ((i % 7) as f64 / 6.0))
            .collect();
        // (200 replicates of 200 agents: their spread is the agents' own, as independent
        // agents' would be.)
        let (t, w) = (
            Summary::of(&middle).unwrap(),
            Summary::of_share(&middle, 40_000).unwrap(),
        );
        assert!((t.ci_low - w.ci_low).abs() < 1e-3 && (t.ci_high - w.ci_high).abs() < 1e-3);
        // No agent said yes in any replicate: still an upper bound, from the agents counted.
        let none = Summary::of_share(&[0.0, 0.0, 0.0], 60).unwrap();
        let (lo, hi) = none.interval().unwrap();
        let z2 = NORMAL_95.powi(2);
        assert!(
            lo == 0.0 && (hi - z2 / (60.0 + z2)).abs() < 1e-12,
            "{none:?}"
        );
        // Wilson's own numbers: 3 of 10 at z = 1.96 is [0.1078, 0.6032].
        let (lo, hi) = wilson(0.3, 10.0, 1.96);
        assert!(
            (lo - 0.1078).abs() < 1e-4 && (hi - 0.6032).abs() < 1e-4,
            "{lo} {hi}"
        );
    }

    // Guards against issue 42, item 3: identical replicates (0.90, 0.90, 0.90) got
    // [0.632, 0.979], wider than (0.90, 0.95, 0.90) at [0.816, 0.965].
    #[test]
    fn a_shares_interval_never_widens_as_replicates_agree_more() {
        let width = |values: &[f64]| {
            let s = Summary::of_share(values, 60).unwrap();
            s.ci_high - s.ci_low
        };
        let same = width(&[0.9, 0.9, 0.9]);
        // The two: identical replicates now get the pooled agents' interval.
        let s = Summary::of_share(&[0.9, 0.9, 0.9], 60).unwrap();
        assert!(
            (s.ci_low - 0.798).abs() < 1e-3 && (s.ci_high - 0.953).abs() < 1e-3,
            "{s:?}"
        );
        assert!(same <= width(&[0.85, 0.95, 0.9]) + 1e-12);
        // The same mean, replicates drawing together: the interval narrows or stays.
        let mut last = f64::INFINITY;
        for spread in [0.09, 0.05, 0.02, 0.01, 0.001, 0.0] {
            let w = width(&[0.9 - spread, 0.9, 0.9 + spread]);
            assert!(w <= last + 1e-12, "spread {spread}: {w} after {last}");
            last = w;
        }
        assert!((last - same).abs() < 1e-12);
    }

    #[test]
    fn bounds_follow_the_values() {
        assert_eq!(Bounds::of([0.0, 1.0, f64::NAN, 1.0]), Bounds::Share);
        assert_eq!(Bounds::of([0.25, 0.5]), Bounds::Share);
        assert_eq!(Bounds::of([0.0, 3.0]), Bounds::NonNegative);
        assert_eq!(Bounds::of([-1.0, 3.0]), Bounds::Unbounded);
    }

    #[test]
    fn nested_intervals_come_from_replicate_means() {
        // Three replicates with 3, 1 and 2 agents: means 2, 10, 5 (mean 17/3, sd 4.0415);
        // t(0.975, 2) = 4.302653 -> half-width 10.039523. Pooled over 6 agents it would be
        // far narrower, as if the agents were independent.
        let groups = vec![vec![1.0, 2.0, 3.0], vec![10.0], vec![4.0, 6.0], vec![]];
        let n = Nested::of(&groups, Method::StudentT);
        let r = n.replicates.unwrap();
        assert_eq!(r.n, 3);
        assert!((r.mean - 17.0 / 3.0).abs() < 1e-12);
        assert!((r.sd - 4.041452).abs() < 1e-6, "{r:?}");
        assert!((r.ci_high - r.mean - 10.039523).abs() < 1e-5, "{r:?}");
        let a = n.agents.unwrap();
        assert_eq!((a.n, a.min, a.max), (6, 1.0, 10.0));
        assert_eq!(replicate_means(&groups), vec![2.0, 10.0, 5.0]);
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

    #[test]
    fn holm_matches_a_hand_computation() {
        // Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised
        // to 0.06 so that adjusted p-values keep the order of the raw ones.
        let adjusted = holm(&[0.01, 0.04, 0.03, 0.005]);
        let expected = [0.03, 0.06, 0.06, 0.02];
        for (a, e) in adjusted.iter().zip(expected) {
            assert!((a - e).abs() < 1e-12, "{adjusted:?}");
        }
        assert_eq!(holm(&[0.6, 0.5]), vec![1.0, 1.0]);
        assert!(holm(&[]).is_empty());
    }
}
