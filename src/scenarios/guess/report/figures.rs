//! The game's figures: the mean guess and the target over rounds, the guesses of every
//! round, and round 1's mean guess by group.

use super::gather::Gathered;
use super::render::slug;
use super::summary::{GroupMean, RoundSummary};
use crate::analysis::plot::{
    Band, BarSeries, Bars, FigureFolder, HistogramPanel, Histograms, Lines, PlotError,
};
use std::path::Path;

/// Per population: the mean guess and the target over rounds (a band per arm), and each
/// arm's guesses of every round. Returns the figures' names, in the order they were drawn.
pub(super) fn rounds(
    dir: &Path,
    rounds: &[RoundSummary],
    gathered: &Gathered,
    arm_order: &[String],
) -> Result<Vec<String>, PlotError> {
    let mut folder = FigureFolder::into(dir);
    let populations: Vec<usize> = {
        let mut p: Vec<usize> = rounds.iter().map(|r| r.population).collect();
        p.dedup();
        p
    };
    for &population in &populations {
        let suffix = if populations.len() > 1 {
            format!("_{population}")
        } else {
            String::new()
        };
        // Convergence: the mean guess and the target over rounds, per arm.
        let mut series = Vec::new();
        let mut equilibria = Vec::new();
        for arm in arm_order {
            let of_arm: Vec<&RoundSummary> = rounds
                .iter()
                .filter(|r| &r.arm == arm && r.population == population)
                .collect();
            series.push(Band {
                name: format!("{arm}: mean"),
                points: of_arm
                    .iter()
                    .filter_map(|r| {
                        r.mean.map(|s| {
                            let (lo, hi) = s.interval().unwrap_or((s.mean, s.mean));
                            (r.round as f64, s.mean, lo, hi)
                        })
                    })
                    .collect(),
            });
            series.push(Band::line(
                format!("{arm}: target"),
                of_arm
                    .iter()
                    .filter_map(|r| r.target.map(|t| (r.round as f64, t))),
            ));
            if let Some(e) = of_arm.first().and_then(|r| r.equilibrium)
                && !equilibria.contains(&e)
            {
                equilibria.push(e);
            }
        }
        let last = rounds.iter().map(|r| r.round).max().unwrap_or(1) as f64;
        for e in &equilibria {
            series.push(Band::line(
                format!("equilibrium {e}"),
                [(1.0, *e), (last, *e)],
            ));
        }
        let fig = Lines {
            title: format!(
                "Mean guess and target over rounds ({population} players; 95% CI over games)"
            ),
            x_label: "round".into(),
            y_label: "number".into(),
            series,
            markers: true,
        };
        folder.save(&format!("fig_convergence{suffix}"), &fig)?;

        // The distribution of guesses, a panel per round, per arm.
        for (a, arm) in arm_order.iter().enumerate() {
            let panels: Vec<HistogramPanel> = gathered
                .histograms
                .iter()
                .filter(|((ar, p, _), _)| ar == arm && *p == population)
                .map(|((_, _, round), counts)| {
                    let total: u64 = counts.iter().sum();
                    let bins = counts
                        .iter()
                        .enumerate()
                        .map(|(b, &c)| {
                            (
                                b as f64 * 2.0,
                                b as f64 * 2.0 + 2.0,
                                c as f64 / total.max(1) as f64,
                            )
                        })
                        .collect();
                    let target = rounds
                        .iter()
                        .find(|r| &r.arm == arm && r.population == population && r.round == *round)
                        .and_then(|r| r.target);
                    HistogramPanel {
                        title: format!("round {round} (line: target)"),
                        bins,
                        mark: target,
                    }
                })
                .collect();
            if panels.is_empty() {
                continue;
            }
            let fig = Histograms {
                title: format!("Guesses per round: {arm}, {population} players"),
                x_label: "guess".into(),
                panels,
            };
            folder.save(&format!("fig_guesses_arm{a}{suffix}"), &fig)?;
        }
    }
    Ok(folder.names())
}

/// Round 1's mean guess by group, a figure per attribute (none for an attribute of more
/// than 40 groups). Returns the figures' names.
pub(super) fn groups(
    dir: &Path,
    gathered: &Gathered,
    groups: &[GroupMean],
    arm_order: &[String],
) -> Result<Vec<String>, PlotError> {
    let mut folder = FigureFolder::into(dir);
    for (attribute, order) in &gathered.attributes {
        let categories: Vec<String> = order
            .iter()
            .filter(|c| {
                groups
                    .iter()
                    .any(|g| &g.attribute == attribute && &g.group == *c)
            })
            .cloned()
            .collect();
        if categories.is_empty() || categories.len() > 40 {
            continue;
        }
        let series = arm_order
            .iter()
            .map(|arm| {
                let values = categories
                    .iter()
                    .map(|c| {
                        groups
                            .iter()
                            .find(|g| &g.arm == arm && &g.attribute == attribute && &g.group == c)
                            .and_then(|g| g.mean)
                            .map(|s| {
                                let (lo, hi) = s.interval().unwrap_or((s.mean, s.mean));
                                (s.mean, lo, hi)
                            })
                    })
                    .collect();
                BarSeries {
                    name: arm.clone(),
                    values,
                }
            })
            .collect();
        let fig = Bars {
            title: format!("Round 1: mean guess by {attribute} (95% CI across agents)"),
            y_label: "mean guess".into(),
            categories,
            series,
        };
        folder.save(&format!("fig_by_{}", slug(attribute)), &fig)?;
    }
    Ok(folder.names())
}
