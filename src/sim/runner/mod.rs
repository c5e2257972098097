//! Steps every cell of an experiment in lockstep: each step, every agent of every arm and
//! replicate of one population size decides in one batch, every cell resolves its decisions
//! at once, and the step is recorded and checkpointed before the next begins.
//!
//! Seeds: a cell's agents are drawn from `derive(seed, [POPULATION, size, replicate])`, its
//! world from `derive(seed, [INIT, size, replicate])`, its resolution at step `t` from
//! `derive(seed, [RESOLVE, size, replicate, t])` and agent `a`'s draws from
//! `derive(seed, [AGENT, size, replicate, a, t])`. None depends on the arm, so arms are
//! compared on the same agents, worlds and shocks (common random numbers), nor on threads or
//! batching, so results depend on the seed alone.

mod arms;
mod cells;
mod error;
pub mod fault;
mod first_step;
mod recorder;
mod rows;
mod share;
mod step;
mod streams;

pub use arms::Arms;
pub use cells::{Cells, first_population, model_agents, same_start};
pub use error::SimError;
pub use fault::Faults;
pub use first_step::{FirstStep, Sample, first_step};
pub use recorder::Checkpoint;
pub use share::{choose as choose_split, model_ranks};
pub use step::Policies;

use crate::cluster::Ranks;
use crate::record::{self, Manifest, Status, checkpoint};
use crate::sim::config::Split;
use crate::sim::experiment::Experiment;
use crate::sim::policy::Policy;
use crate::sim::scenario::Scenario;
use recorder::{Recorder, StepTiming};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What the runner reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// `n` more agents decided in the current step.
    Decided(usize),
    /// A step finished.
    Step {
        group: usize,
        groups: usize,
        population: usize,
        /// 1-based.
        step: usize,
        steps: usize,
        step_seconds: f64,
        decisions: usize,
    },
}

/// How a run starts and ends.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Continue from the folder's checkpoint.
    pub resume: bool,
    /// Stop after this many steps, leaving the run resumable (a batch job's time limit).
    pub stop_after: Option<usize>,
    /// Set (by a signal handler) to stop after the current step, leaving the run resumable.
    /// Under several ranks, one rank's flag pauses them all after the same step.
    pub stop: Option<Arc<AtomicBool>>,
    /// The ranks of the job sharing the run (a process alone by default).
    pub ranks: Ranks,
    /// How they share it, over the config's `split`.
    pub split: Option<Split>,
    /// The run's decision store, where rank 0 keeps every rank's model replies for later
    /// runs (`throng run --reuse`); `None`: the replies are not kept.
    pub store: Option<record::store::Store>,
    /// Crashes, hangs and delays asked on purpose, for tests (none by default).
    pub faults: fault::Faults,
}

/// How a call to [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Finished,
    /// Stopped by `stop_after` or `stop`; `--resume` continues it.
    Paused,
}

/// Where a resumed run stands, read before anything heavy (the model) is loaded: `None`
/// when it stopped before finishing its first step (it then starts again from nothing).
pub(crate) fn read_checkpoint<W: serde::de::DeserializeOwned>(
    dir: &Path,
) -> Result<Option<checkpoint::Loaded<Checkpoint<W>>>, SimError> {
    Ok(checkpoint::read(dir)?)
}

/// What to run and where: the experiment, its typed arms (`arms.at(step)[i]` is arm `i`'s
/// scenario at a step), and the run folder.
pub struct Sim<'a, S> {
    pub exp: &'a Experiment,
    pub arms: &'a Arms<S>,
    pub dir: &'a Path,
}

