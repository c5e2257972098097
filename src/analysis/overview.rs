//! The report every scenario gets: per-step means of every numeric state column with 95%
//! intervals over replicates (by arm, and broken down by role, policy, population attribute
//! and group level), their distributions at the last step, the same means of the study's own
//! per-cell measures (`aggregates.csv`, [`super::aggregates`]), the headline table, the caveats
//! of a scripted or mixed policy or a small model, and the run's timing. A scenario's own
//! report adds its own sections, figures and numbers on top of this one through
//! [`write_with`] and [`Own`]: the base places them on its page, in `summary.json` and at the
//! terminal, so that every report has the same top (the unfinished-run and caveat notes, the
//! run in one paragraph), the same breakdowns of every column, and the same timing.
//!
//! Files, in the run folder: `report.html`, `summary.json`, `means.csv` (every mean with its
//! interval, long format, for one's own analysis), `figures/<column>.svg|png` and
//! `figures/aggregate_<column>.svg|png`.

use super::ReportError;
use super::aggregates::{self, Aggregates};
use super::arm_tests::{self, ArmTest};
use super::caveats::{ScriptedRules, Study};
use super::column_figures;
use super::counterfactual;
use super::format::write_csv;
use super::html::{self, esc};
use super::levels::level_spreads_html;
pub use super::levels::{LevelSpread, level_names, level_spreads};
pub use super::means::Mean;
use super::means::{means, table_html};
use super::state::{Table, flatten};
use super::stats::Bounds;
use crate::record::{self, Manifest};
use arrow_array::RecordBatch;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// What a scenario tells the base report about itself.
#[derive(Debug, Clone, Default)]
pub struct OverviewOptions {
    /// The study it reproduces, for the small-model caveat (none: no such caveat).
    pub study: Option<Study>,
    /// Its scripted policy in words, for the scripted and mixed caveats.
    pub scripted: Option<ScriptedRules<'static>>,
    /// A title for the page (default: the run's name and scenario).
    pub title: Option<String>,
}

/// What the base report found: the means, and the text printed at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub columns: Vec<String>,
    pub means: Vec<Mean>,
    /// The means per step of the study's own per-cell measures (`aggregates.csv`), each over
    /// the replicates, by arm and population.
    pub aggregates: Vec<Mean>,
    pub notes: Vec<String>,
    pub timing: Timing,
    /// Every arm against the first at the last step (none with one arm).
    pub arm_tests: Vec<ArmTest>,
    /// Every figure of the page, the scenario's first (paths under the run folder, without
    /// their extension).
    pub figures: Vec<String>,
    #[serde(skip)]
    pub summary: String,
}

/// A scenario's own part of its report, which [`write_with`] places on the base's page, in its
/// `summary.json` and at the terminal.
#[derive(Debug, Default)]
pub struct Own {
    /// The notes a reader must see first, when the scenario words them itself (they replace
    /// the caveats the base would write from [`OverviewOptions`]).
    pub notes: Option<Vec<String>>,
    /// Its sections of `report.html`, shown after the run's paragraph and before the base's
    /// breakdowns of every column.
    pub html: String,
    /// Its figures, already drawn (paths under the run folder, without their extension).
    pub figures: Vec<String>,
    /// Its numbers: the fields of this object sit at the top of `summary.json`, beside the
    /// base's (`columns`, `means`, `aggregates`, `notes`, `timing`, `figures`, which win a
    /// clash).
    pub summary: serde_json::Map<String, serde_json::Value>,
    /// Its lines for the terminal, in place of the base's table of means.
    pub text: Option<String>,
}

impl Own {
    /// `numbers` as the scenario's part of `summary.json` (they must serialize as an object).
    pub(crate) fn summary_of(
        numbers: &impl Serialize,
    ) -> Result<serde_json::Map<String, serde_json::Value>, ReportError> {
        match serde_json::to_value(numbers) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            Ok(other) => Err(ReportError::Message(format!(
                "a scenario's report numbers must be a JSON object for summary.json, not {other}"
            ))),
            Err(e) => Err(ReportError::Message(format!(
                "a scenario's report numbers could not be written as JSON: {e}"
            ))),
        }
    }
}

