//! The report's statistics, per arm and population: each utility persona's, each company
//! type's, each group's, the tests between personas, the bankruptcies and the timings.

use super::data::{Cell, Run};
use super::dynamics;
use super::quantities::{QUANTITIES, mix, profit, share, weighted};
use super::summary::{Bankruptcy, GroupStats, PersonaStats, PopulationTiming, TestRow, TypeStats};
use crate::analysis::stats::{Method, Nested, Summary, holm, replicate_means, welch};
use crate::record::StepRecord;
use crate::scenarios::energy_market::Row;
use crate::scenarios::energy_market::config::Role;
use std::collections::BTreeMap;

/// Per replicate, the mean over companies of `role` present at `step` of `f`.
fn at_step(
    cells: &[&Cell],
    step: impl Fn(&Cell) -> usize,
    role: Role,
    f: fn(&Row) -> f64,
) -> Nested {
    let groups: Vec<Vec<f64>> = cells
        .iter()
        .map(|c| c.present_rows(step(c), role).map(f).collect())
        .collect();
    Nested::of(&groups, Method::BootstrapPercentile)
}

/// Each utility of `persona`'s mean of `f` over the market steps it traded in.
fn utility_means(cell: &Cell, persona: &str, f: fn(&Row) -> f64) -> Vec<f64> {
    cell.steps[0]
        .iter()
        .filter(|r| r.role == Role::Utility && r.persona == persona)
        .filter_map(|r| {
            let v: Vec<f64> = cell
                .market_steps()
                .filter(|&s| cell.traded(s, r.agent))
                .map(|s| f(&cell.steps[s][r.agent]))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        })
        .collect()
}

