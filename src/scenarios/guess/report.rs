//! The guessing game's report, as the study reported it: a per-round table (winning number,
//! winners, mean, median, std, min, max, round wall time), the distribution of guesses in
//! every round, the mean and the target over rounds, and the mean guess by group
//! (education, occupation, age band, or any attribute of the population).
//!
//! Games are the unit of independence: intervals of round statistics are computed over
//! replicates (one game each). Within round 1 agents decide independently of each other
//! (nobody has seen a result yet), so group means there get intervals across agents.

use super::records::GROUP_ROUNDS;
pub use super::records::{Round, RoundRow};
use super::rules;
use crate::analysis::caveats;
use crate::analysis::html::{esc, headline, table, unfinished};
use crate::analysis::overview::{self, LevelSpread, Own, level_spreads};
use crate::analysis::plot::{
    self, Band, BarSeries, Bars, HistogramPanel, Histograms, Lines, PlotError,
};
use crate::analysis::stats::Summary;
use crate::analysis::{ColumnProblem, ReportError};
use crate::record::{self, Manifest, StepRecord};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{ArrowError, DataType};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// A round's statistics over the replicates of one arm and population.
#[derive(Debug, Clone, Serialize)]
pub struct RoundSummary {
    pub arm: String,
    pub population: usize,
    pub round: usize,
    pub replicates: usize,
    /// Mean guess: mean over games, with a 95% CI over games when there are at least 2.
    pub mean: Option<Summary>,
    pub target: Option<f64>,
    /// Mean over games of the winning number (the lower one where two won).
    pub winning_number: Option<f64>,
    /// Games in which guesses on both sides of the target were equally close, and the mean
    /// of the higher winning number in those games.
    pub two_sided_ties: usize,
    pub tied_winning_number: Option<f64>,
    /// Mean over games of the agents who guessed a winning number.
    pub winners: f64,
    pub median: Option<f64>,
    pub std: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub guesses: f64,
    pub players: usize,
    /// Wall time of the step that played the round (all cells of the population at once).
    pub seconds: Option<f64>,
    pub equilibrium: Option<f64>,
}

/// One model's mean guess in one round, where the agents of a game ask several models.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRound {
    pub arm: String,
    pub population: usize,
    pub round: usize,
    pub model: String,
    /// Mean over games of the model's agents' mean guess, with a 95% CI over games (as the
    /// round table's): after round 1 a game's agents have seen the same results, so its
    /// agents are not independent draws, its games are.
    pub mean: Option<Summary>,
    pub games: usize,
    /// The model's agents in a game.
    pub agents: usize,
}

/// Round 1's mean guess of one group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupMean {
    pub arm: String,
    pub attribute: String,
    pub group: String,
    pub mean: Option<Summary>,
}

/// A target rule of the run and its equilibrium, in words.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleEquilibrium {
    /// `2/3 of the average`, `5 plus 1/2 of the average`.
    pub rule: String,
    /// The arms that play it.
    pub arms: Vec<String>,
    pub equilibrium: Option<f64>,
    /// Which equilibrium the clamped rule has, and why.
    pub explanation: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub manifest: Manifest,
    /// Lines a reader must see first: a model smaller than the study's, scripted players.
    pub notes: Vec<String>,
    /// Every target rule of the run (one unless arms change it), with its equilibrium.
    pub rules: Vec<RuleEquilibrium>,
    pub rounds: Vec<RoundSummary>,
    /// Every round by model, when a game's agents ask several models (empty otherwise).
    pub models: Vec<ModelRound>,
    pub groups: Vec<GroupMean>,
    /// Under `[[population.groups]]`: how each level's groups differ in their mean guess and
    /// share of winners at the last round.
    pub levels: Vec<LevelSpread>,
    pub figures: Vec<String>,
}

/// Welford's running mean and variance.
#[derive(Debug, Clone, Copy, Default)]
struct Running {
    n: usize,
    mean: f64,
    m2: f64,
}

