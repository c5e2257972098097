//! Steps every cell of an experiment in lockstep: each step, every agent of every arm and
//! replicate of one population size decides in one batch, every cell resolves its decisions
//! at once, and the step is recorded and checkpointed before the next begins.
//!
//! Seeds: a cell's world is drawn from `derive(seed, [INIT, population, replicate])`, its
//! resolution at step `t` from `derive(seed, [RESOLVE, population, replicate, t])` and agent
//! `a`'s draws from `derive(seed, [AGENT, population, replicate, a, t])`. None depends on the
//! arm, so arms are compared on the same worlds and shocks (common random numbers), nor on
//! threads or batching, so results depend on the seed alone.

use super::config::Experiment;
use super::policy::{AgentTurn, CellView, Policy, PolicyError};
use super::scenario::{CellInfo, Scenario};
use crate::record::{
    self, CELLS, CHECKPOINT, DecisionRecord, MANIFEST, Manifest, RecordError, StepRecord,
    StepWriter,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

const INIT: u64 = 1;
const RESOLVE: u64 = 2;
const AGENT: u64 = 3;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("{0}")]
    Resume(String),
}

/// Where a run stands, saved after every step. Borrowed when written (the worlds are not
/// copied to be serialised) and owned when read back.
#[derive(Serialize, Deserialize)]
#[serde(bound = "W: Serialize + serde::de::DeserializeOwned + Clone")]
struct Checkpoint<'a, W: Clone> {
    /// Index of the population size being run.
    group: usize,
    /// Steps of that group already done.
    steps_done: usize,
    cells: Cow<'a, [CellInfo]>,
    worlds: Cow<'a, [W]>,
    policy: serde_json::Value,
    /// Lengths of the appended files when it was taken.
    files: BTreeMap<String, u64>,
    /// Parquet parts written so far.
    parts: Cow<'a, [String]>,
    decisions: u64,
    fallbacks: u64,
    clamped: u64,
    prompt_tokens: u64,
    generated_tokens: u64,
    seconds: f64,
}

/// Progress reported after every step.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub group: usize,
    pub groups: usize,
    pub population: usize,
    pub step: usize,
    pub steps: usize,
    pub step_seconds: f64,
    pub decisions: usize,
}

/// How a run starts and ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Continue from the folder's checkpoint.
    pub resume: bool,
    /// Stop after this many steps, leaving the run resumable (a batch job's time limit).
    pub stop_after: Option<usize>,
}

/// How a call to [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Finished,
    /// Stopped by `stop_after`; `--resume` continues it.
    Paused,
}

