//! A counterfactual run beside its base (`[counterfactual] base = "runs/x"`): for each of its
//! arms, the step from which its state differs from the base arm's, and step by step the
//! difference in the mean of every numeric state column, paired by population size and
//! replicate (a replicate of both runs shares its seed, so its worlds and agents), with a 95%
//! interval over replicates.
//!
//! Files, in the run folder: `counterfactual.csv` (every difference, long format) and
//! `figures/difference_<column>.svg|png`.

use super::ReportError;
use super::format::{interval_text, number, slug, write_csv};
use super::html::{self, esc};
use super::plot::{self, Band, Lines};
use super::state::{Table, aggregates, flatten};
use super::stats::Summary;
use crate::record::{self, CounterfactualRecord};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::Path;

/// One column's difference at one step: this run's arm minus the base's, per replicate.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub arm: String,
    pub population: usize,
    pub step: usize,
    pub column: String,
    /// Replicates both runs have at this step.
    pub replicates: usize,
    /// The means over those replicates of the base's and the arm's means over agents.
    pub base: f64,
    pub mean: f64,
    pub difference: f64,
    /// The 95% interval of the mean difference over replicates; none with one replicate.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
}

/// Where one arm leaves the base.
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    pub arm: String,
    /// The first step whose state differs from the base's in some agent's row, of some
    /// replicate and population size; none when every step both ran is the same.
    pub from_step: Option<usize>,
    /// The steps both runs have.
    pub steps_compared: usize,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub base: String,
    pub base_arm: String,
    pub arms: Vec<Divergence>,
    /// What of this run the base has no counterpart of, and so was not compared, in words
    /// (`steps 5 to 8`); empty when every cell and step of this run was.
    pub not_compared: Vec<String>,
    pub differences: Vec<Difference>,
    /// Figures drawn (paths under the run folder, without their extension).
    pub figures: Vec<String>,
}

/// Per (population, replicate, step, column), the mean over agents; per (population,
/// replicate, step), a hash of every row in order. Both for one arm of a table.
#[derive(Default)]
struct Cells {
    means: BTreeMap<(u32, u32, u32, String), f64>,
    rows: BTreeMap<(u32, u32, u32), u64>,
}