impl Running {
    fn push(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Chan et al.'s parallel combination of two running moments.
    fn merge(&mut self, other: &Running) {
        if other.n == 0 {
            return;
        }
        let n = self.n + other.n;
        let d = other.mean - self.mean;
        self.mean += d * other.n as f64 / n as f64;
        self.m2 += other.m2 + d * d * self.n as f64 * other.n as f64 / n as f64;
        self.n = n;
    }

    /// Student's t interval across agents (the moments are all a million agents leave),
    /// cut at the bounds a mean guess cannot leave: with few or skewed guesses the t interval
    /// would otherwise reach below 0 or above 100.
    fn summary(&self) -> Option<Summary> {
        Summary::from_moments(self.n, self.mean, self.m2).map(within_guess_bounds)
    }
}

/// `s` with its interval cut at the guesses' bounds.
fn within_guess_bounds(mut s: Summary) -> Summary {
    let top = rules::MAX_GUESS as f64 / rules::SCALE as f64;
    s.ci_low = s.ci_low.clamp(0.0, top);
    s.ci_high = s.ci_high.clamp(0.0, top);
    s
}

const BINS: usize = 50;

/// What is gathered from the state table in one pass.
#[derive(Default)]
struct Gathered {
    /// (arm, population, round) -> counts per bin of width 2.
    histograms: BTreeMap<(String, usize, usize), [u64; BINS]>,
    /// (arm, attribute, group) -> round 1 guesses.
    groups: BTreeMap<(String, String, String), Running>,
    /// Attribute columns in table order, each with its groups in the population's order
    /// (categories as declared, numeric bands from low to high).
    attributes: Vec<(String, Vec<String>)>,
    /// (arm, population, round, model, replicate) -> guesses, under a `model` column.
    model_games: BTreeMap<(String, usize, usize, String, u64), Running>,
}

/// A column as dictionary keys and their labels (categories, or bands of a number).
struct Coded {
    keys: Vec<u32>,
    labels: Vec<String>,
}

fn coded(column: &dyn Array, edges: Option<&Vec<f64>>) -> Result<Coded, ArrowError> {
    if let DataType::Float32 | DataType::Float64 = column.data_type() {
        let values = arrow_cast::cast(column, &DataType::Float64)?;
        let values = values.as_primitive::<Float64Type>();
        return Ok(match edges {
            // Band index by binary search: no text per row.
            Some(e) => {
                let mut labels = vec![band(e[0] - 1.0, e)];
                labels.extend(e.iter().map(|&x| band(x, e)));
                let keys = (0..values.len())
                    .map(|i| e.partition_point(|&edge| edge <= values.value(i)) as u32)
                    .collect();
                Coded { keys, labels }
            }
            None => {
                let mut labels: Vec<String> = Vec::new();
                let mut index: std::collections::HashMap<i64, u32> = Default::default();
                let keys = (0..values.len())
                    .map(|i| {
                        let whole = values.value(i).round() as i64;
                        *index.entry(whole).or_insert_with(|| {
                            labels.push(whole.to_string());
                            labels.len() as u32 - 1
                        })
                    })
                    .collect();
                Coded { keys, labels }
            }
        });
    }
    let dictionary = arrow_cast::cast(
        column,
        &DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
    )?;
    let dictionary = dictionary.as_dictionary::<arrow_array::types::UInt32Type>();
    let values = dictionary.values().as_string::<i32>();
    Ok(Coded {
        keys: dictionary.keys().values().to_vec(),
        labels: (0..values.len())
            .map(|i| values.value(i).to_string())
            .collect(),
    })
}

/// The band label of `x` for the population's edges.
fn band(x: f64, edges: &[f64]) -> String {
    crate::sim::population::band_label(x, edges)
}

/// Reads the state's guesses, by round and by every population attribute; the runner's keys
/// and the group levels (`levels`: a group index is no attribute to break guesses down by)
/// are skipped.
fn gather(
    batches: &[RecordBatch],
    bands: &BTreeMap<String, Vec<f64>>,
    levels: &[String],
) -> Result<Gathered, ReportError> {
    const FIXED: [&str; 8] = [
        "arm",
        "population",
        "replicate",
        "step",
        "agent",
        "guess",
        "won",
        "policy",
    ];
    let mut g = Gathered::default();
    for batch in batches {
        let schema = batch.schema();
        if g.attributes.is_empty() {
            g.attributes = schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|n| !FIXED.contains(&n.as_str()) && !levels.contains(n))
                .map(|n| (n, Vec::new()))
                .collect();
        }
        let problem = |name: &str, problem| ReportError::Column {
            table: "state table",
            column: name.into(),
            problem,
        };
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| problem(name, ColumnProblem::Missing))
        };
        let coded_col = |name: &str, edges| {
            coded(col(name)?.as_ref(), edges)
                .map_err(|e| problem(name, ColumnProblem::Unreadable(e)))
        };
        // The runner writes these types; another writer's table is refused, not read wrong.
        let typed = |name: &str, expected: DataType| {
            let column = col(name)?;
            match column.data_type() == &expected {
                true => Ok(column.clone()),
                false => Err(problem(
                    name,
                    ColumnProblem::Type {
                        found: column.data_type().clone(),
                        expected,
                    },
                )),
            }
        };
        let arms = coded_col("arm", None)?;
        let population = typed("population", DataType::UInt64)?;
        let population = population.as_primitive::<UInt64Type>();
        let step = typed("step", DataType::UInt64)?;
        let step = step.as_primitive::<UInt64Type>();
        // The runner writes `model` when a game's agents ask several models; their rounds by
        // model need each game's own mean, so the replicate too.
        let model_at = g.attributes.iter().position(|(n, _)| n == "model");
        let replicate = match model_at {
            Some(_) => Some(typed("replicate", DataType::UInt64)?),
            None => None,
        };
        let replicate = replicate.as_ref().map(|r| r.as_primitive::<UInt64Type>());
        let guess = typed("guess", DataType::Float64)?;
        let guess = guess.as_primitive::<Float64Type>();
        let attributes: Vec<Coded> = g
            .attributes
            .iter()
            .map(|(name, _)| coded_col(name, bands.get(name)))
            .collect::<Result<_, _>>()?;
        // Round 1 sums per (arm key, attribute, group key), merged by label below.
        let mut local: Vec<Vec<Vec<Running>>> = attributes
            .iter()
            .map(|a| vec![vec![Running::default(); a.labels.len()]; arms.labels.len()])
            .collect();
        let mut histograms: BTreeMap<(u32, usize, usize), [u64; BINS]> = BTreeMap::new();
        for i in 0..batch.num_rows() {
            if guess.is_null(i) {
                continue;
            }
            let x = guess.value(i);
            let arm = arms.keys[i];
            let round = step.value(i) as usize;
            let bin = ((x / 2.0).floor() as usize).min(BINS - 1);
            histograms
                .entry((arm, population.value(i) as usize, round))
                .or_insert([0; BINS])[bin] += 1;
            if round == 1 {
                for (a, coded) in attributes.iter().enumerate() {
                    local[a][arm as usize][coded.keys[i] as usize].push(x);
                }
            }
            if let (Some(m), Some(replicate)) = (model_at, replicate) {
                let model = &attributes[m].labels[attributes[m].keys[i] as usize];
                if !model.is_empty() {
                    g.model_games
                        .entry((
                            arms.labels[arm as usize].clone(),
                            population.value(i) as usize,
                            round,
                            model.clone(),
                            replicate.value(i),
                        ))
                        .or_default()
                        .push(x);
                }
            }
        }
        for ((arm, population, round), counts) in histograms {
            let total = g
                .histograms
                .entry((arms.labels[arm as usize].clone(), population, round))
                .or_insert([0; BINS]);
            for (t, c) in total.iter_mut().zip(counts) {
                *t += c;
            }
        }
        for (a, coded) in attributes.iter().enumerate() {
            let (name, order) = &mut g.attributes[a];
            for label in &coded.labels {
                if !order.contains(label) {
                    order.push(label.clone());
                }
            }
            for (arm, per_group) in local[a].iter().enumerate() {
                for (k, running) in per_group.iter().enumerate().filter(|(_, r)| r.n > 0) {
                    g.groups
                        .entry((
                            arms.labels[arm].clone(),
                            name.clone(),
                            coded.labels[k].clone(),
                        ))
                        .or_default()
                        .merge(running);
                }
            }
        }
    }
    for ((name, order), _) in g.attributes.iter_mut().zip(0..) {
        if bands.contains_key(name) || order.iter().all(|l| l.parse::<f64>().is_ok()) {
            order.sort_by_key(|l| natural_key(l));
        }
    }
    Ok(g)
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = values.fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    (n > 0).then(|| sum / n as f64)
}

