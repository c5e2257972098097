//! The energy market's report: the figures of the reference study (2 to 9) for every arm
//! and population, the numbers behind them, the tests the study's claims need, and
//! Experiment 2's dynamics.
//!
//! Statistics: the market (a replicate) is the unit of independence, since its companies
//! react to each other. Every interval and test is computed over replicate means; the
//! companies' own values are kept as descriptive spread. Profits get Student's t
//! intervals; bounded quantities (prices, shares, preferences, counts, times) the
//! bootstrap percentile interval, which stays within their bounds. Welch's t-tests compare
//! replicate means, and Holm's correction runs over every test of the report. Every company
//! counts in the steps it traded in, including the one whose loss bankrupted it.

mod data;
pub mod dynamics;
pub mod figures;
mod measures;
mod quantities;
mod render;
mod summary;

pub use data::{Cell, CellSettings, Run};
pub use summary::{
    Bankruptcy, GroupStats, PersonaStats, PopulationTiming, Report, TestRow, TypeStats,
};

use measures::{bankruptcies, group_stats, tests, timings};

use super::config::Role;
use crate::analysis::overview::{self, Own};
use crate::analysis::{ReportError, caveats};
use std::path::Path;

/// The study: Llama 3.2 3B, which found models under 1B parameters unable to keep focus.
const STUDY: caveats::Study = caveats::Study {
    model: "Llama 3.2 3B",
    parameters: 3.0,
    on_smaller_models: "the study reports that models under 1B parameters could not keep focus or format their answers",
    behaviour: "the market behaviour the study describes",
    reproduce_with: "the model it used",
    preset: "llama-3.2-3b-instruct",
    config: "experiments/exp1-unregulated.toml",
};

/// What a reader must know before trusting the numbers, after whether the run is finished:
/// a model below the study's (with what the run still shows, and how to reproduce the
/// study), or scripted companies (see [`caveats::notes`]).
fn notes(run: &Run, groups: &[GroupStats]) -> Vec<String> {
    let scripted = caveats::ScriptedRules {
        agents: "companies follow fixed rules of thumb",
        tests: "the market's rules, the records and the report",
        built_in: "",
    };
    caveats::notes(&run.manifest, &STUDY, &scripted, || {
        let companies: usize = groups.iter().map(|g| g.companies).sum();
        let bankrupt: usize = groups.iter().map(|g| g.bankrupt_companies).sum();
        let (mut charged, mut paid) = (Vec::new(), Vec::new());
        for c in &run.cells {
            for s in c.market_steps() {
                for r in c.present_rows(s, Role::Utility) {
                    charged.push(r.cost_to_consumer);
                    if r.bought > 0.0 {
                        paid.push(r.costs / r.bought);
                    }
                }
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (!v.is_empty()).then(|| crate::analysis::stats::quantile(v, 0.5))
        };
        match (median(&mut charged), median(&mut paid)) {
            (Some(c), Some(p)) => format!(
                " In this run utilities charged consumers a median {c:.2} per unit against a median purchase price of {p:.2}, and {bankrupt} of {companies} companies were bankrupt by the last step."
            ),
            _ => format!(" {bankrupt} of {companies} companies were bankrupt by the last step."),
        }
    })
}

/// Writes the report into `dir` on the base report ([`overview`]): the study's figures, its
/// sections and numbers, then every column's breakdowns; returns the study's numbers.
pub fn report(dir: &Path) -> Result<Report, ReportError> {
    report_and_text(dir).map(|(report, _)| report)
}

fn report_and_text(dir: &Path) -> Result<(Report, String), ReportError> {
    let run = Run::read(dir)?;
    let groups: Vec<GroupStats> = run
        .groups()
        .into_iter()
        .map(|(arm, p)| group_stats(&run, &arm, p))
        .collect();
    let figures = figures::draw(&run, dir)?;
    let report = Report {
        unfinished: crate::analysis::html::unfinished(&run.manifest),
        notes: notes(&run, &groups),
        tests: tests(&run),
        bankruptcies: bankruptcies(&run),
        timings: timings(&run.steps),
        groups,
        figures,
        manifest: run.manifest,
    };
    drop(run.cells);
    let own = Own {
        notes: Some(report.notes.clone()),
        html: render::html(&report),
        figures: report.figures.clone(),
        summary: Own::summary_of(&report)?,
        text: Some(render::text(&report)),
    };
    let options = overview::OverviewOptions {
        title: Some(report.manifest.name.clone()),
        ..Default::default()
    };
    let text = overview::write_with(dir, &options, own)?.summary;
    Ok((report, text))
}

/// Writes the report of the run in `dir` and returns its key numbers as text (the
/// registry's entry).
pub fn write(dir: &Path) -> Result<String, ReportError> {
    report_and_text(dir).map(|(_, text)| text)
}
