//! The energy market's report: the figures of the reference study (2 to 9), the numbers
//! behind them with 95% confidence intervals, and Welch's t-tests between personas.

use super::Row;
use super::config::Role;
use super::config::{MarketConfig, Rules};
use crate::analysis::html::{esc, figures, fmt, fmt_seconds, page, table};
use crate::analysis::plot::{self, Band, Lines, Network, Panels};
use crate::analysis::stats::{Summary, Welch, welch};
use crate::record::{self, Manifest, StepRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// What the report needs to know of a cell's arm, kept in `cells.json` (older runs, which
/// lack it, read as the fixed rules with personas).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CellSettings {
    pub rules: Rules,
    pub regulated: bool,
    /// Step 1 of the records is the reference's hidden round (demand 0).
    pub hidden_round: bool,
    pub use_personas: bool,
    pub max_renewable_mix: f64,
}

impl Default for CellSettings {
    fn default() -> Self {
        Self::of(&MarketConfig::default())
    }
}

impl CellSettings {
    pub fn of(cfg: &MarketConfig) -> Self {
        Self {
            rules: cfg.rules,
            regulated: cfg.regulated,
            hidden_round: cfg.hidden_round(),
            use_personas: cfg.use_personas,
            max_renewable_mix: cfg.max_renewable_mix,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PersonaStats {
    pub persona: String,
    /// A utility's profit per step, averaged over the run, across utilities and replicates.
    pub profit: Option<Summary>,
    pub renewable_mix: Option<Summary>,
    pub renewable_fraction: Option<Summary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PersonaTest {
    pub a: String,
    pub b: String,
    pub welch: Option<Welch>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArmStats {
    pub arm: String,
    pub population: usize,
    pub consumer_price_start: Option<Summary>,
    pub consumer_price_end: Option<Summary>,
    pub producer_price_start: Option<Summary>,
    pub producer_price_end: Option<Summary>,
    pub bankrupt_end: f64,
    pub personas: Vec<PersonaStats>,
    /// Utilities' profit, each pair of personas.
    pub persona_tests: Vec<PersonaTest>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PopulationTiming {
    pub population: usize,
    pub step_seconds: Option<Summary>,
    pub decisions_per_second: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub manifest: Manifest,
    pub arms: Vec<ArmStats>,
    pub timings: Vec<PopulationTiming>,
    pub figures: Vec<String>,
}

fn utilities<'a>(rows: &[&'a Row]) -> Vec<&'a Row> {
    rows.iter()
        .copied()
        .filter(|r| r.role == Role::Utility && !r.bankrupt)
        .collect()
}

fn producers<'a>(rows: &[&'a Row]) -> Vec<&'a Row> {
    rows.iter()
        .copied()
        .filter(|r| r.role == Role::Producer && !r.bankrupt)
        .collect()
}

fn summarise<'a>(rows: impl Iterator<Item = &'a Row>, f: impl Fn(&Row) -> f64) -> Option<Summary> {
    Summary::of(&rows.map(f).collect::<Vec<_>>())
}

/// Series of `f` over steps with 95% bands, one per group of `key`.
fn over_time(rows: &[&Row], key: impl Fn(&Row) -> String, f: impl Fn(&Row) -> f64) -> Vec<Band> {
    let mut groups: BTreeMap<String, BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for r in rows {
        groups
            .entry(key(r))
            .or_default()
            .entry(r.step)
            .or_default()
            .push(f(r));
    }
    groups
        .into_iter()
        .map(|(name, steps)| Band {
            name,
            points: steps
                .into_iter()
                .filter_map(|(step, v)| {
                    Summary::of(&v).map(|s| (step as f64, s.mean, s.ci_low, s.ci_high))
                })
                .collect(),
        })
        .collect()
}