/// What the run's resolved config says of its attributes: band edges of numeric ones, and
/// the declared order of categorical ones' categories.
#[derive(Default)]
struct AttributeInfo {
    bands: BTreeMap<String, Vec<f64>>,
    categories: BTreeMap<String, Vec<String>>,
}

fn attribute_info(dir: &Path) -> AttributeInfo {
    let mut info = AttributeInfo::default();
    let Ok(text) = std::fs::read_to_string(dir.join(record::CONFIG)) else {
        return info;
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return info;
    };
    let Some(attrs) = table
        .get("population")
        .and_then(|p| p.get("attributes"))
        .and_then(|a| a.as_table())
    else {
        return info;
    };
    for (name, a) in attrs {
        if let Some(shares) = a.get("shares").and_then(|s| s.as_table()) {
            info.categories
                .insert(name.clone(), shares.keys().cloned().collect());
        }
        let edges: Vec<f64> = a
            .get("bands")
            .and_then(|b| b.as_array())
            .map(|b| {
                b.iter()
                    .filter_map(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
                    .collect()
            })
            .unwrap_or_default();
        if edges.len() >= 2 {
            info.bands.insert(name.clone(), edges);
        }
    }
    info
}

/// The run's target rules and their equilibria, from what each arm's first cell says of
/// itself in `cells.jsonl` (runs written before the explanation was recorded have none).
fn rules_of(dir: &Path, manifest: &Manifest) -> Vec<RuleEquilibrium> {
    let cells = manifest.arms.len().max(1) * manifest.replicates.max(1);
    let Ok(cells) = record::read_cells(dir, cells) else {
        return Vec::new();
    };
    let mut rules: Vec<RuleEquilibrium> = Vec::new();
    for cell in cells {
        let world = &cell.world;
        let (Some(rule), Some(explanation)) = (
            world.get("rule").and_then(|r| r.as_str()),
            world.get("equilibrium_text").and_then(|r| r.as_str()),
        ) else {
            continue;
        };
        match rules.iter_mut().find(|r| r.rule == rule) {
            Some(known) if known.arms.contains(&cell.arm) => {}
            Some(known) => known.arms.push(cell.arm.clone()),
            None => rules.push(RuleEquilibrium {
                rule: rule.to_string(),
                arms: vec![cell.arm.clone()],
                equilibrium: world.get("equilibrium").and_then(|e| e.as_f64()),
                explanation: explanation.to_string(),
            }),
        }
    }
    rules
}

/// The million-agent study ran Llama 3 8B.
const STUDY: caveats::Study = caveats::Study {
    model: "Llama 3 8B",
    parameters: 8.0,
    on_smaller_models: "",
    behaviour: "the way LLM agents play the game that the study describes",
    reproduce_with: "a model of the study's size",
    preset: "llama-3.1-8b-instruct",
    config: "experiments/guess-1m-llm.toml",
};

/// What a reader must know before trusting the numbers (see [`caveats::notes`]): scripted
/// players, whose level-k rules build in the education gradient the study reports, a mixed
/// policy, or a model below the study's.
fn notes(manifest: &Manifest, attributes: &[(String, Vec<String>)]) -> Vec<String> {
    let education = attributes.iter().any(|(name, _)| name == "education");
    let scripted = caveats::ScriptedRules {
        agents: "players follow a level-k model of the game (level 0 guesses at random, level k best-responds to level k-1, later rounds best-respond to the last mean)",
        tests: "the game's rules, the records and the report",
        built_in: if education {
            "Differences by education are built into those rules: players of a later-listed (higher) education category reason a level deeper more often, so round-1 mean guesses that fall with education, or with any attribute drawn together with it, come from the rules, not from a finding."
        } else {
            ""
        },
    };
    caveats::notes(manifest, &STUDY, &scripted, String::new)
}

/// Writes the report into `dir` on the base report ([`overview`]): the game's figures, its
/// sections and numbers, then every column's breakdowns; returns the game's numbers.
pub fn report(dir: &Path) -> Result<Report, ReportError> {
    report_and_text(dir).map(|(report, _)| report)
}

/// [`report`], and the text the base report printed for it (the game's lines, and what the
/// base adds to every report's, such as a counterfactual's comparison).
fn report_and_text(dir: &Path) -> Result<(Report, String), ReportError> {
    let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
    let steps: Vec<StepRecord> = record::read_steps(dir)?;
    let rows: Vec<RoundRow> = record::read_keyed_csv(&dir.join(record::AGGREGATES))?;
    if rows.is_empty() {
        return Err(ReportError::Empty {
            dir: dir.to_path_buf(),
            what: "finished round",
        });
    }
    let batches = record::read_state(dir)?;
    let info = attribute_info(dir);
    let group_tables = record::read_table(dir, record::GROUPS).unwrap_or_default();
    let mut gathered = gather(
        &batches,
        &info.bands,
        &crate::analysis::overview::level_names(&group_tables),
    )?;
    for (name, order) in gathered.attributes.iter_mut() {
        if let Some(declared) = info.categories.get(name) {
            order.sort_by_key(|c| declared.iter().position(|d| d == c).unwrap_or(usize::MAX));
        }
    }
    drop(batches);

    let mut by_round: BTreeMap<(usize, usize, usize), Vec<&RoundRow>> = BTreeMap::new();
    let arm_order: Vec<String> = if manifest.arms.is_empty() {
        let mut a: Vec<String> = rows.iter().map(|r| r.arm.clone()).collect();
        a.dedup();
        a
    } else {
        manifest.arms.clone()
    };
    let arm_index = |arm: &str| {
        arm_order
            .iter()
            .position(|a| a == arm)
            .unwrap_or(usize::MAX)
    };
    for r in &rows {
        by_round
            .entry((r.population, arm_index(&r.arm), r.step))
            .or_default()
            .push(r);
    }
    let seconds: BTreeMap<(usize, usize), f64> = steps
        .iter()
        .map(|s| ((s.population, s.step), s.seconds))
        .collect();
    let rounds: Vec<RoundSummary> = by_round
        .iter()
        .map(|(&(population, _, round), reps)| {
            let pick = |f: fn(&RoundRow) -> Option<f64>| mean(reps.iter().filter_map(|r| f(r)));
            RoundSummary {
                arm: reps[0].arm.clone(),
                population,
                round,
                replicates: reps.len(),
                // Games are few, so Student's t (a bootstrap over two or three games would
                // cover the true mean about half the time), cut at the bounds a mean guess
                // cannot cross.
                mean: Summary::of(&reps.iter().filter_map(|r| r.mean).collect::<Vec<_>>())
                    .map(within_guess_bounds),
                target: pick(|r| r.target),
                winning_number: pick(|r| r.winning_number),
                two_sided_ties: reps
                    .iter()
                    .filter(|r| r.tied_winning_number.is_some())
                    .count(),
                tied_winning_number: pick(|r| r.tied_winning_number),
                winners: mean(reps.iter().map(|r| r.winners as f64)).unwrap_or(0.0),
                median: pick(|r| r.median),
                std: pick(|r| r.std),
                min: pick(|r| r.min),
                max: pick(|r| r.max),
                guesses: mean(reps.iter().map(|r| r.guesses as f64)).unwrap_or(0.0),
                players: reps[0].players,
                seconds: seconds.get(&(population, round)).copied(),
                equilibrium: reps[0].equilibrium,
            }
        })
        .collect();

    let mut figures = Vec::new();
    let mut save = |name: &str, fig: &dyn Fn(&Path) -> Result<(), PlotError>| {
        fig(&dir.join(name))?;
        figures.push(name.to_string());
        Ok::<(), PlotError>(())
    };
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
        for arm in &arm_order {
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
        save(&format!("fig_convergence{suffix}"), &|p| {
            plot::save(&fig, p)
        })?;

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
            save(&format!("fig_guesses_arm{a}{suffix}"), &|p| {
                plot::save(&fig, p)
            })?;
        }
    }

    // Every round by model: each game's mean per model, then a CI over games.
    // (population, arm, round, model) -> each game's mean, and the most agents in a game.
    type PerModel = BTreeMap<(usize, usize, usize, String), (Vec<f64>, usize)>;
    let mut per_model = PerModel::new();
    for ((arm, population, round, model, _), running) in &gathered.model_games {
        let entry = per_model
            .entry((*population, arm_index(arm), *round, model.clone()))
            .or_default();
        entry.0.push(running.mean);
        entry.1 = entry.1.max(running.n);
    }
    let models: Vec<ModelRound> = if per_model
        .keys()
        .map(|k| &k.3)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1
    {
        per_model
            .into_iter()
            .map(
                |((population, arm, round, model), (means, agents))| ModelRound {
                    arm: arm_order.get(arm).cloned().unwrap_or_default(),
                    population,
                    round,
                    model,
                    mean: Summary::of(&means).map(within_guess_bounds),
                    games: means.len(),
                    agents,
                },
            )
            .collect()
    } else {
        Vec::new()
    };

    // Round 1's mean guess by group, one figure per attribute.
    // In the population's order: arms, then attributes, then their groups.
    let mut groups: Vec<GroupMean> = Vec::new();
    for arm in &arm_order {
        for (attribute, order) in &gathered.attributes {
            for group in order {
                let key = (arm.clone(), attribute.clone(), group.clone());
                if let Some(running) = gathered.groups.get(&key) {
                    groups.push(GroupMean {
                        arm: arm.clone(),
                        attribute: attribute.clone(),
                        group: group.clone(),
                        mean: running.summary(),
                    });
                }
            }
        }
    }
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
        save(&format!("fig_by_{}", slug(attribute)), &|p| {
            plot::save(&fig, p)
        })?;
    }

    let last_round = rounds.iter().map(|r| r.round).max().unwrap_or(0);
    let levels = level_spreads(&group_tables)
        .into_iter()
        .filter(|s| s.step == last_round)
        .collect();
    let mut notes = notes(&manifest, &gathered.attributes);
    if let Some(level) = record::read_table(dir, GROUP_ROUNDS)
        .ok()
        .and_then(|b| b.first().and_then(|b| b.column_by_name("level").cloned()))
        .and_then(|c| arrow_cast::cast(&c, &DataType::Utf8).ok())
        .map(|c| c.as_string::<i32>().value(0).to_string())
    {
        notes.push(format!(
            "Grouped game: each {level} played its own game, with its own target and winners. \
             The round table shows the whole cell's mean, target and winners; \
             group_rounds.parquet has each {level}'s, and the levels below compare them."
        ));
    }
    let report = Report {
        rules: rules_of(dir, &manifest),
        notes,
        manifest,
        rounds,
        models,
        groups,
        levels,
        figures,
    };
    let own = Own {
        notes: Some(report.notes.clone()),
        html: html(&report),
        figures: report.figures.clone(),
        summary: Own::summary_of(&report)?,
        text: Some(text(&report)),
    };
    let options = overview::Options {
        title: Some(report.manifest.name.clone()),
        ..Default::default()
    };
    let text = overview::write_with(dir, &options, own)?.summary;
    Ok((report, text))
}