/// Runs (or resumes) `exp` into `dir`; `scenarios[i]` is arm `i`'s scenario.
pub fn run<S: Scenario>(
    exp: &Experiment,
    scenarios: &[S],
    policy: &mut dyn Policy<S>,
    dir: &Path,
    manifest: &mut Manifest,
    options: RunOptions,
    mut on_step: impl FnMut(Progress),
) -> Result<Ended, RunError> {
    let resume = options.resume;
    let mut budget = options.stop_after.unwrap_or(usize::MAX);
    let cfg = &exp.config;
    let checkpoint_path = dir.join(CHECKPOINT);
    let mut start: Option<Checkpoint<'_, S::World>> = None;
    if resume {
        let cp: Checkpoint<'_, S::World> = record::read_json(&checkpoint_path)
            .map_err(|e| RunError::Resume(format!("cannot resume from {}: {e}", dir.display())))?;
        crate::record::writer_rewind(dir, &cp.files, &cp.parts)?;
        policy.restore(cp.policy.clone())?;
        start = Some(cp);
    }
    let mut writer = StepWriter::open(dir)?;
    let mut cells_data: BTreeMap<String, serde_json::Value> = if resume {
        record::read_json(&dir.join(CELLS)).unwrap_or_default()
    } else {
        BTreeMap::new()
    };
    let mut parts: Vec<String> = start.as_ref().map(|c| c.parts.to_vec()).unwrap_or_default();
    let (
        mut decisions_total,
        mut fallbacks_total,
        mut clamped_total,
        mut prompt_total,
        mut generated_total,
        mut seconds,
    ) = start.as_ref().map_or((0, 0, 0, 0, 0, 0.0), |c| {
        (
            c.decisions,
            c.fallbacks,
            c.clamped,
            c.prompt_tokens,
            c.generated_tokens,
            c.seconds,
        )
    });
    let groups = cfg.agents.0.len();
    let first_group = start.as_ref().map_or(0, |c| c.group);
    for (group, &population) in cfg.agents.0.iter().enumerate().skip(first_group) {
        let (cells, mut worlds, first_step) = match start.take().filter(|c| c.group == group) {
            Some(cp) => (cp.cells.into_owned(), cp.worlds.into_owned(), cp.steps_done),
            None => {
                let mut cells = Vec::new();
                let mut worlds = Vec::new();
                for replicate in 0..cfg.replicates.0 {
                    for (arm, scenario) in exp.arms.iter().zip(scenarios) {
                        let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(
                            cfg.seed,
                            &[INIT, population as u64, replicate as u64],
                        ));
                        let world = scenario.init(population, &mut rng);
                        let info = CellInfo {
                            arm: arm.0.clone(),
                            population,
                            replicate,
                        };
                        cells_data.insert(
                            format!("{}/{}/{}", info.arm, population, replicate),
                            scenario.describe(&world),
                        );
                        cells.push(info);
                        worlds.push(world);
                    }
                }
                record::write_json_atomic(&dir.join(CELLS), &cells_data)?;
                // The state before anyone moves.
                let part = format!("g{group:03}-s{:06}", 0);
                writer.state(&part, &state_rows(exp, scenarios, &cells, &worlds, 0))?;
                parts.push(part);
                (cells, worlds, 0)
            }
        };
        for step in first_step..cfg.steps.0 {
            if budget == 0 {
                return Ok(Ended::Paused);
            }
            budget -= 1;
            let started = Instant::now();
            let mut turns = Vec::new();
            for (c, (info, world)) in cells.iter().zip(&worlds).enumerate() {
                let scenario = scenario_of(exp, scenarios, info);
                for agent in 0..scenario.num_agents(world) {
                    if scenario.acts(world, agent) {
                        let seed = crate::seed::derive(
                            cfg.seed,
                            &[
                                AGENT,
                                population as u64,
                                info.replicate as u64,
                                agent as u64,
                                step as u64,
                            ],
                        );
                        turns.push(AgentTurn {
                            cell: c,
                            agent,
                            seed,
                        });
                    }
                }
            }
            let views: Vec<CellView<'_, S>> = cells
                .iter()
                .zip(&worlds)
                .map(|(info, world)| CellView {
                    scenario: scenario_of(exp, scenarios, info),
                    world,
                    info,
                    step,
                })
                .collect();
            let outcomes = policy.decide(&views, &turns)?;
            drop(views);
            let mut per_cell: Vec<Vec<Option<S::Decision>>> = cells
                .iter()
                .zip(&worlds)
                .map(|(info, world)| {
                    vec![None; scenario_of(exp, scenarios, info).num_agents(world)]
                })
                .collect();
            let mut records = Vec::with_capacity(turns.len());
            let (mut fallbacks, mut prompt_tokens, mut cached_tokens, mut generated_tokens) =
                (0, 0, 0, 0);
            for (t, (decision, log)) in turns.iter().zip(outcomes) {
                let info = &cells[t.cell];
                fallbacks += log.fallback.is_some() as usize;
                clamped_total += (!log.clamps.is_empty()) as u64;
                prompt_tokens += log.prompt_tokens;
                cached_tokens += log.cached_tokens;
                generated_tokens += log.generated_tokens;
                records.push(DecisionRecord {
                    arm: info.arm.clone(),
                    population,
                    replicate: info.replicate,
                    step: step + 1,
                    agent: t.agent,
                    decision: serde_json::to_value(&decision).unwrap_or_default(),
                    log,
                });
                per_cell[t.cell][t.agent] = Some(decision);
            }
            for (c, (info, world)) in cells.iter().zip(worlds.iter_mut()).enumerate() {
                let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(
                    cfg.seed,
                    &[
                        RESOLVE,
                        population as u64,
                        info.replicate as u64,
                        step as u64,
                    ],
                ));
                scenario_of(exp, scenarios, info).resolve(world, &per_cell[c], &mut rng);
            }
            let step_seconds = started.elapsed().as_secs_f64();
            seconds += step_seconds;
            let part = format!("g{group:03}-s{:06}", step + 1);
            writer.state(
                &part,
                &state_rows(exp, scenarios, &cells, &worlds, step + 1),
            )?;
            parts.push(part);
            writer.decisions(&records)?;
            writer.step(&StepRecord {
                population,
                step: step + 1,
                cells: cells.len(),
                decisions: turns.len(),
                fallbacks,
                seconds: step_seconds,
                decisions_per_second: turns.len() as f64 / step_seconds.max(1e-9),
                prompt_tokens,
                cached_tokens,
                generated_tokens,
            })?;
            decisions_total += turns.len() as u64;
            fallbacks_total += fallbacks as u64;
            prompt_total += prompt_tokens as u64;
            generated_total += generated_tokens as u64;
            let cp = Checkpoint {
                group,
                steps_done: step + 1,
                cells: Cow::Borrowed(&cells),
                worlds: Cow::Borrowed(&worlds),
                policy: policy.checkpoint(),
                files: writer.lengths()?,
                parts: Cow::Borrowed(&parts),
                decisions: decisions_total,
                fallbacks: fallbacks_total,
                clamped: clamped_total,
                prompt_tokens: prompt_total,
                generated_tokens: generated_total,
                seconds,
            };
            record::write_json_atomic(&checkpoint_path, &cp)?;
            manifest.decisions = decisions_total;
            manifest.fallbacks = fallbacks_total;
            manifest.clamped = clamped_total;
            manifest.prompt_tokens = prompt_total;
            manifest.generated_tokens = generated_total;
            manifest.seconds = seconds;
            record::write_json_atomic(&dir.join(MANIFEST), manifest)?;
            on_step(Progress {
                group,
                groups,
                population,
                step: step + 1,
                steps: cfg.steps.0,
                step_seconds,
                decisions: turns.len(),
            });
        }
    }
    record::merge_parts(dir)?;
    Ok(Ended::Finished)
}

fn state_rows<S: Scenario>(
    exp: &Experiment,
    scenarios: &[S],
    cells: &[CellInfo],
    worlds: &[S::World],
    step: usize,
) -> Vec<S::Row> {
    cells
        .iter()
        .zip(worlds)
        .flat_map(|(info, world)| scenario_of(exp, scenarios, info).rows(world, info, step))
        .collect()
}

fn scenario_of<'a, S: Scenario>(exp: &Experiment, scenarios: &'a [S], info: &CellInfo) -> &'a S {
    let arm = exp
        .arms
        .iter()
        .position(|(name, _)| name == &info.arm)
        .expect("invariant: cells come from the arms");
    &scenarios[arm]
}

/// A fresh folder for a run: `runs/<name>-<unix time>` unless one is given.
pub fn default_run_dir(name: &str) -> PathBuf {
    PathBuf::from("runs").join(format!("{name}-{}", record::now_unix()))
}