/// Runs (or resumes) `sim`. `start` is the checkpoint to resume from (see
/// [`read_checkpoint`]).
pub fn run<S: Scenario>(
    sim: &Sim<'_, S>,
    policies: &mut Policies<'_>,
    manifest: &mut Manifest,
    start: Option<Checkpoint<S::World>>,
    options: &SimOptions,
    mut progress: impl FnMut(Progress),
) -> Result<Ended, SimError> {
    let Sim {
        exp,
        arms: phases,
        dir,
    } = *sim;
    // The arms that make the worlds and record their first state; each step takes its own.
    let arms = phases.start();
    let cfg = &exp.config;
    let ranks = &options.ranks;
    let mut recorder = start_run(sim, policies, manifest, start.as_ref(), options)?;
    let mut budget = options.stop_after.unwrap_or(usize::MAX);
    let groups = cfg.agents.0.len();
    let first_group = start.as_ref().map_or(0, |c| c.group);
    // The checkpoint, not the manifest, says how far the run got: a kill can fall between
    // writing one and the other.
    manifest.steps_done = start
        .as_ref()
        .map_or(0, |c| c.group * cfg.steps.0 + c.steps_done);
    let mut start = start;
    // Whether every rank agreed, at the end of the last step, to pause.
    let mut paused = false;
    for (group, &size) in cfg.agents.0.iter().enumerate().skip(first_group) {
        let mut agents = Cells::<S>::draw_agents(exp, size);
        write_personas(exp, size, &mut agents, policies)?;
        let (mut cells, first_step) = match start.take().filter(|c| c.group == group) {
            Some(cp) => resumed_cells(exp, dir, size, agents, cp)?,
            None => {
                let cells = Cells::setup(exp, arms, size, agents);
                if group == 0 {
                    check_changes_keep_the_start(exp, phases, &cells)?;
                }
                if let Some(recorder) = recorder.as_mut() {
                    recorder.start_group(exp, arms, &cells, group)?;
                }
                (cells, 0)
            }
        };
        let share = share::Share::new(
            ranks,
            options.split.unwrap_or(cfg.split),
            cells.infos.len(),
            exp,
        );
        for step in first_step..cfg.steps.0 {
            let asked = options
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::SeqCst));
            // Alone, a stop asked before the step pauses at once; shared, the ranks agree on
            // it at the end of a step, so `paused` says it.
            if budget == 0 || paused || (asked && ranks.size() == 1) {
                if let Some(recorder) = &recorder {
                    manifest.checksums = Some(record::checksums(dir)?);
                    recorder.manifest(manifest)?;
                }
                return Ok(Ended::Paused);
            }
            budget -= 1;
            let arms = phases.at(step + 1);
            options
                .faults
                .point(group * cfg.steps.0 + step + 1, fault::HANG);
            options.faults.pace();
            let started = Instant::now();
            let mut decided = |n| progress(Progress::Decided(n));
            let stepped = decide_and_resolve(
                exp,
                arms,
                &mut cells,
                step,
                &share,
                ranks,
                policies,
                asked,
                &mut decided,
            )?;
            if ranks.size() > 1 {
                paused = stepped.stop;
            }
            let decisions = stepped.decisions;
            let global_step = group * cfg.steps.0 + step + 1;
            options.faults.point(global_step, "decided");
            let timing = StepTiming {
                seconds: started.elapsed().as_secs_f64(),
                resolve_seconds: stepped.resolve.as_secs_f64(),
                exchange_seconds: stepped.exchange.as_secs_f64(),
                ranks: ranks.size(),
                rank_seconds: stepped.rank_seconds,
            };
            let recorded = match (recorder.as_mut(), &decisions) {
                (Some(recorder), Some(decisions)) => {
                    let at = (group, step, global_step);
                    record_step(
                        recorder, sim, arms, &cells, at, decisions, &timing, policies, manifest,
                    )
                    .map(|_| paused)
                }
                _ => Ok(paused),
            };
            if ranks.size() > 1 {
                paused = share::finish(ranks, recorded)?;
            } else {
                recorded?;
            }
            if let Some(decisions) = &decisions {
                progress(Progress::Step {
                    group,
                    groups,
                    population: size,
                    step: step + 1,
                    steps: cfg.steps.0,
                    step_seconds: timing.seconds,
                    decisions: decisions.turns.len(),
                });
            }
        }
    }
    if let Some(recorder) = recorder {
        recorder.manifest(manifest)?;
        recorder.finish()?;
        // Taken once the parts are joined; the caller writes the finished manifest.
        manifest.checksums = Some(record::checksums(dir)?);
    }
    Ok(Ended::Finished)
}