/// Orders `9-17` before `18-29` and `<18` first: by the first number in the label.
fn natural_key(label: &str) -> (i64, String) {
    let digits: String = label
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let n = digits.parse::<i64>().unwrap_or(i64::MAX);
    let n = if label.starts_with('<') { i64::MIN } else { n };
    (n, label.to_string())
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn num(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2}"))
}

/// The winning number of a round: both numbers of a game in which guesses on both sides of
/// the target won; over several games, the mean of the (lower) winning numbers and how many
/// games had a second one.
fn winning_text(r: &RoundSummary) -> String {
    match (r.two_sided_ties, r.replicates) {
        (0, _) => num(r.winning_number),
        (_, 1) => format!(
            "{} and {}",
            num(r.winning_number),
            num(r.tied_winning_number)
        ),
        (1, n) => format!(
            "{} (1 of {n} games also {})",
            num(r.winning_number),
            num(r.tied_winning_number)
        ),
        (k, n) => format!(
            "{} ({k} of {n} games also a higher one, mean {})",
            num(r.winning_number),
            num(r.tied_winning_number)
        ),
    }
}

fn mean_text(s: &Option<Summary>) -> String {
    match s {
        None => "-".into(),
        Some(s) => match s.interval() {
            Some((lo, hi)) => format!("{:.2} [{lo:.2}, {hi:.2}]", s.mean),
            None => format!("{:.2} (n={}: no CI)", s.mean, s.n),
        },
    }
}

