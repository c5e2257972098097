//! The run's records, step by step: state (Parquet parts, and CSV), aggregates, the
//! decisions log, step timings, then a checkpoint and the manifest, in that order, so that
//! a crash at any point loses at most the step being written and `--resume` cuts it away.

use super::SimError;
use super::cells::Cells;
use super::step::Decisions;
use crate::record::store::Store;
use crate::record::{
    self, CellRecord, Counters, DecisionLog, DecisionRecord, KeptPrompt, MANIFEST, Manifest,
    StepRecord, StepWriter, checkpoint,
};
use crate::sim::experiment::Experiment;
use crate::sim::policy::count;
use crate::sim::scenario::{CellInfo, Descriptor, Scenario};
use arrow_array::RecordBatch;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Where a run stands, saved after every step.
#[derive(Serialize, Deserialize)]
pub struct Checkpoint<W> {
    /// Index of the population size being run.
    pub group: usize,
    /// Steps of that group already done.
    pub steps_done: usize,
    pub cells: Vec<CellInfo>,
    pub worlds: Vec<W>,
    /// The LLM policy's state (chat histories).
    pub policy: Vec<u8>,
    /// Lengths of the appended files when it was taken.
    pub files: BTreeMap<String, u64>,
    /// Parquet parts written so far.
    pub parts: Vec<String>,
    pub counters: Counters,
}

/// The same, borrowed, for writing without copying the worlds.
#[derive(Serialize)]
struct CheckpointRef<'a, W> {
    group: usize,
    steps_done: usize,
    cells: &'a [CellInfo],
    worlds: &'a [W],
    policy: &'a [u8],
    files: &'a BTreeMap<String, u64>,
    parts: &'a [String],
    counters: &'a Counters,
}

pub struct Recorder {
    dir: PathBuf,
    writer: StepWriter,
    parts: Vec<String>,
    pub counters: Counters,
    /// Hashes of the prompts `prompts.jsonl` holds: each is written once.
    prompts_kept: std::collections::HashSet<String>,
    /// The run's decision store, when it keeps its replies.
    store: Option<Store>,
    /// The scenario's kind: whether the state has a `role` column, its own tables.
    kind: Descriptor,
    /// Crash points asked for tests, between the writes of a step.
    pub(super) faults: super::fault::Faults,
}

