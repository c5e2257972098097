//! The report every scenario gets: per-step means of every numeric state column with 95%
//! intervals over replicates (by arm, and broken down by role, policy, population attribute
//! and group level), their distributions at the last step, the headline table, the caveats
//! of a scripted or mixed policy or a small model, and the run's timing. A scenario's own
//! report adds its own sections, figures and numbers on top of this one through
//! [`write_with`] and [`Own`]: the base places them on its page, in `summary.json` and at the
//! terminal, so that every report has the same top (the unfinished-run and caveat notes, the
//! run in one paragraph), the same breakdowns of every column, and the same timing.
//!
//! Files, in the run folder: `report.html`, `summary.json`, `means.csv` (every mean with its
//! interval, long format, for one's own analysis), and `figures/<column>.svg|png`.

use super::ReportError;
use super::caveats::{ScriptedRules, Study};
use super::counterfactual;
use super::format::{interval_text, number, slug, write_csv};
use super::html::{self, esc};
use super::plot::{self, Band, HistogramPanel, Histograms, Lines};
use super::state::{Table, flatten, texts, whole};
use super::stats::{Bounds, Summary};
use crate::record::{self, Manifest};
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// What a scenario tells the base report about itself.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The study it reproduces, for the small-model caveat (none: no such caveat).
    pub study: Option<Study>,
    /// Its scripted policy in words, for the scripted and mixed caveats.
    pub scripted: Option<ScriptedRules<'static>>,
    /// A title for the page (default: the run's name and scenario).
    pub title: Option<String>,
}

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
}

/// What the base report found: the means, and the text printed at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub columns: Vec<String>,
    pub means: Vec<Mean>,
    pub notes: Vec<String>,
    pub timing: Timing,
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
    /// the caveats the base would write from [`Options`]).
    pub notes: Option<Vec<String>>,
    /// Its sections of `report.html`, shown after the run's paragraph and before the base's
    /// breakdowns of every column.
    pub html: String,
    /// Its figures, already drawn (paths under the run folder, without their extension).
    pub figures: Vec<String>,
    /// Its numbers: the fields of this object sit at the top of `summary.json`, beside the
    /// base's (`columns`, `means`, `notes`, `timing`, `figures`, which win a clash).
    pub summary: serde_json::Map<String, serde_json::Value>,
    /// Its lines for the terminal, in place of the base's table of means.
    pub text: Option<String>,
}

impl Own {
    /// `numbers` as the scenario's part of `summary.json` (they must serialize as an object).
    pub fn summary_of(
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
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    /// Of prompt tokens, the share served from the prefix cache.
    pub prefix_hit_rate: f64,
}

/// Means per (arm, population, breakdown, value, step, column), each over its replicates,
/// with an interval that keeps to what the column's values can be (see [`interval_of`]);
/// and the columns whose Student's t intervals were cut at 0.
fn means(t: &Table) -> (Vec<Mean>, Vec<String>) {
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
    for s in &steps {
        t.seconds += s.seconds;
        t.decisions += s.decisions;
        t.prompt_tokens += s.prompt_tokens;
        t.cached_tokens += s.cached_tokens;
    }
    t.decisions_per_second = t.decisions as f64 / t.seconds.max(1e-9);
    t.prefix_hit_rate = t.cached_tokens as f64 / t.prompt_tokens.max(1) as f64;
    t
}

fn notes(m: &Manifest, options: &Options) -> Vec<String> {
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
pub fn write(dir: &Path, options: &Options) -> Result<Overview, ReportError> {
    write_with(dir, options, Own::default())
}

/// Writes the base report into `dir` with a scenario's own part in it.
pub fn write_with(dir: &Path, options: &Options, own: Own) -> Result<Overview, ReportError> {
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
    let figures_dir = dir.join("figures");
    std::fs::create_dir_all(&figures_dir)?;
    let mut figures = Vec::new();
    let last_step = table.step.iter().copied().max().unwrap_or(0) as usize;
    for column in &columns {
        let mut series: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
        for m in means
            .iter()
            .filter(|m| &m.column == column && m.by == "all")
        {
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
        let name = format!("mean_{}", slug(column));
        plot::save(
            &Lines {
                title: format!("{column}: mean per step, 95% interval over replicates"),
                x_label: "step".into(),
                y_label: column.clone(),
                series: series
                    .into_iter()
                    .map(|(name, points)| Band { name, points })
                    .collect(),
                markers: last_step <= 12,
            },
            &figures_dir.join(&name),
        )?;
        figures.push(format!("figures/{name}"));
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
    write_csv(&dir.join("means.csv"), &means)?;
    let base_figures = figures.len();
    let figures: Vec<String> = own.figures.into_iter().chain(figures).collect();
    let mut text = own
        .text
        .unwrap_or_else(|| summary_text(&manifest, &notes, &means, &timing, last_step));
    if let Some(c) = &comparison {
        text.push_str(&counterfactual::text(c));
    }
    let overview = Overview {
        summary: text,
        columns,
        means,
        notes,
        timing,
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
    let (own_figures, base_figures) = overview
        .figures
        .split_at(overview.figures.len() - base_figures);
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
}

/// The group levels of a run, innermost first, from its `groups.parquet` batches.
pub fn level_names(groups: &[RecordBatch]) -> Vec<String> {
    let mut names = Vec::new();
    for b in groups {
        if let Some(levels) = b.column_by_name("level").and_then(|c| texts(c.as_ref())) {
            for l in levels {
                if !names.contains(&l) {
                    names.push(l);
                }
            }
        }
    }
    names
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

/// `mean [low, high]`, or `mean (1 replicate: no interval)`.
fn with_interval(m: &Mean) -> String {
    interval_text(m.mean, m.ci_low.zip(m.ci_high), m.replicates)
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
        "{} ({}): {} steps in {:.1} s, {} decisions ({:.1}/s), prefix-cache hits {:.0}%",
        manifest.name,
        manifest.scenario,
        timing.steps,
        timing.seconds,
        timing.decisions,
        timing.decisions_per_second,
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
    let _ = writeln!(
        out,
        "at step {last_step}, mean [95% interval over replicates]:"
    );
    for m in headline(means, last_step) {
        let _ = writeln!(
            out,
            "  {} n={} {}: {}",
            m.arm,
            m.population,
            m.column,
            with_interval(m)
        );
    }
    out
}

fn page(
    manifest: &Manifest,
    options: &Options,
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
        "<h2>Timing</h2><p>{} steps in {:.1} s; {} decisions, {:.1} per second; {} prompt \
         tokens, {:.0}% of them from the prefix cache.</p>",
        t.steps,
        t.seconds,
        t.decisions,
        t.decisions_per_second,
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
    let cell = with_interval;
    let mut body = format!(
        "<h2>At step {last_step}</h2><p>Mean over agents, 95% interval over replicates.</p>"
    );
    body.push_str(&html::table(
        &[
            "arm",
            "agents",
            "column",
            "replicates",
            "mean [95% interval]",
        ],
        headline(&o.means, last_step).into_iter().map(|m| {
            vec![
                esc(&m.arm),
                m.population.to_string(),
                esc(&m.column),
                m.replicates.to_string(),
                cell(m),
            ]
        }),
    ));
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
                        cell(m),
                    ]
                }),
        ));
    }
    body
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
            b.column_by_name("level").and_then(|c| texts(c.as_ref())),
            b.column_by_name("step").and_then(|c| whole(c.as_ref())),
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
pub fn level_spreads_html(spreads: &[LevelSpread], step: usize) -> String {
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