/// How long the run took and how fast it decided.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timing {
    pub steps: usize,
    pub seconds: f64,
    pub decisions: usize,
    pub decisions_per_second: f64,
    /// Of `decisions`, those of the LLM policy and their rate, and those of scripted rules:
    /// `None` for a run recorded before they were kept apart.
    pub model_decisions: Option<usize>,
    pub model_decisions_per_second: Option<f64>,
    pub scripted_decisions: Option<usize>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Of prompt tokens, the share served from the prefix cache.
    pub prefix_hit_rate: f64,
}

/// The note on how the intervals of shares (columns whose values all lie in [0, 1]) are made,
/// naming those columns, with the replicates and agents they rest on.
fn share_note(table: &Table, manifest: &Manifest) -> Option<String> {
    let shares: Vec<String> = table
        .numbers
        .iter()
        .filter(|(_, values)| Bounds::of(values.iter().copied()) == Bounds::Share)
        .map(|(name, _)| format!("`{name}`"))
        .collect();
    if shares.is_empty() || manifest.replicates < 2 {
        return None;
    }
    let r = manifest.replicates;
    Some(format!(
        "{} lie in [0, 1]: their 95% intervals are Wilson's score intervals at the effective \
         number of observations the spread of the {r} replicates implies (p(1 - p) / se^2, \
         Kish) with Student's t quantile for {r} replicates, or, where the replicates agree as \
         much as independent agents would or more, at the agents pooled over them (the \
         population size times {r}) with the normal quantile: they stay in [0, 1] and never \
         widen as the replicates agree more.",
        shares.join(", ")
    ))
}

/// The note on intervals cut at 0, naming their columns.
fn cut_note(columns: &[String]) -> Option<String> {
    if columns.is_empty() {
        return None;
    }
    let named: Vec<String> = columns.iter().map(|c| format!("`{c}`")).collect();
    Some(format!(
        "Some 95% intervals of {} reached below 0, where none of the column's values lie, and \
         are cut at 0: with few replicates Student's t is wide; more replicates narrow it.",
        named.join(", ")
    ))
}

fn timing(dir: &Path) -> Timing {
    let Ok(steps) = record::read_steps(dir) else {
        return Timing::default();
    };
    let mut t = Timing {
        steps: steps.len(),
        ..Timing::default()
    };
    let mut split = Some((0, 0));
    for s in &steps {
        t.seconds += s.seconds;
        t.decisions += s.decisions;
        t.prompt_tokens += s.prompt_tokens;
        t.cached_tokens += s.cached_tokens;
        split = split
            .zip(s.split())
            .map(|((m, k), (sm, sk))| (m + sm, k + sk));
    }
    t.decisions_per_second = t.decisions as f64 / t.seconds.max(1e-9);
    if let Some((model, scripted)) = split {
        t.model_decisions = Some(model);
        t.model_decisions_per_second = Some(model as f64 / t.seconds.max(1e-9));
        t.scripted_decisions = Some(scripted);
    }
    t.prefix_hit_rate = t.cached_tokens as f64 / t.prompt_tokens.max(1) as f64;
    t
}

impl Timing {
    /// The run's decisions in words: the model's and their rate apart from the scripted ones,
    /// which cost nothing and would inflate a rate of the model.
    pub fn decisions_said(&self) -> String {
        match (self.model_decisions, self.scripted_decisions) {
            (Some(0), Some(scripted)) => format!("{scripted} scripted decisions"),
            (Some(model), Some(scripted)) => {
                let rate = self.model_decisions_per_second.unwrap_or_default();
                match scripted {
                    0 => format!("{model} model decisions ({rate:.1}/s)"),
                    _ => format!(
                        "{model} model decisions ({rate:.1}/s) and {scripted} scripted decisions"
                    ),
                }
            }
            _ => format!(
                "{} decisions ({:.1}/s)",
                self.decisions, self.decisions_per_second
            ),
        }
    }
}

