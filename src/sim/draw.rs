//! Drawing a cell's agents from a population's spec, by seed: exact quotas (share x N,
//! rounding repaired so that counts sum to N) or independent draws, joint tables first.

use super::groups::Groups;
use super::population::fmt_number;
use super::population::{Attribute, Column, Draw, NumericDistribution, Population, PopulationSpec};
use rand::distr::{Distribution, weighted::WeightedIndex};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use statrs::distribution::{ContinuousCDF, Normal};

/// Seed streams of a population draw: one per attribute or joint table, so that adding an
/// attribute leaves the others' draws as they were.
const ATTRIBUTE_STREAM: u64 = 1;
const JOINT_STREAM: u64 = 2;

impl PopulationSpec {
    pub fn is_empty(&self) -> bool {
        self.attributes.is_empty()
    }

    pub fn attribute(&self, name: &str) -> Option<&Attribute> {
        self.attributes.iter().find(|a| a.name() == name)
    }

    /// Draws `size` agents from `seed`.
    pub fn draw(&self, size: usize, seed: u64) -> Population {
        let rng_for = |stream: u64, i: usize| {
            ChaCha8Rng::seed_from_u64(crate::seed::derive(seed, &[stream, i as u64]))
        };
        let mut columns: Vec<Option<Column>> = vec![None; self.attributes.len()];
        for (j, joint) in self.joints.iter().enumerate() {
            let shares: Vec<f64> = joint.rows.iter().map(|(_, s)| *s).collect();
            let picks = draw_categorical(&shares, size, self.draw, &mut rng_for(JOINT_STREAM, j));
            for (k, &attr) in joint.attributes.iter().enumerate() {
                let Attribute::Categorical { categories, .. } = &self.attributes[attr] else {
                    unreachable!("joint tables hold categorical attributes");
                };
                columns[attr] = Some(Column::Categorical {
                    categories: categories.clone(),
                    codes: picks.iter().map(|&p| joint.rows[p as usize].0[k]).collect(),
                });
            }
        }
        for (i, attribute) in self.attributes.iter().enumerate() {
            if columns[i].is_some() {
                continue;
            }
            let mut rng = rng_for(ATTRIBUTE_STREAM, i);
            columns[i] = Some(match attribute {
                Attribute::Categorical {
                    categories, shares, ..
                } => Column::Categorical {
                    categories: categories.clone(),
                    codes: draw_categorical(shares, size, self.draw, &mut rng),
                },
                Attribute::Numeric {
                    low,
                    high,
                    distribution,
                    integer,
                    ..
                } => Column::Numeric {
                    integer: *integer,
                    values: draw_numeric(
                        *low,
                        *high,
                        *distribution,
                        *integer,
                        size,
                        self.draw,
                        &mut rng,
                    ),
                },
            });
        }
        let mut population = Population {
            size,
            columns: self
                .attributes
                .iter()
                .zip(columns)
                .map(|(a, c)| {
                    (
                        a.name().to_string(),
                        c.expect("invariant: every column drawn"),
                    )
                })
                .collect(),
            personas: None,
            groups: Groups::default(),
        };
        if !self.groups.is_empty() {
            population.groups = Groups::build(&self.groups, population.size, &population.columns);
        }
        population
    }
}

/// Exact counts for `n` agents from `shares` (fractions): floors, then one more to the
/// largest remainders (earlier categories first on ties), so that they sum to `n`.
pub fn quota_counts(shares: &[f64], n: usize) -> Vec<usize> {
    let exact: Vec<f64> = shares.iter().map(|s| s * n as f64).collect();
    let mut counts: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let assigned: usize = counts.iter().sum();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    // Stable sort: equal remainders keep declaration order.
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra)
    });
    for &i in order.iter().cycle().take(n.saturating_sub(assigned)) {
        counts[i] += 1;
    }
    counts
}

fn draw_categorical(shares: &[f64], n: usize, draw: Draw, rng: &mut ChaCha8Rng) -> Vec<u16> {
    match draw {
        Draw::Quota => {
            let mut codes: Vec<u16> = quota_counts(shares, n)
                .iter()
                .enumerate()
                .flat_map(|(c, &k)| std::iter::repeat_n(c as u16, k))
                .collect();
            codes.shuffle(rng);
            codes
        }
        Draw::Independent => {
            let dist = WeightedIndex::new(shares).expect("invariant: validated shares");
            (0..n).map(|_| dist.sample(rng) as u16).collect()
        }
    }
}

fn draw_numeric(
    low: f64,
    high: f64,
    distribution: NumericDistribution,
    integer: bool,
    n: usize,
    draw: Draw,
    rng: &mut ChaCha8Rng,
) -> Vec<f32> {
    // Through the inverse CDF, so that quota draws can be stratified: one uniform draw in
    // each of n equal-probability bands, then shuffled.
    let quantile: Box<dyn Fn(f64) -> f64> = match distribution {
        NumericDistribution::Uniform => Box::new(move |u| low + u * (high - low)),
        NumericDistribution::Normal { mean, sd } => {
            let normal = Normal::new(mean, sd).expect("invariant: validated sd > 0");
            let (a, b) = (normal.cdf(low), normal.cdf(high));
            Box::new(move |u| {
                if b - a <= f64::EPSILON {
                    return mean.clamp(low, high);
                }
                normal.inverse_cdf(a + u * (b - a)).clamp(low, high)
            })
        }
    };
    let mut values: Vec<f32> = (0..n)
        .map(|i| {
            let u: f64 = rng.random();
            let u = match draw {
                Draw::Quota => (i as f64 + u) / n as f64,
                Draw::Independent => u,
            };
            let x = quantile(u);
            let x = match (integer, distribution) {
                (false, _) => x,
                // Every whole number of the range equally likely: bins of equal width.
                (true, NumericDistribution::Uniform) => {
                    let (lo, hi) = (low.ceil(), high.floor());
                    (lo + (u * (hi - lo + 1.0)).floor()).clamp(lo, hi)
                }
                (true, NumericDistribution::Normal { .. }) => {
                    x.round().clamp(low.ceil(), high.floor())
                }
            };
            x as f32
        })
        .collect();
    if draw == Draw::Quota {
        values.shuffle(rng);
    }
    values
}

/// The band label of `x` for edges `bands` (`18-29`, `80+` for the top edge and above,
/// `<18` below the first).
pub(crate) fn band_label(x: f64, bands: &[f64]) -> String {
    let fmt = |v: f64| fmt_number(v);
    if x < bands[0] {
        return format!("<{}", fmt(bands[0]));
    }
    for w in bands.windows(2) {
        if x < w[1] {
            // Whole-number edges read as inclusive ranges of whole numbers.
            return if w[0].fract() == 0.0 && w[1].fract() == 0.0 {
                format!("{}-{}", fmt(w[0]), fmt(w[1] - 1.0))
            } else {
                format!("{}-{}", fmt(w[0]), fmt(w[1]))
            };
        }
    }
    format!("{}+", fmt(bands[bands.len() - 1]))
}
