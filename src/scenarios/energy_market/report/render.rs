//! The report as `report.html` and as terminal text.

use super::summary::{GroupStats, Report, TestRow};
use crate::analysis::html::{
    esc, fmt, fmt_nested, fmt_p, fmt_seconds, headline, table, unfinished,
};
use crate::scenarios::energy_market::config::Role;
use std::fmt::Write as _;

/// Rows of the bankruptcy list shown; the rest are in `state.parquet` (column `bankrupt`).
const BANKRUPTCIES_SHOWN: usize = 200;

const METHOD: &str = "Each market (replicate) is one independent observation: companies in one market react to each other, so intervals and tests are computed over replicate means (n = replicates), and the spread across companies is shown only as description (sd and range). Profits have Student's t intervals; prices, shares, preferences, counts and times have 95% bootstrap percentile intervals, which never leave the range the quantity can take. A sample of one has no interval. Every company counts in each step it traded in, including the step whose loss bankrupted it; after that it is shown as bankrupt and no longer trades. Tests are Welch's t-tests of replicate means, with Holm's correction over every test in this report.";

fn group_label(g: &GroupStats) -> String {
    format!("{} ({} companies)", g.arm, g.population)
}

fn bankrupt_text(g: &GroupStats) -> String {
    format!(
        "{} of {} companies; share {}",
        g.bankrupt_companies,
        g.companies,
        fmt(&g.bankrupt_end)
    )
}

fn test_cells(t: &TestRow) -> (String, String, String, String) {
    match (&t.welch, t.why_not) {
        (Some(w), _) => (
            format!("{:.3}", w.t),
            format!("{:.1}", w.df),
            fmt_p(w.p),
            t.holm_p.map_or("-".into(), fmt_p),
        ),
        (None, why) => (
            "-".into(),
            "-".into(),
            why.unwrap_or("-").to_string(),
            "-".into(),
        ),
    }
}