fn seconds_text(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 1.0 => format!("{:.1} ms", s * 1e3),
        Some(s) => format!("{s:.2} s"),
    }
}

/// The key numbers as text lines, for the terminal.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let m = &report.manifest;
    if let Some(note) = unfinished(m) {
        let _ = writeln!(out, "NOTE: {note}");
    }
    for note in &report.notes {
        let _ = writeln!(out, "NOTE: {note}");
    }
    let _ = writeln!(out, "{}", headline(m));
    let _ = writeln!(
        out,
        "{:<36} {:>5} {:>22} {:>8} {:>8} {:>8} {:>7} {:>10}",
        "arm (players)",
        "round",
        "mean [95% CI]",
        "target",
        "winning",
        "winners",
        "std",
        "round time"
    );
    for r in &report.rounds {
        let _ = writeln!(
            out,
            "{:<36} {:>5} {:>22} {:>8} {:>8} {:>8.1} {:>7} {:>10}",
            format!("{} ({})", r.arm, r.population),
            r.round,
            mean_text(&r.mean),
            num(r.target),
            winning_text(r),
            r.winners,
            num(r.std),
            seconds_text(r.seconds),
        );
    }
    if report.rounds.iter().any(|r| r.two_sided_ties > 0) {
        let _ = writeln!(out, "{TIES}");
    }
    if !report.models.is_empty() {
        let _ = writeln!(
            out,
            "{:<36} {:>5} {:<28} {:>22} {:>6}",
            "by model: arm (players)", "round", "model", "mean [95% CI]", "games"
        );
        for r in &report.models {
            let _ = writeln!(
                out,
                "{:<36} {:>5} {:<28} {:>22} {:>6}",
                format!("{} ({})", r.arm, r.population),
                r.round,
                r.model,
                mean_text(&r.mean),
                r.games
            );
        }
    }
    for rule in &report.rules {
        let _ = writeln!(out, "equilibrium of {}: {}", rule.rule, rule.explanation);
    }
    for s in &report.levels {
        let _ = writeln!(
            out,
            "by {} at round {}: {} groups, {} of a group {} (sd {} between groups, {} to {})",
            s.level,
            s.step,
            s.groups,
            s.column,
            num(Some(s.mean)),
            num(Some(s.sd)),
            num(Some(s.lowest)),
            num(Some(s.highest))
        );
    }
    out
}