fn cells_of(t: &Table, arm: &str) -> Cells {
    let Some(code) = t.arm.labels.iter().position(|l| l == arm) else {
        return Cells::default();
    };
    let mut sums: BTreeMap<(u32, u32, u32, usize), (f64, usize)> = BTreeMap::new();
    let mut hashers: BTreeMap<(u32, u32, u32), std::hash::DefaultHasher> = BTreeMap::new();
    for row in 0..t.arm.codes.len() {
        if t.arm.codes[row] as usize != code {
            continue;
        }
        let cell = (t.population[row], t.replicate[row], t.step[row]);
        let h = hashers.entry(cell).or_default();
        for (c, (_, values)) in t.numbers.iter().enumerate() {
            let v = values[row];
            v.to_bits().hash(h);
            if !v.is_nan() {
                let e = sums.entry((cell.0, cell.1, cell.2, c)).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
        for (_, coded) in &t.by {
            coded.labels[coded.codes[row] as usize].hash(h);
        }
    }
    Cells {
        means: sums
            .into_iter()
            .map(|((p, r, s, c), (sum, n))| ((p, r, s, t.numbers[c].0.clone()), sum / n as f64))
            .collect(),
        rows: hashers.into_iter().map(|(k, h)| (k, h.finish())).collect(),
    }
}

/// Compares the run in `dir` (whose state is `ours`) with its base: by their state tables,
/// and by their aggregates tables where the scenario writes one (a game's target and winning
/// number live there, not in any player's row). An aggregates column named as a state column
/// is shown as `aggregates.<name>`.
pub(super) fn compare(
    dir: &Path,
    ours: &Table,
    cf: &CounterfactualRecord,
    levels: &[String],
) -> Result<Comparison, ReportError> {
    let base_dir = Path::new(&cf.base);
    let base = flatten(&record::read_state(base_dir)?, levels)?;
    // (this run's table, the base arm's cells in the base's, prefix of its columns): the base
    // arm is summed once, whatever the number of arms set beside it.
    let mut tables: Vec<(&Table, Cells, &str)> = vec![(ours, cells_of(&base, &cf.arm), "")];
    let ours_aggregates;
    let (mine, theirs) = (
        dir.join(record::AGGREGATES),
        base_dir.join(record::AGGREGATES),
    );
    if mine.exists() && theirs.exists() {
        ours_aggregates = aggregates(&mine)?;
        tables.push((
            &ours_aggregates,
            cells_of(&aggregates(&theirs)?, &cf.arm),
            "aggregates.",
        ));
    }
    let state_columns: Vec<&String> = ours.numbers.iter().map(|(n, _)| n).collect();
    let mut arms = Vec::new();
    let mut differences = Vec::new();
    let mut names: Vec<&String> = ours.arm.labels.iter().collect();
    names.sort();
    for arm in names {
        let mut from_step: Option<usize> = None;
        let mut steps = std::collections::BTreeSet::new();
        // (population, step, column) -> per replicate (base, arm).
        let mut paired: BTreeMap<(u32, u32, String), Vec<(f64, f64)>> = BTreeMap::new();
        for (ours, theirs, prefix) in &tables {
            let mine = cells_of(ours, arm);
            for (k, h) in &mine.rows {
                if let Some(t) = theirs.rows.get(k) {
                    steps.insert(k.2);
                    if t != h {
                        from_step = Some(from_step.map_or(k.2 as usize, |f| f.min(k.2 as usize)));
                    }
                }
            }
            for ((p, r, step, column), &value) in &mine.means {
                if let Some(&b) = theirs.means.get(&(*p, *r, *step, column.clone())) {
                    let name = match !prefix.is_empty() && state_columns.contains(&column) {
                        true => format!("{prefix}{column}"),
                        false => column.clone(),
                    };
                    paired
                        .entry((*p, *step, name))
                        .or_default()
                        .push((b, value));
                }
            }
        }
        arms.push(Divergence {
            arm: arm.clone(),
            from_step,
            steps_compared: steps.len(),
        });
        for ((population, step, column), pairs) in paired {
            let d: Vec<f64> = pairs.iter().map(|(b, a)| a - b).collect();
            let Some(s) = Summary::of(&d) else { continue };
            let (ci_low, ci_high) = s.interval().unzip();
            let n = pairs.len() as f64;
            differences.push(Difference {
                arm: arm.clone(),
                population: population as usize,
                step: step as usize,
                column,
                replicates: pairs.len(),
                base: pairs.iter().map(|p| p.0).sum::<f64>() / n,
                mean: pairs.iter().map(|p| p.1).sum::<f64>() / n,
                difference: s.mean,
                ci_low,
                ci_high,
            });
        }
    }
    let not_compared = not_compared(ours, &tables[0].1);
    write_csv(&dir.join("counterfactual.csv"), &differences)?;
    let figures = draw(dir, &differences)?;
    Ok(Comparison {
        base: cf.base.clone(),
        base_arm: cf.arm.clone(),
        arms,
        not_compared,
        differences,
        figures,
    })
}

/// The population sizes, replicates and steps of this run (`ours`) that the base's arm
/// (`base`) does not have: a base that ran fewer steps or replicates, or other sizes, is set
/// beside this run only where both have cells, and the report says what was left out.
fn not_compared(ours: &Table, base: &Cells) -> Vec<String> {
    use std::collections::BTreeSet;
    let theirs: [BTreeSet<u32>; 3] = [
        base.rows.keys().map(|k| k.0).collect(),
        base.rows.keys().map(|k| k.1).collect(),
        base.rows.keys().map(|k| k.2).collect(),
    ];
    let mine: [BTreeSet<u32>; 3] = [
        ours.population.iter().copied().collect(),
        ours.replicate.iter().copied().collect(),
        ours.step.iter().copied().collect(),
    ];
    let mut out = Vec::new();
    for ((what, mine), theirs) in ["population sizes", "replicates", "steps"]
        .iter()
        .zip(&mine)
        .zip(&theirs)
    {
        let missing: Vec<u32> = mine.difference(theirs).copied().collect();
        if missing.is_empty() {
            continue;
        }
        let had = match theirs.is_empty() {
            true => "none".to_string(),
            false => spans(&theirs.iter().copied().collect::<Vec<_>>()),
        };
        out.push(format!(
            "this run's {what} {} (the base has {had})",
            spans(&missing)
        ));
    }
    out
}

/// Sorted numbers as runs: `0, 2 to 5, 9`.
fn spans(sorted: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => sorted[i].to_string(),
            1 => format!("{}, {}", sorted[i], sorted[j]),
            _ => format!("{} to {}", sorted[i], sorted[j]),
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// One figure per column: each arm's difference from the base per step, with its interval.
fn draw(dir: &Path, differences: &[Difference]) -> Result<Vec<String>, ReportError> {
    // Column -> series name -> (step, difference, low, high).
    type Series = BTreeMap<String, Vec<(f64, f64, f64, f64)>>;
    let mut by_column: BTreeMap<&str, Series> = BTreeMap::new();
    for d in differences {
        by_column
            .entry(&d.column)
            .or_default()
            .entry(format!("{} (n={})", d.arm, d.population))
            .or_default()
            .push((
                d.step as f64,
                d.difference,
                d.ci_low.unwrap_or(d.difference),
                d.ci_high.unwrap_or(d.difference),
            ));
    }
    let figures_dir = dir.join("figures");
    std::fs::create_dir_all(&figures_dir)?;
    let mut figures = Vec::new();
    for (column, series) in by_column {
        let name = format!("difference_{}", slug(column));
        let steps = series.values().map(Vec::len).max().unwrap_or(0);
        plot::save(
            &Lines {
                title: format!("{column}: arm minus base per step, 95% interval over replicates"),
                x_label: "step".into(),
                y_label: format!("difference in {column}"),
                series: series
                    .into_iter()
                    .map(|(name, points)| Band { name, points })
                    .collect(),
                markers: steps <= 13,
            },
            &figures_dir.join(&name),
        )?;
        figures.push(format!("figures/{name}"));
    }
    Ok(figures)
}

fn diverges(d: &Divergence) -> String {
    match d.from_step {
        Some(step) => format!("diverges from the base at step {step}"),
        // No population size, replicate and step in common: "does not diverge in the 0
        // steps both ran" read as agreement.
        None if d.steps_compared == 0 => {
            "has no cell in common with the base (no population size, replicate and step that \
             both ran), so nothing was compared"
                .to_string()
        }
        None => format!(
            "does not diverge from the base in the {} steps both ran",
            d.steps_compared
        ),
    }
}

/// The sentence on what the base has no counterpart of, if anything.
fn not_compared_text(c: &Comparison) -> Option<String> {
    (!c.not_compared.is_empty()).then(|| {
        format!(
            "Not compared, as the base did not run them: {}.",
            c.not_compared.join("; ")
        )
    })
}

fn with_interval(d: &Difference) -> String {
    interval_text(d.difference, d.ci_low.zip(d.ci_high), d.replicates)
}

/// The differences worth a line: those at the last step that are not zero.
fn last_nonzero<'a>(c: &'a Comparison, arm: &str) -> Vec<&'a Difference> {
    let last = c
        .differences
        .iter()
        .filter(|d| d.arm == arm)
        .map(|d| d.step)
        .max();
    c.differences
        .iter()
        .filter(|d| d.arm == arm && Some(d.step) == last && d.difference != 0.0)
        .collect()
}

/// The comparison's lines for the terminal.
pub fn text(c: &Comparison) -> String {
    let mut out = format!("against base {} (arm `{}`):\n", c.base, c.base_arm);
    if let Some(line) = not_compared_text(c) {
        let _ = writeln!(out, "  {line}");
    }
    for a in &c.arms {
        let _ = writeln!(out, "  arm `{}` {}", a.arm, diverges(a));
        for d in last_nonzero(c, &a.arm) {
            let _ = writeln!(
                out,
                "    n={} step {} {}: {} -> {}, difference {}",
                d.population,
                d.step,
                d.column,
                number(d.base),
                number(d.mean),
                with_interval(d)
            );
        }
    }
    out
}

/// The comparison's section of `report.html`.
pub fn html(c: &Comparison) -> String {
    let mut body = format!(
        "<h2>Against the base run</h2><p>Each arm beside the base run <code>{}</code> (its arm \
         <b>{}</b>), replicate by replicate: a replicate of both runs draws the same worlds and \
         agents from the seed, so a difference is the change's own. Differences are arm minus \
         base, the mean over agents of each column, with a 95% interval over replicates \
         (<code>counterfactual.csv</code> has every step and column).</p><ul>",
        esc(&c.base),
        esc(&c.base_arm)
    );
    for a in &c.arms {
        let _ = write!(body, "<li>Arm <b>{}</b> {}.</li>", esc(&a.arm), diverges(a));
    }
    body.push_str("</ul>");
    if let Some(line) = not_compared_text(c) {
        let _ = write!(body, "<p>{}</p>", esc(&line));
    }
    // Every step from the first that diverges, every column that differs somewhere.
    let first = c.arms.iter().filter_map(|a| a.from_step).min();
    let differs: std::collections::BTreeSet<&str> = c
        .differences
        .iter()
        .filter(|d| d.difference != 0.0)
        .map(|d| d.column.as_str())
        .collect();
    if let Some(first) = first {
        let rows = c
            .differences
            .iter()
            .filter(|d| d.step >= first && differs.contains(d.column.as_str()))
            .map(|d| {
                vec![
                    esc(&d.arm),
                    d.population.to_string(),
                    d.step.to_string(),
                    esc(&d.column),
                    number(d.base),
                    number(d.mean),
                    with_interval(d),
                ]
            });
        body.push_str(&html::table(
            &[
                "arm",
                "agents",
                "step",
                "column",
                "base",
                "arm",
                "difference [95% interval]",
            ],
            rows,
        ));
    }
    body.push_str(&html::figures(&c.figures));
    body
}