pub(super) fn personas_of(cells: &[&Cell]) -> Vec<String> {
    let mut names: Vec<String> = cells
        .iter()
        .flat_map(|c| c.steps[0].iter())
        .filter(|r| r.role == Role::Utility)
        .map(|r| r.persona.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

fn persona_stats(cells: &[&Cell], persona: &str) -> PersonaStats {
    let nested = |f: fn(&Row) -> f64, method| {
        let groups: Vec<Vec<f64>> = cells.iter().map(|c| utility_means(c, persona, f)).collect();
        Nested::of(&groups, method)
    };
    let (mut utilities, mut bankrupt, mut after) = (0, 0, 0);
    for c in cells {
        for r in c.steps[0]
            .iter()
            .filter(|r| r.role == Role::Utility && r.persona == persona)
        {
            utilities += 1;
            if let Some(s) = c.bankrupt_at(r.agent) {
                bankrupt += 1;
                after += c.last_step() - s;
            }
        }
    }
    PersonaStats {
        persona: persona.to_string(),
        utilities,
        bankrupt,
        steps_after_bankruptcy: after,
        profit: nested(profit, Method::StudentT),
        renewable_mix: nested(mix, Method::BootstrapPercentile),
        renewable_share: nested(share, Method::BootstrapPercentile),
        weighted_share: nested(weighted, Method::BootstrapPercentile),
    }
}

/// Each producer type's mean price over the second half of the market's steps.
pub(super) fn type_stats(cells: &[&Cell]) -> (Vec<TypeStats>, Option<Summary>) {
    let mut per_type: BTreeMap<String, Vec<Vec<f64>>> = BTreeMap::new();
    for (i, c) in cells.iter().enumerate() {
        let steps = c.market_steps();
        let (first, last) = (*steps.start(), *steps.end());
        let half = first + (last.saturating_sub(first)) / 2;
        for r in c.steps[0].iter().filter(|r| r.role == Role::Producer) {
            let prices: Vec<f64> = (half..=last)
                .filter(|&s| c.traded(s, r.agent))
                .map(|s| c.steps[s][r.agent].energy_price)
                .collect();
            if prices.is_empty() {
                continue;
            }
            let groups = per_type.entry(r.company_type.clone()).or_default();
            groups.resize(cells.len(), Vec::new());
            groups[i].push(prices.iter().sum::<f64>() / prices.len() as f64);
        }
    }
    let gaps: Vec<f64> = (0..cells.len())
        .filter_map(|i| {
            let means: Vec<f64> = per_type
                .values()
                .filter_map(|g| g.get(i).filter(|v| !v.is_empty()))
                .map(|v| v.iter().sum::<f64>() / v.len() as f64)
                .collect();
            (means.len() >= 2).then(|| {
                means.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    - means.iter().copied().fold(f64::INFINITY, f64::min)
            })
        })
        .collect();
    let types = per_type
        .into_iter()
        .map(|(company_type, groups)| TypeStats {
            company_type,
            price: Nested::of(&groups, Method::BootstrapPercentile),
        })
        .collect();
    (types, Summary::of_bounded(&gaps))
}

pub(super) fn group_stats(run: &Run, arm: &str, population: usize) -> GroupStats {
    let cells = run.group(arm, population);
    let last = |c: &Cell| c.last_step();
    let bankrupt_shares: Vec<f64> = cells
        .iter()
        .map(|c| {
            let end = &c.steps[c.last_step()];
            end.iter().filter(|r| r.bankrupt).count() as f64 / end.len().max(1) as f64
        })
        .collect();
    let (producer_types, type_gap) = type_stats(&cells);
    GroupStats {
        arm: arm.to_string(),
        population,
        replicates: cells.len(),
        settings: cells[0].settings.clone(),
        last_step: cells.iter().map(|c| c.last_step()).max().unwrap_or(0),
        consumer_price_start: at_step(&cells, |_| 0, Role::Utility, |r| r.cost_to_consumer),
        consumer_price_end: at_step(&cells, last, Role::Utility, |r| r.cost_to_consumer),
        producer_price_start: at_step(&cells, |_| 0, Role::Producer, |r| r.energy_price),
        producer_price_end: at_step(&cells, last, Role::Producer, |r| r.energy_price),
        bankrupt_end: Summary::of_bounded(&bankrupt_shares),
        bankrupt_companies: cells
            .iter()
            .map(|c| c.steps[c.last_step()].iter().filter(|r| r.bankrupt).count())
            .sum(),
        companies: cells.iter().map(|c| c.steps[0].len()).sum(),
        personas: personas_of(&cells)
            .iter()
            .map(|p| persona_stats(&cells, p))
            .collect(),
        producer_types,
        type_gap,
        dynamics: dynamics::dynamics(&cells),
    }
}

fn test(
    population: usize,
    quantity: &'static str,
    (a, ra): (String, Vec<f64>),
    (b, rb): (String, Vec<f64>),
) -> TestRow {
    let w = welch(&ra, &rb);
    TestRow {
        population,
        quantity,
        a,
        b,
        n_a: ra.len(),
        n_b: rb.len(),
        welch: w,
        why_not: w.is_none().then_some(if ra.len() < 2 || rb.len() < 2 {
            "fewer than 2 replicates"
        } else {
            "no variation within either side"
        }),
        holm_p: None,
    }
}

/// The family: every pair of personas within each arm, and each persona against the same
/// companies in the control arm, for profit, renewable mix and renewable share; then Holm.
pub(super) fn tests(run: &Run) -> Vec<TestRow> {
    let mut out = Vec::new();
    let control = run.control_arm();
    for (arm, population) in run.groups() {
        let cells = run.group(&arm, population);
        let personas = personas_of(&cells);
        let means = |cells: &[&Cell], persona: &str, f| {
            replicate_means(
                &cells
                    .iter()
                    .map(|c| utility_means(c, persona, f))
                    .collect::<Vec<_>>(),
            )
        };
        for (quantity, f) in QUANTITIES {
            for i in 0..personas.len() {
                for j in i + 1..personas.len() {
                    out.push(test(
                        population,
                        quantity,
                        (
                            format!("{arm}: {}", personas[i]),
                            means(&cells, &personas[i], f),
                        ),
                        (
                            format!("{arm}: {}", personas[j]),
                            means(&cells, &personas[j], f),
                        ),
                    ));
                }
            }
        }
        if let Some(control) = control.filter(|c| *c != arm) {
            let base = run.group(control, population);
            if base.is_empty() {
                continue;
            }
            for (quantity, f) in QUANTITIES {
                for p in &personas {
                    out.push(test(
                        population,
                        quantity,
                        (format!("{arm}: {p}"), means(&cells, p, f)),
                        (format!("{control}: {p}"), means(&base, p, f)),
                    ));
                }
            }
        }
    }
    let ps: Vec<f64> = out.iter().filter_map(|t| t.welch.map(|w| w.p)).collect();
    let mut adjusted = holm(&ps).into_iter();
    for t in out.iter_mut().filter(|t| t.welch.is_some()) {
        t.holm_p = adjusted.next();
    }
    out
}

pub(super) fn bankruptcies(run: &Run) -> Vec<Bankruptcy> {
    let mut out = Vec::new();
    for c in &run.cells {
        for r in &c.steps[0] {
            if let Some(step) = c.bankrupt_at(r.agent) {
                out.push(Bankruptcy {
                    arm: c.arm.clone(),
                    population: c.population,
                    replicate: c.replicate,
                    agent: r.agent,
                    role: r.role,
                    kind: r.company_type.clone(),
                    persona: r.persona.clone(),
                    step,
                    steps_after: c.last_step() - step,
                });
            }
        }
    }
    out
}

pub(super) fn timings(steps: &[StepRecord]) -> Vec<PopulationTiming> {
    let mut by_population: BTreeMap<usize, Vec<&StepRecord>> = BTreeMap::new();
    for s in steps {
        by_population.entry(s.population).or_default().push(s);
    }
    by_population
        .into_iter()
        .map(|(population, s)| {
            let mut seconds: Vec<f64> = s.iter().map(|x| x.seconds).collect();
            seconds.sort_by(f64::total_cmp);
            let mut ranks: Vec<usize> = s.iter().map(|x| x.ranks).collect();
            ranks.sort_unstable();
            ranks.dedup();
            let total: f64 = seconds.iter().sum::<f64>().max(1e-9);
            let split = s.iter().try_fold((0, 0), |(m, k), x| {
                x.split().map(|(xm, xk)| (m + xm, k + xk))
            });
            PopulationTiming {
                model_decisions_per_second: split.map(|(m, _)| m as f64 / total),
                scripted_decisions_per_second: split.map(|(_, k)| k as f64 / total),
                population,
                ranks,
                step_seconds: Summary::of_bounded(&seconds),
                median_seconds: crate::analysis::stats::quantile(&seconds, 0.5),
                min_seconds: seconds[0],
                max_seconds: seconds[seconds.len() - 1],
                decisions_per_second: s.iter().map(|x| x.decisions).sum::<usize>() as f64
                    / seconds.iter().sum::<f64>().max(1e-9),
            }
        })
        .collect()
}