fn notes(m: &Manifest, options: &OverviewOptions) -> Vec<String> {
    match (&options.study, &options.scripted) {
        (Some(study), Some(scripted)) => super::caveats::notes(m, study, scripted, String::new),
        _ => match m.policy.as_str() {
            "scripted" => vec![format!(
                "Scripted policy: every decision came from the scenario's scripted rules{}, not \
                 a language model. These numbers test the rules, the records and the report.",
                options
                    .scripted
                    .map(|s| format!(" ({})", s.agents))
                    .unwrap_or_default()
            )],
            "mixed" => vec![
                "Mixed policy: some agents decided through the model, the others by scripted \
                 rules; the `policy` column says which. Differences between them are \
                 differences between policies as much as between agents."
                    .to_string(),
            ],
            _ => Vec::new(),
        },
    }
}

/// Writes the base report into `dir` (see the module's documentation).
pub fn write(dir: &Path, options: &OverviewOptions) -> Result<Overview, ReportError> {
    write_with(dir, options, Own::default())
}

/// Writes the base report into `dir` with a scenario's own part in it.
pub fn write_with(
    dir: &Path,
    options: &OverviewOptions,
    own: Own,
) -> Result<Overview, ReportError> {
    let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
    let groups = record::read_table(dir, record::GROUPS).unwrap_or_default();
    let levels: Vec<String> = level_names(&groups);
    let state = record::read_state(dir)?;
    let table = flatten(&state, &levels)?;
    let (means, cut) = means(&table);
    let columns: Vec<String> = table.numbers.iter().map(|(n, _)| n.clone()).collect();
    let mut notes = match own.notes {
        Some(notes) => notes,
        None => notes(&manifest, options),
    };
    notes.extend(cut_note(&cut));
    notes.extend(share_note(&table, &manifest));
    let comparison = match &manifest.counterfactual {
        None => None,
        Some(cf) => match counterfactual::compare(dir, &table, cf, &levels) {
            Ok(c) => Some(c),
            Err(e) => {
                notes.push(format!(
                    "The base run {} could not be read ({e}), so this report does not set the \
                     run beside it: put the base back where it was and run `throng report` on \
                     this folder",
                    cf.base
                ));
                None
            }
        },
    };
    let timing = timing(dir);
    let last_step = table.step.iter().copied().max().unwrap_or(0) as usize;
    let arm_tests = arm_tests::arm_tests(&means, &manifest.arms, last_step);
    let figures = column_figures::draw(dir, &table, &means, &columns, last_step)?;
    write_csv(&dir.join("means.csv"), &means)?;
    let aggregates = aggregates::read(dir)?.unwrap_or_default();
    notes.extend(cut_note(&aggregates.cut));
    // The study's figures, then its aggregates', then every column's.
    let (own_count, aggregate_count) = (own.figures.len(), aggregates.figures.len());
    let figures: Vec<String> = own
        .figures
        .into_iter()
        .chain(aggregates.figures.iter().cloned())
        .chain(figures)
        .collect();
    let own_text_is_base = own.text.is_none();
    let mut text = own
        .text
        .unwrap_or_else(|| summary_text(&manifest, &notes, &means, &timing, last_step));
    if own_text_is_base {
        text.push_str(&aggregates_text(&aggregates, last_step));
        text.push_str(&arm_tests::text(&arm_tests));
    }
    if let Some(c) = &comparison {
        text.push_str(&counterfactual::text(c));
    }
    let overview = Overview {
        summary: text,
        columns,
        means,
        aggregates: aggregates.means.clone(),
        notes,
        timing,
        arm_tests,
        figures,
    };
    let mut summary = own.summary;
    if let Some(c) = &comparison {
        summary.insert(
            "counterfactual".into(),
            serde_json::to_value(c).unwrap_or_default(),
        );
    }
    summary.extend(Own::summary_of(&overview)?);
    record::write_json_atomic(&dir.join("summary.json"), &summary)?;
    let (own_figures, rest) = overview.figures.split_at(own_count);
    let base_figures = &rest[aggregate_count..];
    let page = page(
        &manifest,
        options,
        &overview,
        Sections {
            own: &own.html,
            own_figures,
            counterfactual: &comparison
                .as_ref()
                .map(counterfactual::html)
                .unwrap_or_default(),
            base_figures,
            aggregates: &aggregates.html(last_step),
            arm_tests: &arm_tests::html(&overview.arm_tests),
        },
        &groups,
        last_step,
    );
    let path = dir.join("report.html");
    std::fs::write(&path, page).map_err(|source| ReportError::Write { path, source })?;
    Ok(overview)
}

