//! The guessing game's report, as the study reported it: a per-round table (winning number,
//! winners, mean, median, std, min, max, round wall time), the distribution of guesses in
//! every round, the mean and the target over rounds, and the mean guess by group
//! (education, occupation, age band, or any attribute of the population).
//!
//! Games are the unit of independence: intervals of round statistics are computed over
//! replicates (one game each). Within round 1 agents decide independently of each other
//! (nobody has seen a result yet), so group means there get intervals across agents.

mod figures;
mod gather;
mod render;
mod running;
mod summary;

pub use super::records::{Round, RoundRow};
pub use render::text;
pub use summary::{GroupMean, ModelRound, Report, RoundSummary, RuleEquilibrium};

use super::records::GROUP_ROUNDS;
use crate::analysis::ReportError;
use crate::analysis::caveats;
use crate::analysis::overview::{self, Own, level_spreads};
use crate::analysis::stats::Summary;
use crate::record::{self, Manifest, StepRecord};
use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_schema::DataType;
use gather::{Gathered, attribute_info, gather};
use render::html;
use running::within_guess_bounds;
use std::collections::BTreeMap;
use std::path::Path;

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
    let group_tables = record::read_table(dir, record::GROUPS).unwrap_or_default();
    let gathered = read_guesses(dir, &group_tables)?;
    let arm_order = arm_order(&manifest, &rows);
    let rounds = round_summaries(&rows, &steps, &arm_order);
    let mut figures = figures::rounds(dir, &rounds, &gathered, &arm_order)?;
    let models = model_rounds(&gathered, &arm_order);
    let groups = group_means(&gathered, &arm_order);
    figures.extend(figures::groups(dir, &gathered, &groups, &arm_order)?);

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
    let options = overview::OverviewOptions {
        title: Some(report.manifest.name.clone()),
        ..Default::default()
    };
    let text = overview::write_with(dir, &options, own)?.summary;
    Ok((report, text))
}

/// The state table's guesses, gathered in one pass, each attribute's groups in the order the
/// config declares its categories.
fn read_guesses(dir: &Path, group_tables: &[RecordBatch]) -> Result<Gathered, ReportError> {
    let batches = record::read_state(dir)?;
    let info = attribute_info(dir);
    let mut gathered = gather(
        &batches,
        &info.bands,
        &crate::analysis::overview::level_names(group_tables),
    )?;
    for (name, order) in gathered.attributes.iter_mut() {
        if let Some(declared) = info.categories.get(name) {
            order.sort_by_key(|c| declared.iter().position(|d| d == c).unwrap_or(usize::MAX));
        }
    }
    Ok(gathered)
}

/// The arms in the manifest's order (in the rows' order for runs whose manifest has none).
fn arm_order(manifest: &Manifest, rows: &[RoundRow]) -> Vec<String> {
    if manifest.arms.is_empty() {
        let mut a: Vec<String> = rows.iter().map(|r| r.arm.clone()).collect();
        a.dedup();
        a
    } else {
        manifest.arms.clone()
    }
}

/// Where `arm` is in `arm_order` (unknown arms last).
fn arm_index(arm_order: &[String], arm: &str) -> usize {
    arm_order
        .iter()
        .position(|a| a == arm)
        .unwrap_or(usize::MAX)
}

/// Each round's statistics over the replicates of its arm and population, by population,
/// arm and round.
fn round_summaries(
    rows: &[RoundRow],
    steps: &[StepRecord],
    arm_order: &[String],
) -> Vec<RoundSummary> {
    let mut by_round: BTreeMap<(usize, usize, usize), Vec<&RoundRow>> = BTreeMap::new();
    for r in rows {
        by_round
            .entry((r.population, arm_index(arm_order, &r.arm), r.step))
            .or_default()
            .push(r);
    }
    let seconds: BTreeMap<(usize, usize), f64> = steps
        .iter()
        .map(|s| ((s.population, s.step), s.seconds))
        .collect();
    by_round
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
        .collect()
}

/// Every round by model, when a game's agents ask several models (empty otherwise).
fn model_rounds(gathered: &Gathered, arm_order: &[String]) -> Vec<ModelRound> {
    // Every round by model: each game's mean per model, then a CI over games.
    // (population, arm, round, model) -> each game's mean, and the most agents in a game.
    type PerModel = BTreeMap<(usize, usize, usize, String), (Vec<f64>, usize)>;
    let mut per_model = PerModel::new();
    for ((arm, population, round, model, _), running) in &gathered.model_games {
        let entry = per_model
            .entry((
                *population,
                arm_index(arm_order, arm),
                *round,
                model.clone(),
            ))
            .or_default();
        entry.0.push(running.mean);
        entry.1 = entry.1.max(running.n);
    }
    if per_model
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
    }
}

/// Round 1's mean guess of every group: in the population's order, arms, then attributes,
/// then their groups.
fn group_means(gathered: &Gathered, arm_order: &[String]) -> Vec<GroupMean> {
    let mut groups: Vec<GroupMean> = Vec::new();
    for arm in arm_order {
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
    groups
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, sum) = values.fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    (n > 0).then(|| sum / n as f64)
}

/// Writes the report of the run in `dir` and returns its key numbers as text (the
/// registry's entry).
pub fn write(dir: &Path) -> Result<String, ReportError> {
    report_and_text(dir).map(|(_, text)| text)
}
