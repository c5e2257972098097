//! Group levels in a report: their names, and how a level's groups differ in every column.

use super::format::number;
use super::html::{self, esc};
use crate::record::columns::{texts, wholes};
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde::Serialize;
use std::collections::BTreeMap;

/// The group levels of a run, innermost first, from its `groups.parquet` batches.
pub fn level_names(groups: &[RecordBatch]) -> Vec<String> {
    let mut names = Vec::new();
    for b in groups {
        if let Some(levels) = b
            .column_by_name("level")
            .and_then(|c| texts(c.as_ref(), "-"))
        {
            for l in levels {
                if !names.contains(&l) {
                    names.push(l);
                }
            }
        }
    }
    names
}

/// How the groups of one level differ at one step: the spread of their members' means of one
/// column, over every arm and replicate.
#[derive(Debug, Clone, Serialize)]
pub struct LevelSpread {
    pub level: String,
    pub column: String,
    pub step: usize,
    pub groups: usize,
    /// The mean of the groups' means.
    pub mean: f64,
    /// Their standard deviation between groups.
    pub sd: f64,
    pub lowest: f64,
    pub highest: f64,
}

/// Every level's spread of every numeric column at every step, from `groups.parquet` (empty
/// for a run without group levels).
pub fn level_spreads(groups: &[RecordBatch]) -> Vec<LevelSpread> {
    let mut per: BTreeMap<(usize, String, String), Vec<f64>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for b in groups {
        let (Some(level), Some(step)) = (
            b.column_by_name("level")
                .and_then(|c| texts(c.as_ref(), "-")),
            b.column_by_name("step").and_then(|c| wholes(c.as_ref())),
        ) else {
            continue;
        };
        for l in &level {
            if !order.contains(l) {
                order.push(l.clone());
            }
        }
        for (field, column) in b.schema().fields().iter().zip(b.columns()) {
            let Some(name) = field.name().strip_prefix("mean_") else {
                continue;
            };
            let Ok(c) = arrow_cast::cast(column, &DataType::Float64) else {
                continue;
            };
            let c = c.as_primitive::<Float64Type>();
            for r in 0..b.num_rows() {
                if c.is_valid(r) {
                    per.entry((step[r], level[r].clone(), name.to_string()))
                        .or_default()
                        .push(c.value(r));
                }
            }
        }
    }
    let mut spreads: Vec<LevelSpread> = per
        .into_iter()
        .map(|((step, level, column), xs)| {
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<f64>() / n;
            let sd =
                (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
            LevelSpread {
                level,
                column,
                step,
                groups: xs.len(),
                mean,
                sd,
                lowest: xs.iter().copied().fold(f64::INFINITY, f64::min),
                highest: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect();
    // Innermost level first, as the config lists them.
    spreads.sort_by_key(|s| {
        (
            s.step,
            order
                .iter()
                .position(|l| l == &s.level)
                .unwrap_or(usize::MAX),
        )
    });
    spreads
}

/// The levels' spreads at `step` as an HTML section (empty without levels).
pub(crate) fn level_spreads_html(spreads: &[LevelSpread], step: usize) -> String {
    let at: Vec<&LevelSpread> = spreads.iter().filter(|s| s.step == step).collect();
    if at.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "<h2>Group levels at step {step}</h2><p>Each group's mean over its members, then \
         across the level's groups (every arm and replicate): <code>groups.parquet</code> has \
         each group at each step.</p>"
    );
    out.push_str(&html::table(
        &[
            "level",
            "column",
            "groups",
            "mean",
            "sd between groups",
            "lowest",
            "highest",
        ],
        at.iter().map(|s| {
            vec![
                esc(&s.level),
                esc(&s.column),
                s.groups.to_string(),
                number(s.mean),
                number(s.sd),
                number(s.lowest),
                number(s.highest),
            ]
        }),
    ));
    out
}