/// What goes on the page besides the base's numbers.
struct Sections<'a> {
    own: &'a str,
    own_figures: &'a [String],
    /// The run beside its base, for a counterfactual run.
    counterfactual: &'a str,
    base_figures: &'a [String],
    /// The study's own measures, when it keeps aggregates.
    aggregates: &'a str,
    /// Every arm against the first, when the run has several.
    arm_tests: &'a str,
}

fn headline(means: &[Mean], last_step: usize) -> Vec<&Mean> {
    means
        .iter()
        .filter(|m| m.by == "all" && m.step == last_step)
        .collect()
}

fn summary_text(
    manifest: &Manifest,
    notes: &[String],
    means: &[Mean],
    timing: &Timing,
    last_step: usize,
) -> String {
    let mut out = String::new();
    for n in notes {
        let _ = writeln!(out, "note: {n}");
    }
    let _ = writeln!(
        out,
        "{} ({}): {} steps in {:.1} s, {}, prefix-cache hits {:.0}%",
        manifest.name,
        manifest.scenario,
        timing.steps,
        timing.seconds,
        timing.decisions_said(),
        timing.prefix_hit_rate * 100.0
    );
    if let Some(r) = &manifest.reuse {
        let _ = writeln!(
            out,
            "reused {} decisions from {} (about {:.1} s of model time saved)",
            r.reused,
            r.sources.join(", "),
            r.saved_seconds
        );
    }
    out.push_str(&last_step_text(means, last_step));
    out
}

/// The means at the last step, for the terminal: per role where agents play several (a mean
/// over proposers and responders together says nothing of either, as `means.csv` knows),
/// else over every agent.
fn last_step_text(means: &[Mean], last_step: usize) -> String {
    let by_role: Vec<&Mean> = means
        .iter()
        .filter(|m| m.by == "role" && m.step == last_step)
        .collect();
    let (title, lines) = match by_role.is_empty() {
        true => ("", headline(means, last_step)),
        false => ("by role, ", by_role),
    };
    let mut out = format!("at step {last_step}, {title}mean [95% interval over replicates]:\n");
    for m in lines {
        let _ = writeln!(out, "{}", m.line(!title.is_empty()));
    }
    out
}

/// The study's own measures at the last step, for the text printed at the end of a run.
fn aggregates_text(aggregates: &Aggregates, last_step: usize) -> String {
    let mut out = String::new();
    let mut at = aggregates.at(last_step).peekable();
    if at.peek().is_some() {
        let _ = writeln!(
            out,
            "the study's own measures (aggregates.csv) at step {last_step}:"
        );
    }
    for m in at {
        let _ = writeln!(out, "{}", m.line(false));
    }
    out
}

fn page(
    manifest: &Manifest,
    options: &OverviewOptions,
    o: &Overview,
    sections: Sections<'_>,
    groups: &[RecordBatch],
    last_step: usize,
) -> String {
    let title = options
        .title
        .clone()
        .unwrap_or_else(|| format!("{} ({})", manifest.name, manifest.scenario));
    let mut body = html::unfinished_note(manifest);
    body.push_str(&html::notes_html(&o.notes));
    let _ = write!(body, "<h1>{}</h1>", esc(&title));
    body.push_str(&run_paragraph(manifest));
    body.push_str(sections.own);
    if !sections.own_figures.is_empty() {
        body.push_str("<h2>Figures</h2>");
        body.push_str(&html::figures(sections.own_figures));
    }
    body.push_str(sections.counterfactual);
    body.push_str(sections.arm_tests);
    body.push_str(sections.aggregates);
    // A scenario's own sections come first; its every-column breakdowns fold away under
    // them, where a reader looking for one column finds it.
    let own = !sections.own.is_empty();
    body.push_str(&level_spreads_html(&level_spreads(groups), last_step));
    let columns = columns_html(o, last_step);
    if own {
        let _ = write!(
            body,
            "<details><summary><b>Every numeric column</b>: means per step with 95% intervals \
             over replicates, by arm and breakdown (<code>means.csv</code> has them all)\
             </summary>{columns}"
        );
    } else {
        body.push_str(&columns);
    }
    if !sections.base_figures.is_empty() {
        body.push_str(if own {
            "<h3>Every column's figures</h3>"
        } else {
            "<h2>Figures</h2>"
        });
        body.push_str(&html::figures(sections.base_figures));
    }
    if own {
        body.push_str("</details>");
    }
    let t = &o.timing;
    let _ = write!(
        body,
        "<h2>Timing</h2><p>{} steps in {:.1} s; {}; {} prompt tokens, {:.0}% of them from \
         the prefix cache.</p>",
        t.steps,
        t.seconds,
        html::esc(&t.decisions_said()),
        t.prompt_tokens,
        t.prefix_hit_rate * 100.0
    );
    html::page(&title, &body)
}