fn lags_text(lags: &[usize]) -> String {
    if lags.is_empty() {
        return "-".into();
    }
    lags.iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| format!("{} step{}: {n}", i + 1, if i == 0 { "" } else { "s" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Seconds in a readable unit.
fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// Counts per replicate: `5, 4, 5`.
fn by_market(counts: &[usize]) -> String {
    counts
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A number at the last step, or why there is none (every such company was bankrupt by
/// then).
fn at_end(text: String, role: &str) -> String {
    if text == "-" {
        format!("- (no {role} trading in the last step)")
    } else {
        text
    }
}

fn share_text(k: usize, n: usize) -> String {
    if n == 0 {
        "-".into()
    } else {
        format!("{k} of {n} ({:.0}%)", 100.0 * k as f64 / n as f64)
    }
}

/// The study's sections of `report.html`: the base report ([`crate::analysis::overview`])
/// puts the run's notes and paragraph above them, and the study's figures and every column's
/// breakdowns below.
pub fn html(report: &Report) -> String {
    let mut body = String::new();
    body.push_str(&key_numbers(report));
    body.push_str(&personas(report));
    body.push_str(&persona_tests(report));
    body.push_str(&dynamics(report));
    body.push_str(&types_and_bankruptcies(report));
    body.push_str(&step_times(report));
    body
}

/// The run's key numbers, after what a reader must know of its rules.
fn key_numbers(report: &Report) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h2>How to read these numbers</h2><p>{}</p>",
        esc(METHOD)
    );
    if report.groups.iter().any(|g| g.settings.hidden_round) {
        body.push_str("<p>Under the reference rules, step 1 of the records is the hidden round the published code runs before its step 1 (demand 0); like the published results, figures and statistics start after it.</p>");
    }

    body.push_str("<h2>Key numbers (mean [95% CI])</h2>");
    body.push_str(&table(
        &[
            "arm",
            "companies",
            "replicates",
            "consumer price, start",
            "consumer price, end",
            "producer price, start",
            "producer price, end",
            "bankrupt at the end",
        ],
        report.groups.iter().map(|g| {
            vec![
                esc(&g.arm),
                g.population.to_string(),
                g.replicates.to_string(),
                fmt_nested(&g.consumer_price_start),
                at_end(fmt_nested(&g.consumer_price_end), "utility"),
                fmt_nested(&g.producer_price_start),
                at_end(fmt_nested(&g.producer_price_end), "producer"),
                bankrupt_text(g),
            ]
        }),
    ));
    body
}

/// Utilities by persona.
fn personas(report: &Report) -> String {
    let mut body = String::new();
    body.push_str("<h2>Utilities by persona</h2><p>Per utility, its mean over the steps it traded in; weighted share = renewable share x adjust_renewable_mix (the study's Figure 9).</p>");
    body.push_str(&table(
        &[
            "arm",
            "companies",
            "persona",
            "utilities",
            "bankrupt (steps shown as bankrupt)",
            "profit per step",
            "renewable mix",
            "renewable share",
            "weighted share",
        ],
        report.groups.iter().flat_map(|g| {
            g.personas.iter().map(move |p| {
                vec![
                    esc(&g.arm),
                    g.population.to_string(),
                    esc(&p.persona),
                    p.utilities.to_string(),
                    format!("{} ({})", p.bankrupt, p.steps_after_bankruptcy),
                    fmt_nested(&p.profit),
                    fmt_nested(&p.renewable_mix),
                    fmt_nested(&p.renewable_share),
                    fmt_nested(&p.weighted_share),
                ]
            })
        }),
    ));
    body
}

/// The tests between personas, and against the control.
fn persona_tests(report: &Report) -> String {
    let mut body = String::new();
    body.push_str("<h2>Tests between personas, and against the control</h2><p>Welch's t-tests of replicate means; p adjusted by Holm over all the tests below.</p>");
    body.push_str(&table(
        &[
            "companies",
            "quantity",
            "compared",
            "replicates",
            "t",
            "df",
            "p",
            "Holm p",
        ],
        report.tests.iter().map(|t| {
            let (tt, df, p, holm) = test_cells(t);
            vec![
                t.population.to_string(),
                t.quantity.to_string(),
                format!("{} vs {}", esc(&t.a), esc(&t.b)),
                format!("{} vs {}", t.n_a, t.n_b),
                tt,
                df,
                esc(&p),
                holm,
            ]
        }),
    ));
    body
}

/// Experiment 2's dynamics.
fn dynamics(report: &Report) -> String {
    let mut body = String::new();
    body.push_str("<h2>Experiment 2's dynamics</h2><p>(a) A price rise whose buyers bought less in the first step that saw it (the same step under the fixed rules, the next under the reference's), walked back if the producer's next price change was a cut; lag = steps from the rise to the cut; to a rival = a utility that bought from it the step before bought from another producer instead (the rest are buyers leaving: bankrupt, or less demand). (b) Steps in which the market's single cheapest producer raised its price and stayed no dearer than any other. (c) Utility-steps with one supplier: how many were profitable, and whether that supplier also sold to others (indirect competition).</p>");
    body.push_str(&table(
        &[
            "arm",
            "producers",
            "rises",
            "rises that lost sales",
            "walked back",
            "episodes per producer",
            "lags",
            "cheapest crept up (chances)",
            "creeps per market",
            "single-supplier steps profitable",
            "their mean profit",
            "supplier also sold to others",
            "supplier price - market mean",
            "multi-supplier steps profitable",
        ],
        report.groups.iter().map(|g| {
            let d = &g.dynamics;
            let (creeps, chances) = d
                .creep
                .iter()
                .fold((0, 0), |(a, b), c| (a + c.creeps, b + c.chances));
            vec![
                esc(&group_label(g)),
                d.producers.to_string(),
                d.raises.to_string(),
                format!(
                    "{} (by market: {}); {} to a rival",
                    d.episodes,
                    by_market(&d.episodes_by_replicate),
                    d.to_rival
                ),
                share_text(d.walked_back, d.episodes),
                fmt(&d.episodes_per_producer),
                lags_text(&d.lags),
                format!("{creeps} ({chances})"),
                fmt(&d.creeps_per_replicate),
                format!(
                    "{}; per market {}",
                    share_text(d.single_supplier_profitable, d.single_supplier_steps),
                    fmt(&d.single_supplier_profitable_share)
                ),
                fmt(&d.single_supplier_profit),
                share_text(d.supplier_sells_to_others, d.single_supplier_steps),
                fmt(&d.supplier_price_gap),
                share_text(d.multi_supplier_profitable, d.multi_supplier_steps),
            ]
        }),
    ));
    body
}

/// Producer types against population, and the bankruptcies.
fn types_and_bankruptcies(report: &Report) -> String {
    let mut body = String::new();
    body.push_str("<h2>Producer types against population</h2><p>Types have identical properties, so their mean prices (second half of the run) should agree once the market is large enough; gap = the largest difference between two types' means in a market.</p>");
    body.push_str(&table(
        &["arm", "companies", "types", "gap between types"],
        report.groups.iter().map(|g| {
            vec![
                esc(&g.arm),
                g.population.to_string(),
                g.producer_types
                    .iter()
                    .map(|t| format!("{}: {}", esc(&t.company_type), fmt_nested(&t.price)))
                    .collect::<Vec<_>>()
                    .join("<br>"),
                fmt(&g.type_gap),
            ]
        }),
    ));

    let _ = write!(
        body,
        "<h2>Bankruptcies</h2><p>{} companies went bankrupt. Each counts in the statistics up to and including the step that bankrupted it; its later steps are shown as bankrupt.</p>",
        report.bankruptcies.len()
    );
    if !report.bankruptcies.is_empty() {
        body.push_str(&table(
            &[
                "arm",
                "companies",
                "replicate",
                "company",
                "type",
                "persona",
                "bankrupt at step",
                "later steps (bankrupt)",
            ],
            report
                .bankruptcies
                .iter()
                .take(BANKRUPTCIES_SHOWN)
                .map(|b| {
                    vec![
                        esc(&b.arm),
                        b.population.to_string(),
                        b.replicate.to_string(),
                        b.agent.to_string(),
                        esc(&b.kind),
                        if b.role == Role::Utility {
                            esc(&b.persona)
                        } else {
                            "-".into()
                        },
                        b.step.to_string(),
                        b.steps_after.to_string(),
                    ]
                }),
        ));
        if report.bankruptcies.len() > BANKRUPTCIES_SHOWN {
            let _ = write!(
                body,
                "<p>... and {} more: state.parquet has every company at every step (column <code>bankrupt</code>).</p>",
                report.bankruptcies.len() - BANKRUPTCIES_SHOWN
            );
        }
    }
    body
}

/// Time per step.
fn step_times(report: &Report) -> String {
    let mut body = String::new();
    body.push_str("<h2>Time per step</h2>");
    body.push_str(&table(
        &[
            "companies",
            "devices",
            "mean [95% CI]",
            "median",
            "range",
            "decisions/s (model, scripted)",
        ],
        report.timings.iter().map(|t| {
            vec![
                t.population.to_string(),
                t.ranks
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                fmt_seconds(&t.step_seconds),
                seconds(t.median_seconds),
                format!("{} to {}", seconds(t.min_seconds), seconds(t.max_seconds)),
                t.rates(),
            ]
        }),
    ));
    body
}

pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let m = &report.manifest;
    if let Some(line) = unfinished(m) {
        let _ = writeln!(out, "UNFINISHED: {line}");
    }
    for note in &report.notes {
        let _ = writeln!(out, "NOTE: {note}");
    }
    let _ = writeln!(out, "{}, {} clamped", headline(m), m.counters.clamped);
    let _ = writeln!(
        out,
        "mean [95% CI] over replicate means (n = replicates); report.html has the companies' spread"
    );
    for g in &report.groups {
        group_text(&mut out, g);
    }
    let untested = report.tests.iter().filter(|t| t.welch.is_none()).count();
    for t in report.tests.iter().filter(|t| t.welch.is_some()) {
        let (tt, df, p, holm) = test_cells(t);
        let _ = writeln!(
            out,
            "Welch t-test, {} companies, {}: {} vs {} ({} vs {} replicates): t = {tt}, df = {df}, p = {p}, Holm p = {holm}",
            t.population, t.quantity, t.a, t.b, t.n_a, t.n_b
        );
    }
    if untested > 0 {
        let _ = writeln!(
            out,
            "{untested} more comparisons have no test (fewer than 2 replicates, or no variation within either side): see report.html"
        );
    }
    for t in &report.timings {
        let _ = writeln!(
            out,
            "{} companies: step time {}, median {}, {}",
            t.population,
            fmt_seconds(&t.step_seconds),
            seconds(t.median_seconds),
            t.rates()
        );
    }
    out
}

/// The text report's lines for one arm and population size.
fn group_text(out: &mut String, g: &GroupStats) {
    let _ = writeln!(
        out,
        "arm {} ({} companies, {} replicates):",
        g.arm, g.population, g.replicates
    );
    let _ = writeln!(
        out,
        "  consumer price: start {} -> end {}",
        fmt(&g.consumer_price_start.replicates),
        at_end(fmt(&g.consumer_price_end.replicates), "utility")
    );
    let _ = writeln!(
        out,
        "  producer price: start {} -> end {}",
        fmt(&g.producer_price_start.replicates),
        at_end(fmt(&g.producer_price_end.replicates), "producer")
    );
    let _ = writeln!(out, "  bankrupt at the end: {}", bankrupt_text(g));
    for p in &g.personas {
        let _ = writeln!(
            out,
            "  utilities, {} ({}, {} bankrupt): profit/step {}, renewable mix {}, renewable share {}",
            p.persona,
            p.utilities,
            p.bankrupt,
            fmt(&p.profit.replicates),
            fmt(&p.renewable_mix.replicates),
            fmt(&p.renewable_share.replicates)
        );
    }
    let d = &g.dynamics;
    let _ = writeln!(
        out,
        "  exp2 (a) rises that lost sales: {} of {} rises (by market: {}; {} to a rival), {} walked back (lags: {}), per producer {}",
        d.episodes,
        d.raises,
        by_market(&d.episodes_by_replicate),
        d.to_rival,
        d.walked_back,
        lags_text(&d.lags),
        fmt(&d.episodes_per_producer)
    );
    let _ = writeln!(
        out,
        "  exp2 (b) cheapest producer crept up: per market {}",
        fmt(&d.creeps_per_replicate)
    );
    let _ = writeln!(
        out,
        "  exp2 (c) single-supplier utility-steps profitable: {}, mean profit {}",
        share_text(d.single_supplier_profitable, d.single_supplier_steps),
        fmt(&d.single_supplier_profit)
    );
    if g.producer_types.len() > 1 {
        let _ = writeln!(
            out,
            "  gap between producer types' prices: {}",
            fmt(&g.type_gap)
        );
    }
}