/// What a round with two winning numbers means, under the tables that show one.
const TIES: &str = "Where guesses on both sides of the target were equally close (a target of 22.5, guesses 22 and 23), every one of them won: both winning numbers are shown, all their agents count as winners, and aggregates.csv has the higher in `tied_winning_number`.";

/// The game's sections of `report.html`: the base report ([`crate::analysis::overview`]) puts
/// the run's notes and paragraph above them, and the game's figures, every column's breakdowns
/// and the group levels below.
fn html(report: &Report) -> String {
    let mut body = String::new();
    body.push_str(
        "<h2>Rounds</h2><p>Each statistic is the mean over replicates (one game each); the interval of \
         the mean guess is a 95% CI over games (Student's t, cut at 0 and 100), shown when there are \
         at least two. Round time is the \
         wall time of the step that played the round, for all cells of that population at once.</p>",
    );
    body.push_str(&table(
        &[
            "arm",
            "players",
            "round",
            "winning number",
            "winners",
            "mean [95% CI]",
            "median",
            "std",
            "min",
            "max",
            "target",
            "guesses",
            "round time",
        ],
        report.rounds.iter().map(|r| {
            vec![
                esc(&r.arm),
                r.population.to_string(),
                r.round.to_string(),
                winning_text(r),
                format!("{:.1}", r.winners),
                mean_text(&r.mean),
                num(r.median),
                num(r.std),
                num(r.min),
                num(r.max),
                num(r.target),
                format!("{:.0} of {}", r.guesses, r.players),
                seconds_text(r.seconds),
            ]
        }),
    ));
    if report.rounds.iter().any(|r| r.two_sided_ties > 0) {
        let _ = write!(body, "<p>{}</p>", esc(TIES));
    }
    if !report.rules.is_empty() {
        body.push_str(
            "<h2>Equilibrium</h2><p>Guesses are clamped to [0, 100], so the equilibrium is a fixed \
             point of x &rarr; clamp(ratio &times; x + offset, 0, 100): a crowd that all guess it \
             has its target there.</p>",
        );
        body.push_str(&table(
            &["rule", "arms", "equilibrium"],
            report
                .rules
                .iter()
                .map(|r| vec![esc(&r.rule), esc(&r.arms.join(", ")), esc(&r.explanation)]),
        ));
    }
    if !report.models.is_empty() {
        body.push_str(
            "<h2>Rounds by model</h2><p>The agents of each game ask several models: each \
             model's mean guess per round, the mean over games of its agents' mean, with a 95% \
             CI over games (Student's t, cut at 0 and 100). Round 1 is the models' own answer \
             to the rules; later rounds follow what all the game's players did.</p>",
        );
        body.push_str(&table(
            &[
                "arm",
                "players",
                "round",
                "model",
                "mean [95% CI]",
                "games",
                "agents a game",
            ],
            report.models.iter().map(|r| {
                vec![
                    esc(&r.arm),
                    r.population.to_string(),
                    r.round.to_string(),
                    esc(&r.model),
                    mean_text(&r.mean),
                    r.games.to_string(),
                    r.agents.to_string(),
                ]
            }),
        ));
    }
    if !report.groups.is_empty() {
        body.push_str(
            "<h2>Round 1 by group</h2><p>Mean guess with a 95% CI across agents (Student's t, cut at 0 \
             and 100): in round 1 nobody has seen a result, so agents decide independently.</p>",
        );
        body.push_str(&table(
            &["arm", "attribute", "group", "mean [95% CI]", "agents"],
            report.groups.iter().map(|g| {
                vec![
                    esc(&g.arm),
                    esc(&g.attribute),
                    esc(&g.group),
                    mean_text(&g.mean),
                    g.mean.map_or("0".into(), |s| s.n.to_string()),
                ]
            }),
        ));
    }
    body
}