/// Writes the figures, `summary.json` and `report.html` into `dir` and returns the numbers.
pub fn report(dir: &Path) -> Result<Report, String> {
    let manifest: Manifest =
        record::read_json(&dir.join(record::MANIFEST)).map_err(|e| e.to_string())?;
    let batches = record::read_state(dir).map_err(|e| e.to_string())?;
    let rows: Vec<Row> = record::rows_of(&batches, dir).map_err(|e| e.to_string())?;
    drop(batches);
    let steps: Vec<StepRecord> = record::read_steps(dir).map_err(|e| e.to_string())?;
    let cells: BTreeMap<String, serde_json::Value> =
        record::read_json(&dir.join(record::CELLS)).map_err(|e| e.to_string())?;
    if rows.is_empty() {
        return Err(format!(
            "{} has no state rows yet: run at least one step",
            dir.display()
        ));
    }
    let arms: Vec<String> = if manifest.arms.is_empty() {
        let mut a: Vec<String> = rows.iter().map(|r| r.arm.clone()).collect();
        a.dedup();
        a
    } else {
        manifest.arms.clone()
    };
    let first_population = rows[0].population;
    let last_step = rows
        .iter()
        .filter(|r| r.population == first_population)
        .map(|r| r.step)
        .max()
        .unwrap_or(0);
    let mut figures = Vec::new();
    let mut save = |name: &str, fig: &dyn Fn(&Path) -> Result<(), String>| -> Result<(), String> {
        fig(&dir.join(name))?;
        figures.push(name.to_string());
        Ok(())
    };

    // Figure 2: the network of the first cell.
    if let Some((key, cell)) = cells.iter().next() {
        let companies = cell["companies"].as_array().cloned().unwrap_or_default();
        let nodes = companies
            .iter()
            .map(|c| {
                (
                    c["id"].to_string(),
                    c["type"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        let edges = companies
            .iter()
            .flat_map(|c| {
                let from = c["id"].as_u64().unwrap_or(0) as usize;
                c["links"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |l| (from, l.as_u64().unwrap_or(0) as usize))
            })
            .collect();
        let fig = Network {
            title: format!("Figure 2: the market's network ({key})"),
            nodes,
            edges,
        };
        save("fig2_network", &|p| plot::save(&fig, p))?;
    }

    let in_arm = |arm: &str| -> Vec<&Row> {
        rows.iter()
            .filter(|r| r.arm == arm && r.population == first_population)
            .collect()
    };

    // Figure 3: consumer price over time, per arm.
    let fig = Lines {
        title: format!(
            "Figure 3: price to consumers ({first_population} companies, mean and 95% CI)"
        ),
        x_label: "step".into(),
        y_label: "utility price per unit".into(),
        series: arms
            .iter()
            .flat_map(|arm| {
                over_time(
                    &utilities(&in_arm(arm)),
                    |_| arm.clone(),
                    |r| r.cost_to_consumer,
                )
            })
            .collect(),
        markers: false,
    };
    save("fig3_consumer_price", &|p| plot::save(&fig, p))?;

    // Figure 4: every producer's price in the first cell.
    let first_arm = &arms[0];
    let cell_rows: Vec<&Row> = in_arm(first_arm)
        .into_iter()
        .filter(|r| r.replicate == 0)
        .collect();
    let mut lines: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
    let mut kinds: BTreeMap<usize, String> = BTreeMap::new();
    for r in producers(&cell_rows) {
        lines
            .entry(r.agent)
            .or_default()
            .push((r.step as f64, r.energy_price));
        kinds.insert(r.agent, r.company_type.clone());
    }
    let fig = Lines {
        title: format!("Figure 4: producer prices, arm {first_arm}, replicate 0"),
        x_label: "step".into(),
        y_label: "price per unit".into(),
        series: lines
            .into_iter()
            .take(24)
            .map(|(a, pts)| Band::line(format!("{} {a}", kinds[&a]), pts))
            .collect(),
        markers: false,
    };
    save("fig4_producer_prices", &|p| plot::save(&fig, p))?;

    // Figure 5: step time against population size.
    let mut by_population: BTreeMap<usize, Vec<&StepRecord>> = BTreeMap::new();
    for s in &steps {
        by_population.entry(s.population).or_default().push(s);
    }
    let timings: Vec<PopulationTiming> = by_population
        .iter()
        .map(|(&population, s)| PopulationTiming {
            population,
            step_seconds: Summary::of(&s.iter().map(|x| x.seconds).collect::<Vec<_>>()),
            decisions_per_second: s.iter().map(|x| x.decisions).sum::<usize>() as f64
                / s.iter().map(|x| x.seconds).sum::<f64>().max(1e-9),
        })
        .collect();
    let fig = Lines {
        title: format!("Figure 5: time per step ({} policy)", manifest.policy),
        x_label: "companies".into(),
        y_label: "seconds per step".into(),
        series: vec![Band {
            name: "step time".into(),
            points: timings
                .iter()
                .filter_map(|t| {
                    t.step_seconds
                        .map(|s| (t.population as f64, s.mean, s.ci_low, s.ci_high))
                })
                .collect(),
        }],
        markers: true,
    };
    save("fig5_step_time", &|p| plot::save(&fig, p))?;

    // Figure 6: each producer type's mean price (second half of the run) against population.
    let mut per_type: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
    for &population in by_population
        .keys()
        .chain(std::iter::once(&first_population))
        .collect::<std::collections::BTreeSet<_>>()
    {
        let pop_rows: Vec<&Row> = rows
            .iter()
            .filter(|r| r.arm == *first_arm && r.population == population)
            .collect();
        let end = pop_rows.iter().map(|r| r.step).max().unwrap_or(0);
        let mut per_agent: BTreeMap<(String, usize, usize), Vec<f64>> = BTreeMap::new();
        for r in producers(&pop_rows)
            .into_iter()
            .filter(|r| r.step * 2 >= end && r.step > 0)
        {
            per_agent
                .entry((r.company_type.clone(), r.replicate, r.agent))
                .or_default()
                .push(r.energy_price);
        }
        let mut by_type: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for ((kind, ..), v) in per_agent {
            by_type
                .entry(kind)
                .or_default()
                .push(v.iter().sum::<f64>() / v.len() as f64);
        }
        for (kind, v) in by_type {
            if let Some(s) = Summary::of(&v) {
                per_type.entry(kind).or_default().push((
                    population as f64,
                    s.mean,
                    s.ci_low,
                    s.ci_high,
                ));
            }
        }
    }
    let fig = Lines {
        title: "Figure 6: mean producer price by type against population (95% CI)".into(),
        x_label: "companies".into(),
        y_label: "price per unit (second half of the run)".into(),
        series: per_type
            .into_iter()
            .map(|(name, points)| Band { name, points })
            .collect(),
        markers: true,
    };
    save("fig6_subpopulations", &|p| plot::save(&fig, p))?;

    // Figures 7 to 9: utilities by persona over time, one panel per arm.
    let persona_panels = |title: &str, y: &str, f: fn(&Row) -> f64| {
        Panels(
            arms.iter()
                .map(|arm| Lines {
                    title: format!("{title}: arm {arm}"),
                    x_label: "step".into(),
                    y_label: y.into(),
                    series: over_time(
                        &utilities(&in_arm(arm))
                            .into_iter()
                            .filter(|r| r.step > 0)
                            .collect::<Vec<_>>(),
                        |r| r.persona.clone(),
                        f,
                    ),
                    markers: false,
                })
                .collect(),
        )
    };
    let fig = persona_panels(
        "Figure 7: utility profit by persona",
        "profit per step",
        |r| r.profit,
    );
    save("fig7_profit_by_persona", &|p| plot::save(&fig, p))?;
    let fig = persona_panels(
        "Figure 8: renewable preference by persona",
        "adjust_renewable_mix",
        |r| r.renewable_mix,
    );
    save("fig8_renewable_preference", &|p| plot::save(&fig, p))?;
    let fig = persona_panels(
        "Figure 9: renewable share of purchases by persona",
        "renewable fraction",
        |r| r.renewable_fraction,
    );
    save("fig9_renewable_fraction", &|p| plot::save(&fig, p))?;

    // The numbers.
    let arm_stats: Vec<ArmStats> = arms
        .iter()
        .map(|arm| {
            let all = in_arm(arm);
            let at = |step: usize| {
                all.iter()
                    .copied()
                    .filter(move |r| r.step == step)
                    .collect::<Vec<_>>()
            };
            let (start, end) = (at(0), at(last_step));
            let util_rows = utilities(&all);
            let mut by_persona: BTreeMap<String, BTreeMap<(usize, usize), Vec<&Row>>> =
                BTreeMap::new();
            for r in util_rows.iter().filter(|r| r.step > 0) {
                by_persona
                    .entry(r.persona.clone())
                    .or_default()
                    .entry((r.replicate, r.agent))
                    .or_default()
                    .push(r);
            }
            let per_agent_mean =
                |agents: &BTreeMap<(usize, usize), Vec<&Row>>, f: fn(&Row) -> f64| -> Vec<f64> {
                    agents
                        .values()
                        .map(|v| v.iter().map(|r| f(r)).sum::<f64>() / v.len() as f64)
                        .collect()
                };
            let personas: Vec<PersonaStats> = by_persona
                .iter()
                .map(|(persona, agents)| PersonaStats {
                    persona: persona.clone(),
                    profit: Summary::of(&per_agent_mean(agents, |r| r.profit)),
                    renewable_mix: Summary::of(&per_agent_mean(agents, |r| r.renewable_mix)),
                    renewable_fraction: Summary::of(&per_agent_mean(agents, |r| {
                        r.renewable_fraction
                    })),
                })
                .collect();
            let names: Vec<&String> = by_persona.keys().collect();
            let mut persona_tests = Vec::new();
            for i in 0..names.len() {
                for j in i + 1..names.len() {
                    persona_tests.push(PersonaTest {
                        a: names[i].clone(),
                        b: names[j].clone(),
                        welch: welch(
                            &per_agent_mean(&by_persona[names[i]], |r| r.profit),
                            &per_agent_mean(&by_persona[names[j]], |r| r.profit),
                        ),
                    });
                }
            }
            ArmStats {
                arm: arm.clone(),
                population: first_population,
                consumer_price_start: summarise(utilities(&start).into_iter(), |r| {
                    r.cost_to_consumer
                }),
                consumer_price_end: summarise(utilities(&end).into_iter(), |r| r.cost_to_consumer),
                producer_price_start: summarise(producers(&start).into_iter(), |r| r.energy_price),
                producer_price_end: summarise(producers(&end).into_iter(), |r| r.energy_price),
                bankrupt_end: end.iter().filter(|r| r.bankrupt).count() as f64
                    / end.len().max(1) as f64,
                personas,
                persona_tests,
            }
        })
        .collect();
    let report = Report {
        manifest,
        arms: arm_stats,
        timings,
        figures,
    };
    record::write_json_atomic(&dir.join("summary.json"), &report).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("report.html"), html(&report))
        .map_err(|e| format!("{}: {e}", dir.join("report.html").display()))?;
    Ok(report)
}

/// The key numbers as text lines, for the terminal.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let m = &report.manifest;
    let _ = writeln!(
        out,
        "{} ({} policy, model {}): {} decisions, {} fallbacks ({:.1}%), {} clamped",
        m.name,
        m.policy,
        m.model.as_deref().unwrap_or("-"),
        m.counters.decisions,
        m.counters.fallbacks,
        100.0 * m.counters.fallbacks as f64 / m.counters.decisions.max(1) as f64,
        m.counters.clamped
    );
    for a in &report.arms {
        let _ = writeln!(out, "arm {} ({} companies):", a.arm, a.population);
        let _ = writeln!(
            out,
            "  consumer price: start {} -> end {}",
            fmt(&a.consumer_price_start),
            fmt(&a.consumer_price_end)
        );
        let _ = writeln!(
            out,
            "  producer price: start {} -> end {}",
            fmt(&a.producer_price_start),
            fmt(&a.producer_price_end)
        );
        let _ = writeln!(out, "  bankrupt at the end: {:.0}%", 100.0 * a.bankrupt_end);
        for p in &a.personas {
            let _ = writeln!(
                out,
                "  utilities, {}: profit/step {}, renewable mix {}, renewable share {}",
                p.persona,
                fmt(&p.profit),
                fmt(&p.renewable_mix),
                fmt(&p.renewable_fraction)
            );
        }
        for t in &a.persona_tests {
            match &t.welch {
                Some(w) => {
                    let _ = writeln!(
                        out,
                        "  Welch t-test, profit {} vs {}: t = {:.3}, df = {:.1}, p = {:.4}",
                        t.a, t.b, w.t, w.df, w.p
                    );
                }
                None => {
                    let _ = writeln!(
                        out,
                        "  Welch t-test, profit {} vs {}: too few utilities",
                        t.a, t.b
                    );
                }
            }
        }
    }
    for t in &report.timings {
        let _ = writeln!(
            out,
            "{} companies: step time {}, {:.2} decisions/s",
            t.population,
            fmt_seconds(&t.step_seconds),
            t.decisions_per_second
        );
    }
    out
}

fn html(report: &Report) -> String {
    let mut body = String::new();
    let m = &report.manifest;
    let _ = write!(
        body,
        "<h1>{}</h1><p>Scenario <b>{}</b>, policy <b>{}</b>, model <b>{}</b>, seed {}, {} replicates, {} steps; \
         {} decisions in {:.1} s, {} fell back to no change, {} clamped.</p>",
        esc(&m.name),
        esc(&m.scenario),
        esc(&m.policy),
        esc(m.model.as_deref().unwrap_or("-")),
        m.seed,
        m.replicates,
        m.steps,
        m.counters.decisions,
        m.counters.seconds,
        m.counters.fallbacks,
        m.counters.clamped
    );
    body.push_str("<h2>Key numbers (mean [95% CI])</h2>");
    body.push_str(&table(
        &[
            "arm",
            "consumer price, start",
            "consumer price, end",
            "producer price, start",
            "producer price, end",
            "bankrupt",
        ],
        report.arms.iter().map(|a| {
            vec![
                esc(&a.arm),
                fmt(&a.consumer_price_start),
                fmt(&a.consumer_price_end),
                fmt(&a.producer_price_start),
                fmt(&a.producer_price_end),
                format!("{:.0}%", 100.0 * a.bankrupt_end),
            ]
        }),
    ));
    body.push_str("<h2>Utilities by persona</h2>");
    body.push_str(&table(
        &[
            "arm",
            "persona",
            "profit per step",
            "renewable mix",
            "renewable share",
        ],
        report.arms.iter().flat_map(|a| {
            a.personas.iter().map(|p| {
                vec![
                    esc(&a.arm),
                    esc(&p.persona),
                    fmt(&p.profit),
                    fmt(&p.renewable_mix),
                    fmt(&p.renewable_fraction),
                ]
            })
        }),
    ));
    body.push_str("<h2>Welch's t-tests of utility profit between personas</h2>");
    body.push_str(&table(
        &["arm", "personas", "t", "df", "p"],
        report.arms.iter().flat_map(|a| {
            a.persona_tests.iter().map(|t| {
                let (tt, df, p) = t.welch.map_or(("-".into(), "-".into(), "-".into()), |w| {
                    (
                        format!("{:.3}", w.t),
                        format!("{:.1}", w.df),
                        format!("{:.4}", w.p),
                    )
                });
                vec![
                    esc(&a.arm),
                    format!("{} vs {}", esc(&t.a), esc(&t.b)),
                    tt,
                    df,
                    p,
                ]
            })
        }),
    ));
    body.push_str("<h2>Time per step</h2>");
    body.push_str(&table(
        &["companies", "time per step", "decisions/s"],
        report.timings.iter().map(|t| {
            vec![
                t.population.to_string(),
                fmt_seconds(&t.step_seconds),
                format!("{:.2}", t.decisions_per_second),
            ]
        }),
    ));
    body.push_str("<h2>Figures</h2>");
    body.push_str(&figures(&report.figures));
    page(&report.manifest.name, &body)
}

/// Writes the report of the run in `dir` and returns its key numbers as text (the
/// registry's entry).
pub fn write(dir: &Path) -> Result<String, String> {
    report(dir).map(|r| text(&r))
}
