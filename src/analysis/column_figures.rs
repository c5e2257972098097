//! The base report's figures of every numeric column: its mean per step with an interval over
//! replicates, and its distribution over agents at the last step.

use super::ReportError;
use super::format::slug;
use super::means::Mean;
use super::plot::{self, Band, HistogramPanel, Histograms, Lines};
use super::state::Table;
use std::collections::BTreeMap;
use std::path::Path;

/// Draws every column's figures under `dir/figures`; returns their names, from `dir`.
pub(super) fn draw(
    dir: &Path,
    table: &Table,
    means: &[Mean],
    columns: &[String],
    last_step: usize,
) -> Result<Vec<String>, ReportError> {
    let figures_dir = dir.join("figures");
    std::fs::create_dir_all(&figures_dir)?;
    let mut figures = Vec::new();
    for column in columns {
        figures.push(mean_figure(
            &figures_dir,
            means,
            column,
            &format!("mean_{}", slug(column)),
            &format!("{column}: mean per step, 95% interval over replicates"),
            last_step,
        )?);
        // The distribution over agents at the last step, one panel per arm.
        let mut panels = Vec::new();
        let values = &table
            .numbers
            .iter()
            .find(|(n, _)| n == column)
            .expect("a column")
            .1;
        let mut arms: Vec<(usize, &String)> = table.arm.labels.iter().enumerate().collect();
        arms.sort_by_key(|(_, label)| *label);
        for (code, arm) in arms {
            let xs: Vec<f64> = (0..table.arm.codes.len())
                .filter(|&r| {
                    table.arm.codes[r] as usize == code && table.step[r] as usize == last_step
                })
                .map(|r| values[r])
                .filter(|v| v.is_finite())
                .collect();
            if let Some(bins) = histogram(&xs) {
                panels.push(HistogramPanel {
                    title: arm.clone(),
                    bins,
                    mark: Some(xs.iter().sum::<f64>() / xs.len() as f64),
                });
            }
        }
        if !panels.is_empty() {
            let name = format!("distribution_{}", slug(column));
            plot::save(
                &Histograms {
                    title: format!("{column} at step {last_step}, over agents (line: mean)"),
                    x_label: column.clone(),
                    panels,
                },
                &figures_dir.join(&name),
            )?;
            figures.push(format!("figures/{name}"));
        }
    }
    Ok(figures)
}

/// The figure `name` (under `figures_dir`) of `column`'s means per step, a line per arm and
/// population with its interval over replicates; returns its name, from the run folder.
pub(super) fn mean_figure(
    figures_dir: &Path,
    means: &[Mean],
    column: &str,
    name: &str,
    title: &str,
    last_step: usize,
) -> Result<String, ReportError> {
    let mut series: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
    for m in means.iter().filter(|m| m.column == column && m.by == "all") {
        series
            .entry(format!("{} (n={})", m.arm, m.population))
            .or_default()
            .push((
                m.step as f64,
                m.mean,
                m.ci_low.unwrap_or(m.mean),
                m.ci_high.unwrap_or(m.mean),
            ));
    }
    plot::save(
        &Lines {
            title: title.to_string(),
            x_label: "step".into(),
            y_label: column.to_string(),
            series: series
                .into_iter()
                .map(|(name, points)| Band { name, points })
                .collect(),
            markers: last_step <= 12,
        },
        &figures_dir.join(name),
    )?;
    Ok(format!("figures/{name}"))
}

/// Up to 20 equal bins over the values' range, as shares.
fn histogram(xs: &[f64]) -> Option<Vec<(f64, f64, f64)>> {
    if xs.is_empty() {
        return None;
    }
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let bins = 20usize;
    let width = if hi > lo {
        (hi - lo) / bins as f64
    } else {
        1.0
    };
    let mut counts = vec![0usize; bins];
    for &x in xs {
        let i = (((x - lo) / width) as usize).min(bins - 1);
        counts[i] += 1;
    }
    Some(
        counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                (
                    lo + i as f64 * width,
                    lo + (i + 1) as f64 * width,
                    c as f64 / xs.len() as f64,
                )
            })
            .collect(),
    )
}