/// Writes the report of the run in `dir` and returns its key numbers as text (the
/// registry's entry).
pub fn write(dir: &Path) -> Result<String, ReportError> {
    report_and_text(dir).map(|(_, text)| text)
}

#[cfg(test)]
mod tests {
    use super::Running;
    use crate::analysis::stats::Summary;

    /// A group of few, skewed guesses (most at 0, one at 30) has a Student's t interval
    /// reaching below 0; the report's interval stops at the bound a mean guess cannot cross,
    /// and keeps the rest of the interval as it was.
    #[test]
    fn agent_intervals_stay_within_the_guess_range() {
        let guesses = [0.0, 0.0, 0.0, 0.0, 30.0];
        let mut running = Running::default();
        guesses.iter().for_each(|&g| running.push(g));
        let raw = Summary::of(&guesses).expect("a sample");
        assert!(raw.ci_low < 0.0, "the premise: t reaches below 0 here");
        let shown = running.summary().expect("a sample");
        assert_eq!(shown.ci_low, 0.0);
        assert!((shown.ci_high - raw.ci_high).abs() < 1e-9);
        assert!((shown.mean - 6.0).abs() < 1e-12);
    }

    /// Round means over two games keep Student's t interval (wide: one degree of freedom), cut
    /// at 0 rather than reaching below it.
    #[test]
    fn game_intervals_are_cut_at_the_bounds() {
        let games = [10.0, 14.0];
        let t = Summary::of(&games).expect("two games");
        assert!(t.ci_low < 0.0, "the premise: t reaches below 0 here");
        let shown = super::within_guess_bounds(t);
        assert_eq!(shown.interval(), Some((0.0, t.ci_high)));
        assert!(t.ci_high < 100.0);
    }