/// What a run checks and does before its first step: refuses what several ranks cannot
/// run, takes a resumed run's checksums from its manifest, opens the recorder (rank 0 alone
/// writes the run folder) and restores the policy from the checkpoint.
fn start_run<S: Scenario>(
    sim: &Sim<'_, S>,
    policies: &mut Policies<'_>,
    manifest: &mut Manifest,
    start: Option<&Checkpoint<S::World>>,
    options: &SimOptions,
) -> Result<Option<Recorder>, SimError> {
    let Sim { exp, arms, dir } = *sim;
    let kind = arms.kind();
    let cfg = &exp.config;
    let ranks = &options.ranks;
    let root = ranks.is_root();
    if ranks.size() > 1 && cfg.history > 0 && policies.llm.is_some() {
        return Err(SimError::Setup(format!(
            "history = {} keeps each agent's chat on the rank that decided it, which several ranks \
             do not share yet: run it as one process, or with history = 0",
            cfg.history
        )));
    }
    let state_csv = exp.records.state_csv(exp.largest_step_rows());
    // The checksums of a paused run's records no longer hold once a resume cuts or appends
    // to them: they go from the manifest before any record is touched.
    if root && manifest.checksums.take().is_some() {
        record::write_json_atomic(&dir.join(record::MANIFEST), manifest)?;
    }
    // Rank 0 alone writes the run folder.
    let recorder = match root {
        true => Some(Recorder::open(
            dir,
            state_csv,
            kind,
            start,
            options.store.clone(),
            options.faults.clone(),
        )?),
        false => None,
    };
    if let (Some(cp), Some(llm)) = (start, policies.llm.as_deref_mut()) {
        Policy::<S>::restore(llm, &cp.policy)?;
    }
    Ok(recorder)
}

/// Decides and resolves `step`: alone, every cell here; shared, this rank's part, then the
/// parts exchanged (see [`share::step`]).
#[allow(clippy::too_many_arguments)]
fn decide_and_resolve<S: Scenario>(
    exp: &Experiment,
    arms: &[S],
    cells: &mut Cells<S>,
    step: usize,
    share: &share::Share,
    ranks: &Ranks,
    policies: &mut Policies<'_>,
    asked: bool,
    decided: &mut dyn FnMut(usize),
) -> Result<share::Stepped<S::Decision>, SimError> {
    if ranks.size() > 1 {
        return share::step(
            exp, arms, cells, step, share, ranks, policies, asked, decided,
        );
    }
    let turns = step::turns(exp, arms, cells, step)?;
    let decisions = step::decide(exp, arms, cells, step, turns, policies, decided)?;
    let resolve = step::resolve(exp, arms, cells, step, &decisions, |_| true);
    Ok(share::Stepped {
        decisions: Some(decisions),
        resolve,
        exchange: std::time::Duration::ZERO,
        stop: false,
        rank_seconds: Vec::new(),
    })
}

/// Has the model write a persona for every agent of every replicate of population `size`,
/// when the config asks for LLM-written personas.
fn write_personas(
    exp: &Experiment,
    size: usize,
    agents: &mut [cells::Agents],
    policies: &mut Policies<'_>,
) -> Result<(), SimError> {
    let Some(personas) = &exp.population.personas else {
        return Ok(());
    };
    let llm = policies.llm.as_deref_mut().ok_or_else(|| {
        SimError::Setup("LLM-written personas need a model: load one for this run".into())
    })?;
    // The cache is keyed by the model's name, which only the config or the program
    // running it (`Overrides::default_model`) knows.
    // The model that writes them: the first engine's (of several, the first model the
    // config's agents ask).
    let model = llm.first_model().map(str::to_string);
    let model = model
        .as_deref()
        .or(exp.config.llm.model.as_deref())
        .ok_or_else(|| {
            SimError::Setup(
                "LLM-written personas are cached by model name: name the model \
             ([llm] model, or Overrides::default_model)"
                    .into(),
            )
        })?;
    for (replicate, a) in agents.iter_mut().enumerate() {
        let seed = cells::population_seed(exp, size, replicate);
        let written = llm.personas(personas, model, &a.population, seed)?;
        Arc::make_mut(&mut a.population).personas = Some(written);
    }
    Ok(())
}