impl Recorder {
    /// Opens `dir` for a run from `from`, cutting the records back to the checkpoint's
    /// lengths, or from nothing, emptying them (a resumed run killed in its first step, or a
    /// new run's empty folder).
    /// `kind`'s aggregates give the columns of `aggregates.csv`, if it keeps one.
    pub fn open<W>(
        dir: &Path,
        state_csv: bool,
        kind: &Descriptor,
        from: Option<&Checkpoint<W>>,
        store: Option<Store>,
        faults: super::fault::Faults,
    ) -> Result<Self, SimError> {
        let (parts, counters) = match from {
            Some(cp) => {
                record::writer_rewind(dir, &cp.files, &cp.parts)?;
                (cp.parts.clone(), cp.counters)
            }
            None => {
                record::writer_reset(dir)?;
                (Vec::new(), Counters::default())
            }
        };
        // A resumed run keeps the prompts written before its checkpoint.
        let prompts_kept = std::fs::read_to_string(dir.join(record::PROMPTS))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<KeptPrompt>(l).ok())
            .map(|k| k.hash)
            .collect();
        Ok(Self {
            dir: dir.to_path_buf(),
            writer: StepWriter::open(
                dir,
                state_csv,
                kind.aggregates
                    .as_ref()
                    .map(|own| super::rows::keyed_schema(own))
                    .as_deref(),
            )?,
            parts,
            counters,
            prompts_kept,
            store,
            kind: kind.clone(),
            faults,
        })
    }

    /// A new group's fixed data (`cells.jsonl`) and its state before anyone moves.
    pub(crate) fn start_group<S: Scenario>(
        &mut self,
        exp: &Experiment,
        arms: &[S],
        cells: &Cells<S>,
        group: usize,
    ) -> Result<(), SimError> {
        self.writer
            .cells(cells.infos.iter().enumerate().map(|(c, info)| CellRecord {
                arm: info.arm.clone(),
                population: info.population,
                replicate: info.replicate,
                world: arms[cells.arm_of[c]].records().describe(&cells.worlds[c]),
            }))?;
        self.personas(cells, group)?;
        self.state(exp, arms, cells, group, 0)?;
        // Step 0 is the world before any decision, as in the state table.
        self.aggregates(arms, cells, 0)
    }

    /// The LLM-written personas of a new group's agents, one row per agent of each
    /// replicate (every arm of a replicate has the same agents), into `personas.parquet`:
    /// part of the group's first part, so that a resume keeps or cuts it with that part.
    fn personas<S: Scenario>(&mut self, cells: &Cells<S>, group: usize) -> Result<(), SimError> {
        use arrow_array::{ArrayRef, StringArray, UInt64Array};
        let batches: Vec<_> = cells
            .agents
            .iter()
            .enumerate()
            .filter_map(|(replicate, agents)| {
                let personas = agents.population.personas.as_ref()?;
                let n = personas.len();
                let constant =
                    |v: usize| Arc::new(UInt64Array::from_value(v as u64, n)) as ArrayRef;
                let population = cells.infos.first().map_or(n, |c| c.population);
                Some(
                    arrow_array::RecordBatch::try_from_iter([
                        ("population", constant(population)),
                        ("replicate", constant(replicate)),
                        (
                            "agent",
                            Arc::new(UInt64Array::from_iter_values(0..n as u64)) as ArrayRef,
                        ),
                        (
                            "persona",
                            Arc::new(StringArray::from_iter_values(personas.iter())) as ArrayRef,
                        ),
                    ])
                    .expect("invariant: columns of one length"),
                )
            })
            .collect();
        let part = format!("g{group:03}-s{:06}", 0);
        self.writer.table(record::PERSONAS, &part, &batches)?;
        Ok(())
    }

    fn state<S: Scenario>(
        &mut self,
        exp: &Experiment,
        arms: &[S],
        cells: &Cells<S>,
        group: usize,
        step: usize,
    ) -> Result<(), SimError> {
        let kinds = exp.kinds();
        let multi_model = exp.is_multi_model();
        let several_roles = self.kind.several_roles();
        let name = &self.kind.name;
        // Asked once per step, and only of a scenario that builds its table from rows.
        let fields = std::sync::OnceLock::new();
        let tables: Vec<(RecordBatch, Option<RecordBatch>)> = (0..cells.infos.len())
            .into_par_iter()
            .map(|c| {
                let scenario = &arms[cells.arm_of[c]];
                let world = &cells.worlds[c];
                let population = cells.population(c);
                let info = &cells.infos[c];
                let records = scenario.records();
                if let Some(own) = records.state(world, population, info, step) {
                    return Ok((own, None));
                }
                let n = scenario.num_agents(world);
                let keys = super::rows::Keys {
                    roles: several_roles.then(|| (0..n).map(|a| scenario.role(world, a)).collect()),
                    policy: cells
                        .assigned(c)
                        .policy
                        .as_ref()
                        .map(|p| p.iter().map(|&k| kinds[k as usize].name()).collect()),
                    model: multi_model
                        .then(|| (0..n).map(|a| model_of(exp, cells, c, a)).collect()),
                    population,
                };
                let fields = fields
                    .get_or_init(|| records.row_fields())
                    .as_ref()
                    .map_err(|e| SimError::table(name, e.clone()))?;
                let table = super::rows::state(scenario, fields, world, &keys, info, step)
                    .map_err(|e| SimError::table(name, e))?;
                let groups = super::rows::group_means(&population.groups, &table, info, step);
                Ok((table, groups))
            })
            .collect::<Result<_, SimError>>()?;
        let (batches, group_tables): (Vec<_>, Vec<_>) = tables.into_iter().unzip();
        let part = format!("g{group:03}-s{step:06}");
        self.writer.state(&part, &batches)?;
        let group_tables: Vec<RecordBatch> = group_tables.into_iter().flatten().collect();
        if !group_tables.is_empty() {
            self.writer.table(record::GROUPS, &part, &group_tables)?;
        }
        for &name in self.kind.tables {
            let batches: Vec<_> = (0..cells.infos.len())
                .into_par_iter()
                .filter_map(|c| {
                    arms[cells.arm_of[c]].records().table(
                        name,
                        &cells.worlds[c],
                        &cells.infos[c],
                        step,
                    )
                })
                .collect();
            self.writer.table(name, &part, &batches)?;
        }
        self.parts.push(part);
        Ok(())
    }

    /// Records a finished step, then checkpoints it.
    #[allow(clippy::too_many_arguments)]
    pub fn step<S: Scenario>(
        &mut self,
        exp: &Experiment,
        arms: &[S],
        cells: &Cells<S>,
        group: usize,
        step: usize,
        decisions: &Decisions<S::Decision>,
        timing: StepTiming,
        policy_state: Vec<u8>,
    ) -> Result<Counters, SimError> {
        let started = Instant::now();
        let global_step = group * exp.config.steps.0 + step + 1;
        // The step's replies (every rank's: their traces crossed with the decisions) are kept
        // first, in one transaction. A kill after this keeps the replies of a step the run
        // will make again, under the same keys.
        if let Some(store) = &self.store {
            let replies: Vec<_> = decisions
                .decided
                .iter()
                .filter_map(|d| d.llm.as_deref()?.stored_reply())
                .collect();
            store.insert(&replies)?;
        }
        self.state(exp, arms, cells, group, step + 1)?;
        self.faults.point(global_step, "state");
        self.aggregates(arms, cells, step + 1)?;
        let mut counters = Counters {
            seconds: timing.seconds,
            ..Counters::default()
        };
        for d in &decisions.decided {
            count(&mut counters, d);
        }
        self.decisions(exp, arms, cells, step + 1, decisions)?;
        self.prompts(decisions)?;
        let n = decisions.turns.len();
        let model_decisions = decisions.decided.iter().filter(|d| d.llm.is_some()).count();
        self.writer.step(&StepRecord {
            population: cells.infos.first().map_or(0, |c| c.population),
            step: step + 1,
            cells: cells.infos.len(),
            decisions: n,
            fallbacks: counters.fallbacks as usize,
            seconds: timing.seconds,
            decisions_per_second: n as f64 / timing.seconds.max(1e-9),
            prompt_tokens: counters.prompt_tokens as usize,
            cached_tokens: counters.cached_tokens as usize,
            generated_tokens: counters.generated_tokens as usize,
            template_seconds: decisions.prompts.template.as_secs_f64(),
            tokenize_seconds: decisions.prompts.tokenize.as_secs_f64(),
            resolve_seconds: timing.resolve_seconds,
            record_seconds: started.elapsed().as_secs_f64(),
            ranks: timing.ranks,
            exchange_seconds: timing.exchange_seconds,
            clamped: counters.clamped as usize,
            forward_seconds: decisions.prompts.forward.as_secs_f64(),
            mask_seconds: decisions.prompts.masks.as_secs_f64(),
            kv_bytes: decisions.prompts.kv_peak_bytes,
            rank_seconds: timing
                .rank_seconds
                .iter()
                .map(|s| format!("{s:.6}"))
                .collect::<Vec<_>>()
                .join(" "),
            reused: decisions.prompts.reused,
            model_decisions,
            scripted_decisions: n.saturating_sub(model_decisions),
        })?;
        self.counters.add(&counters);
        self.faults.point(global_step, "records");
        checkpoint::write(
            &self.dir,
            &CheckpointRef {
                group,
                steps_done: step + 1,
                cells: &cells.infos,
                worlds: &cells.worlds,
                policy: &policy_state,
                files: &self.writer.lengths()?,
                parts: &self.parts,
                counters: &self.counters,
            },
        )?;
        Ok(counters)
    }

    /// Writes the aggregates of step `step` (counted from 1; 0 is the world before the first
    /// step) of every cell.
    fn aggregates<S: Scenario>(
        &mut self,
        arms: &[S],
        cells: &Cells<S>,
        step: usize,
    ) -> Result<(), SimError> {
        // The runner puts the cell's keys in front of the scenario's own columns.
        let aggregates: Vec<_> = (0..cells.infos.len())
            .filter_map(|c| {
                let own = arms[cells.arm_of[c]].records().aggregates(
                    &cells.worlds[c],
                    &cells.infos[c],
                    step,
                )?;
                Some(super::rows::keyed(&own, &cells.infos[c], step))
            })
            .collect::<Result<_, _>>()?;
        self.writer.aggregates(&aggregates)?;
        Ok(())
    }

    /// Logs the decisions of step `step` (counted from 1) of the agents whose decisions are
    /// logged.
    fn decisions<S: Scenario>(
        &mut self,
        exp: &Experiment,
        arms: &[S],
        cells: &Cells<S>,
        step: usize,
        decisions: &Decisions<S::Decision>,
    ) -> Result<(), SimError> {
        let kinds = exp.kinds();
        let multi_model = exp.is_multi_model();
        let records = decisions
            .turns
            .iter()
            .zip(&decisions.decided)
            .enumerate()
            .filter(|(_, (t, _))| cells.logged(exp, t.cell, t.agent))
            .map(|(i, (t, d))| {
                let info = &cells.infos[t.cell];
                let scenario = &arms[cells.arm_of[t.cell]];
                let world = &cells.worlds[t.cell];
                let decision = serde_json::to_value(&d.decision).unwrap_or_default();
                let trace = d.llm.as_deref();
                DecisionRecord {
                    arm: info.arm.clone(),
                    population: info.population,
                    replicate: info.replicate,
                    step,
                    agent: t.agent,
                    log: DecisionLog {
                        // The world has moved on, but an agent's role does not change.
                        role: scenario.role(world, t.agent).to_string(),
                        policy: decisions
                            .policy_of
                            .as_ref()
                            .map(|p| kinds[p[i] as usize].name().to_string()),
                        model: multi_model
                            .then(|| model_of(exp, cells, t.cell, t.agent))
                            .filter(|m| !m.is_empty())
                            .map(str::to_string),
                        prompt_hash: trace.map(|t| t.prompt_hash.clone()),
                        text: trace.and_then(|t| t.text.clone()),
                        value: match trace {
                            Some(t) => t.value.clone(),
                            None => Some(decision.clone()),
                        },
                        clamps: d.clamps.clone(),
                        fallback: d.fallback.clone(),
                        prompt_tokens: trace.map_or(0, |t| t.prompt_tokens),
                        cached_tokens: trace.map_or(0, |t| t.cached_tokens),
                        generated_tokens: trace.map_or(0, |t| t.generated_tokens),
                        latency_ms: trace.and_then(|t| t.latency_ms),
                    },
                    decision,
                }
            });
        self.writer.decisions(records)?;
        Ok(())
    }

    /// Keeps the whole prompts of the step's logged model decisions, each distinct one once.
    fn prompts<D>(&mut self, decisions: &Decisions<D>) -> Result<(), SimError> {
        // Written as they are put together.
        let prompts_kept = &mut self.prompts_kept;
        let kept = decisions
            .turns
            .iter()
            .zip(&decisions.decided)
            .filter(|(t, _)| t.logged)
            .filter_map(|(_, d)| {
                let trace = d.llm.as_deref()?;
                let transcript = trace.prompt.as_ref()?;
                prompts_kept
                    .insert(trace.prompt_hash.clone())
                    .then(|| KeptPrompt {
                        hash: trace.prompt_hash.clone(),
                        text: transcript.text(),
                    })
            });
        self.writer.prompts(kept)?;
        Ok(())
    }

    /// Writes the manifest with the totals so far.
    pub fn manifest(&self, manifest: &mut Manifest) -> Result<(), SimError> {
        manifest.counters = self.counters;
        manifest.peak_rss_bytes = record::peak_rss_bytes();
        record::write_json_atomic(&self.dir.join(MANIFEST), manifest)?;
        Ok(())
    }

    /// Joins the Parquet parts into `state.parquet`.
    pub fn finish(self) -> Result<(), SimError> {
        record::merge_parts(&self.dir)?;
        Ok(())
    }
}

/// How long a step's phases took.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepTiming {
    pub seconds: f64,
    pub resolve_seconds: f64,
    /// Of `seconds`: exchanging the step with the other ranks.
    pub exchange_seconds: f64,
    pub ranks: usize,
    /// Under MPI, each rank's own time for its part (empty alone).
    pub rank_seconds: Vec<f64>,
}

/// The model agent `agent` of cell `cell` asks: its route's (see
/// [`Experiment::llm_of`]), empty when no model decides for it.
fn model_of<'a, S: Scenario>(
    exp: &'a Experiment,
    cells: &Cells<S>,
    cell: usize,
    agent: usize,
) -> &'a str {
    let arm = cells.arm_of[cell];
    let route = cells.assigned(cell).route_of(agent);
    match exp.policy_of_route(arm, route) {
        crate::sim::config::PolicyKind::Llm => {
            exp.llm_of(arm, route).model.as_deref().unwrap_or("")
        }
        crate::sim::config::PolicyKind::Scripted => "",
    }
}