    /// A state table from another writer (a key column of another type, or none) is refused
    /// by column, where it used to panic or be read wrong.
    #[test]
    fn a_state_table_of_another_writer_is_refused_by_column() {
        use crate::analysis::{ColumnProblem, ReportError};
        use arrow_array::{
            ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array,
        };
        use std::sync::Arc;
        let batch = |population: ArrayRef| {
            RecordBatch::try_from_iter([
                ("arm", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
                ("population", population),
                ("step", Arc::new(UInt64Array::from(vec![1]))),
                ("guess", Arc::new(Float64Array::from(vec![33.0]))),
            ])
            .unwrap()
        };
        let bands = Default::default();
        let signed = batch(Arc::new(Int64Array::from(vec![5])));
        let e = super::gather(&[signed], &bands, &[])
            .err()
            .expect("refused");
        assert!(
            matches!(&e, ReportError::Column { column, problem: ColumnProblem::Type { .. }, .. }
                if column == "population"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("`population`") && e.to_string().contains("Int64"),
            "{e}"
        );
        let good = batch(Arc::new(UInt64Array::from(vec![5])));
        super::gather(std::slice::from_ref(&good), &bands, &[])
            .expect("the runner's types are read");
        let without = good.project(&[0, 1, 3]).unwrap();
        let e = super::gather(&[without], &bands, &[])
            .err()
            .expect("refused");
        assert!(
            matches!(&e, ReportError::Column { column, problem: ColumnProblem::Missing, .. }
                if column == "step"),
            "{e:?}"
        );
    }
}