/// The cells of population `size` as the checkpoint `cp` left them, and the step to go on
/// from; refused when the config no longer lays them out the same way.
fn resumed_cells<S: Scenario>(
    exp: &Experiment,
    dir: &Path,
    size: usize,
    agents: Vec<cells::Agents>,
    cp: Checkpoint<S::World>,
) -> Result<(Cells<S>, usize), SimError> {
    let (infos, arm_of) = Cells::<S>::layout(exp, size);
    if infos != cp.cells {
        return Err(SimError::Resume(format!(
            "the checkpoint's cells do not match the config in {}: was config.toml edited?",
            dir.display()
        )));
    }
    Ok((
        Cells {
            infos,
            arm_of,
            worlds: cp.worlds,
            agents,
        },
        cp.steps_done,
    ))
}

/// Records a decided step (rank 0): its rows and checkpoint, then the manifest that says
/// the run got this far. `at` is (population group, step, steps done over all groups).
#[allow(clippy::too_many_arguments)]
fn record_step<S: Scenario>(
    recorder: &mut Recorder,
    sim: &Sim<'_, S>,
    arms: &[S],
    cells: &Cells<S>,
    (group, step, global_step): (usize, usize, usize),
    decisions: &step::Decisions<S::Decision>,
    timing: &StepTiming,
    policies: &Policies<'_>,
    manifest: &mut Manifest,
) -> Result<(), SimError> {
    let policy_state = policies
        .llm
        .as_deref()
        .map(Policy::<S>::checkpoint)
        .unwrap_or_default();
    recorder
        .step(
            sim.exp,
            arms,
            cells,
            group,
            step,
            decisions,
            timing.clone(),
            policy_state,
        )
        .and_then(|_| {
            recorder.faults.point(global_step, "checkpoint");
            manifest.steps_done = global_step;
            manifest.status = Status::Running;
            recorder.manifest(manifest)
        })
}

/// Refuses an arm whose changes from a later step would have made other worlds at the start
/// (a market's number of producers, a game's players): such a knob cannot change on the way,
/// and a run that took it would silently keep the first worlds.
fn check_changes_keep_the_start<S: Scenario>(
    exp: &Experiment,
    arms: &Arms<S>,
    cells: &Cells<S>,
) -> Result<(), SimError> {
    for (step, later) in arms.changes() {
        for (a, arm) in exp.arms.iter().enumerate() {
            let Some(change) = arm.change.as_ref().filter(|c| c.from_step == step) else {
                continue;
            };
            if !cells.starts_alike(exp, &later[a], a) {
                return Err(SimError::Setup(format!(
                    "arm `{}`: a knob it changes from step {} ({}) shapes the worlds at the start, \
                     so it cannot change on the way: leave `from_step` out to change it from the \
                     start, or change only knobs that act on each step (prices, caps, prompts)",
                    arm.name,
                    change.from_step,
                    changed_keys(&arm.table, &change.table).join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// The keys whose values differ between two scenario tables.
fn changed_keys(before: &toml::Table, after: &toml::Table) -> Vec<String> {
    after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, _)| format!("`{k}`"))
        .collect()
}

/// A fresh folder for a run: `runs/<name>-<unix time>` unless one is given.
pub(crate) fn default_run_dir(name: &str) -> PathBuf {
    PathBuf::from("runs").join(format!("{name}-{}", record::now_unix()))
}
