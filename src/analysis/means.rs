//! Every numeric column's mean per step, over the replicates' means, by arm and population
//! and broken down by role, policy, attribute and group level.

use super::format::interval_text;
use super::html::{self, esc};
use super::state::Table;
use super::stats::{Bounds, Summary};
use serde::Serialize;
use std::collections::BTreeMap;

/// One mean at one step: over the replicates' means of the agents in the slice.
#[derive(Debug, Clone, Serialize)]
pub struct Mean {
    pub arm: String,
    pub population: usize,
    /// What the agents are broken down by (`all`, `role`, an attribute, `policy`).
    pub by: String,
    /// The value of `by` (`all` for the whole cell).
    pub value: String,
    pub step: usize,
    pub column: String,
    pub replicates: usize,
    pub mean: f64,
    /// The 95% interval over replicates; none with a single replicate.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// The replicates' means it is the mean of: what a test between arms compares.
    #[serde(skip)]
    pub per_replicate: Vec<f64>,
}

impl Mean {
    /// `mean [low, high]`, or `mean (1 replicate: no interval)`.
    pub(super) fn shown(&self) -> String {
        interval_text(self.mean, self.ci_low.zip(self.ci_high), self.replicates)
    }

    /// Its line of a terminal summary: `  arm n=N [value ]column: mean [low, high]`, with
    /// the breakdown's `value` where it says which part of the agents it is.
    pub(super) fn line(&self, with_value: bool) -> String {
        let value = match with_value {
            true => format!("{} ", self.value),
            false => String::new(),
        };
        format!(
            "  {} n={} {value}{}: {}",
            self.arm,
            self.population,
            self.column,
            self.shown()
        )
    }
}

/// A page's table of `means`: arm, agents, column, replicates, mean and interval.
pub(super) fn table_html<'a>(means: impl Iterator<Item = &'a Mean>) -> String {
    html::table(
        &[
            "arm",
            "agents",
            "column",
            "replicates",
            "mean [95% interval]",
        ],
        means.map(|m| {
            vec![
                esc(&m.arm),
                m.population.to_string(),
                esc(&m.column),
                m.replicates.to_string(),
                m.shown(),
            ]
        }),
    )
}

/// Means per (arm, population, breakdown, value, step, column), each over its replicates,
/// with an interval that keeps to what the column's values can be (see [`interval_of`]);
/// and the columns whose Student's t intervals were cut at 0.
pub(super) fn means(t: &Table) -> (Vec<Mean>, Vec<String>) {
    let bounds: Vec<Bounds> = t
        .numbers
        .iter()
        .map(|(_, values)| Bounds::of(values.iter().copied()))
        .collect();
    let mut cut = std::collections::BTreeSet::new();
    // (arm, population, breakdown, value, step, column) -> replicate -> (sum, count), all as
    // codes: the rows of a million agents build no string.
    type Key = (u32, u32, u32, u32, u32, u32);
    let mut acc: BTreeMap<Key, BTreeMap<u32, (f64, usize)>> = BTreeMap::new();
    for row in 0..t.arm.codes.len() {
        // Breakdown 0 is the whole cell.
        let labels = std::iter::once(0).chain(t.by.iter().map(|(_, c)| c.codes[row]));
        for (b, value) in labels.enumerate() {
            for (c, (_, values)) in t.numbers.iter().enumerate() {
                let v = values[row];
                if v.is_nan() {
                    continue;
                }
                let e = acc
                    .entry((
                        t.arm.codes[row],
                        t.population[row],
                        b as u32,
                        value,
                        t.step[row],
                        c as u32,
                    ))
                    .or_default()
                    .entry(t.replicate[row])
                    .or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
    }
    let mut means: Vec<Mean> = acc
        .into_iter()
        .filter_map(|((arm, population, b, value, step, c), reps)| {
            let per: Vec<f64> = reps.values().map(|(s, n)| s / *n as f64).collect();
            let observations = reps.values().map(|(_, n)| n).sum();
            let (s, clipped) = interval_of(bounds[c as usize], &per, observations)?;
            if clipped {
                cut.insert(c);
            }
            let (ci_low, ci_high) = s.interval().unzip();
            let (by, value) = match b {
                0 => ("all".to_string(), "all".to_string()),
                b => {
                    let (name, coded) = &t.by[b as usize - 1];
                    (name.clone(), coded.labels[value as usize].clone())
                }
            };
            Some(Mean {
                arm: t.arm.labels[arm as usize].clone(),
                population: population as usize,
                by,
                value,
                step: step as usize,
                column: t.numbers[c as usize].0.clone(),
                replicates: per.len(),
                mean: s.mean,
                ci_low,
                ci_high,
                per_replicate: per,
            })
        })
        .collect();
    // In the order a reader scans them: arm, size, breakdown and value by name, step, column.
    means.sort_by(|a, b| {
        (&a.arm, a.population, &a.by, &a.value, a.step).cmp(&(
            &b.arm,
            b.population,
            &b.by,
            &b.value,
            b.step,
        ))
    });
    let cut = cut
        .into_iter()
        .map(|c| t.numbers[c as usize].0.clone())
        .collect();
    (means, cut)
}

/// The mean of replicate means `per` (over `observations` agent values in all) with its 95%
/// interval, as the column's `bounds` allow: Wilson's for a share, which stays in [0, 1];
/// Student's t cut at 0 for a column that is never negative (with `true` when it was cut);
/// Student's t otherwise.
fn interval_of(bounds: Bounds, per: &[f64], observations: usize) -> Option<(Summary, bool)> {
    match bounds {
        Bounds::Share => Summary::of_share(per, observations).map(|s| (s, false)),
        Bounds::NonNegative => {
            let mut s = Summary::of(per)?;
            let cut = s.n >= 2 && s.ci_low < 0.0;
            s.ci_low = s.ci_low.max(0.0);
            Some((s, cut))
        }
        Bounds::Unbounded => Summary::of(per).map(|s| (s, false)),
    }
}