/// The run in one paragraph: what ran it, and what became of its decisions.
fn run_paragraph(m: &Manifest) -> String {
    let mut p = format!(
        "<p>Scenario <b>{}</b>, policy <b>{}</b>, model <b>{}</b>, seed {}, {} replicate{}, {} \
         steps; {} decisions in {:.1} s, {} fell back (no valid reply), {} clamped.",
        esc(&m.scenario),
        esc(&m.policy),
        esc(m.model.as_deref().unwrap_or("-")),
        m.seed,
        m.replicates,
        if m.replicates == 1 { "" } else { "s" },
        m.steps,
        m.counters.decisions,
        m.counters.seconds,
        m.counters.fallbacks,
        m.counters.clamped
    );
    if let Some(r) = &m.reuse {
        let _ = write!(
            p,
            " {} decisions were taken from earlier runs ({}) instead of the model, saving about \
             {:.1} s of model time.",
            r.reused,
            esc(&r.sources.join(", ")),
            r.saved_seconds
        );
    }
    p.push_str("</p>");
    p
}

/// The means of every numeric column at the last step, whole and by each breakdown.
fn columns_html(o: &Overview, last_step: usize) -> String {
    let mut body = format!(
        "<h2>At step {last_step}</h2><p>Mean over agents, 95% interval over replicates.</p>"
    );
    body.push_str(&table_html(headline(&o.means, last_step).into_iter()));
    let breakdowns: std::collections::BTreeSet<&str> = o
        .means
        .iter()
        .map(|m| m.by.as_str())
        .filter(|b| *b != "all")
        .collect();
    for by in breakdowns {
        let _ = write!(body, "<h2>By {} at step {last_step}</h2>", esc(by));
        body.push_str(&html::table(
            &["arm", "agents", by, "column", "mean [95% interval]"],
            o.means
                .iter()
                .filter(|m| m.by == by && m.step == last_step)
                .map(|m| {
                    vec![
                        esc(&m.arm),
                        m.population.to_string(),
                        esc(&m.value),
                        esc(&m.column),
                        m.shown(),
                    ]
                }),
        ));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(by: &str, value: &str, column: &str, mean: f64) -> Mean {
        Mean {
            arm: "a".into(),
            population: 40,
            by: by.into(),
            value: value.into(),
            step: 5,
            column: column.into(),
            replicates: 3,
            mean,
            ci_low: Some(mean - 1.0),
            ci_high: Some(mean + 1.0),
            per_replicate: vec![mean - 1.0, mean, mean + 1.0],
        }
    }

    // Guards against issue 42, item 8: an ultimatum game's terminal summary averaged payoff
    // over proposers and responders together.
    #[test]
    fn the_last_step_is_shown_per_role_where_agents_play_several() {
        let means = [
            mean("all", "all", "payoff", 5.0),
            mean("role", "proposer", "payoff", 7.0),
            mean("role", "responder", "payoff", 3.0),
        ];
        let text = last_step_text(&means, 5);
        assert!(text.contains("by role"), "{text}");
        assert!(text.contains("a n=40 proposer payoff: 7"), "{text}");
        assert!(text.contains("a n=40 responder payoff: 3"), "{text}");
        assert!(
            !text.contains("payoff: 5"),
            "no mean over both roles: {text}"
        );
        // One role: over every agent.
        let text = last_step_text(&means[..1], 5);
        assert!(text.contains("a n=40 payoff: 5"), "{text}");
    }
}
