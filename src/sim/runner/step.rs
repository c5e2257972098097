//! One step of every cell: who takes a turn, their decisions (each agent through its
//! policy), then every cell's world resolved at once.

use super::SimError;
use super::cells::Cells;
use super::streams::{AGENT, RESOLVE};
use crate::sim::config::PolicyKind;
use crate::sim::experiment::Experiment;
use crate::sim::policy::{AgentTurn, Decided, Llm, Policy, PolicyTimes, Scripted};
use crate::sim::scenario::Scenario;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::time::{Duration, Instant};

/// The policies a run may use; `llm` is absent when no agent asks the model.
pub struct Policies<'p> {
    pub scripted: Scripted,
    pub llm: Option<&'p mut Llm>,
}

impl Policies<'_> {
    fn get<S: Scenario>(&mut self, kind: PolicyKind) -> Result<&mut dyn Policy<S>, SimError> {
        match kind {
            PolicyKind::Scripted => Ok(&mut self.scripted),
            PolicyKind::Llm => match self.llm.as_deref_mut() {
                Some(llm) => Ok(llm),
                None => Err(SimError::Setup(
                    "the llm policy has no engine: load a model for this run".into(),
                )),
            },
        }
    }
}

/// What a step decided, and where its time went.
pub struct Decisions<D> {
    pub turns: Vec<AgentTurn>,
    pub decided: Vec<Decided<D>>,
    /// The policy of each turn (index into the plan's kinds).
    pub policy_of: Option<Vec<u8>>,
    pub prompts: PolicyTimes,
}

/// The agents of every cell that take a turn at `step`, cell by cell, in agent order: the
/// order decisions are recorded in, whoever decides them. The step's largest allocation, so
/// it is made fallibly: a machine that cannot hold it fails the run with an error (the
/// folder then says `failed`, and `--resume` continues it) instead of aborting.
pub fn turns<S: Scenario>(
    exp: &Experiment,
    arms: &[S],
    cells: &Cells<S>,
    step: usize,
) -> Result<Vec<AgentTurn>, SimError> {
    let seed = exp.config.seed;
    let agents = cells
        .worlds
        .iter()
        .enumerate()
        .map(|(c, world)| arms[cells.arm_of[c]].num_agents(world))
        .fold(0usize, usize::saturating_add);
    let mut turns = Vec::new();
    turns.try_reserve_exact(agents).map_err(|_| {
        SimError::Setup(format!(
            "out of memory: step {} cannot hold the turns of its {agents} agents ({}); run \
             fewer agents, replicates or arms",
            step + 1,
            crate::host::human_bytes(agents as f64 * std::mem::size_of::<AgentTurn>() as f64)
        ))
    })?;
    for (c, (info, world)) in cells.infos.iter().zip(&cells.worlds).enumerate() {
        let scenario = &arms[cells.arm_of[c]];
        for agent in 0..scenario.num_agents(world) {
            if scenario.acts(world, agent) {
                let seed = crate::seed::derive(
                    seed,
                    &[
                        AGENT,
                        info.population as u64,
                        info.replicate as u64,
                        agent as u64,
                        step as u64,
                    ],
                );
                turns.push(AgentTurn {
                    cell: c,
                    agent,
                    seed,
                    logged: cells.logged(exp, c, agent),
                });
            }
        }
    }
    Ok(turns)
}

/// The policy of each of `turns` (an index into the plan's kinds), when the run mixes them.
pub(crate) fn policy_of<S: Scenario>(
    exp: &Experiment,
    cells: &Cells<S>,
    turns: &[AgentTurn],
) -> Option<Vec<u8>> {
    exp.is_mixed().then(|| {
        turns
            .iter()
            .map(|t| cells.assigned(t.cell).policy_of(t.agent))
            .collect()
    })
}

/// The agents of `turns` decide, each through its own policy.
pub fn decide<S: Scenario>(
    exp: &Experiment,
    arms: &[S],
    cells: &Cells<S>,
    step: usize,
    turns: Vec<AgentTurn>,
    policies: &mut Policies<'_>,
    done: &mut dyn FnMut(usize),
) -> Result<Decisions<S::Decision>, SimError> {
    let views = cells.views(exp, arms, step);
    let kinds = exp.kinds();
    let policy_of = policy_of(exp, cells, &turns);
    let mut prompts = PolicyTimes::default();
    let decided = match &policy_of {
        None => {
            let policy = policies.get::<S>(kinds[0])?;
            let decided = policy.decide(&views, &turns, done)?;
            prompts = policy.take_times();
            decided
        }
        Some(policy_of) => {
            let mut slots: Vec<Option<Decided<S::Decision>>> =
                (0..turns.len()).map(|_| None).collect();
            for (k, &kind) in kinds.iter().enumerate() {
                let (index, subset): (Vec<usize>, Vec<AgentTurn>) = turns
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| policy_of[*i] as usize == k)
                    .map(|(i, t)| (i, *t))
                    .unzip();
                if subset.is_empty() {
                    continue;
                }
                let policy = policies.get::<S>(kind)?;
                for (i, d) in index.into_iter().zip(policy.decide(&views, &subset, done)?) {
                    slots[i] = Some(d);
                }
                let t = policy.take_times();
                prompts.template += t.template;
                prompts.tokenize += t.tokenize;
                prompts.forward += t.forward;
                prompts.masks += t.masks;
                prompts.kv_peak_bytes = prompts.kv_peak_bytes.max(t.kv_peak_bytes);
                prompts.reused += t.reused;
            }
            slots
                .into_iter()
                .map(|d| d.expect("invariant: every turn has a policy"))
                .collect()
        }
    };
    Ok(Decisions {
        turns,
        decided,
        policy_of,
        prompts,
    })
}

/// Applies the step's decisions to the worlds of the cells for which `mine` holds (every
/// cell, but for a rank that steps only its own), all at once; returns the time it took.
pub fn resolve<S: Scenario>(
    exp: &Experiment,
    arms: &[S],
    cells: &mut Cells<S>,
    step: usize,
    decisions: &Decisions<S::Decision>,
    mine: impl Fn(usize) -> bool + Sync,
) -> Duration {
    let started = Instant::now();
    let mut per_cell: Vec<Vec<Option<S::Decision>>> = cells
        .worlds
        .iter()
        .enumerate()
        .map(|(c, world)| match mine(c) {
            true => vec![None; arms[cells.arm_of[c]].num_agents(world)],
            false => Vec::new(),
        })
        .collect();
    for (t, d) in decisions.turns.iter().zip(&decisions.decided) {
        per_cell[t.cell][t.agent] = Some(d.decision.clone());
    }
    let seed = exp.config.seed;
    // Field by field, since the worlds are borrowed mutably beside them.
    let populations: Vec<&crate::sim::population::Population> = cells
        .infos
        .iter()
        .map(|info| &*cells.agents[info.replicate].population)
        .collect();
    cells
        .worlds
        .par_iter_mut()
        .zip(&cells.infos)
        .zip(&cells.arm_of)
        .zip(per_cell)
        .enumerate()
        .filter(|(c, _)| mine(*c))
        .for_each(|(c, (((world, info), &a), decisions))| {
            let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(
                seed,
                &[
                    RESOLVE,
                    info.population as u64,
                    info.replicate as u64,
                    step as u64,
                ],
            ));
            let population = populations[c];
            arms[a].resolve(world, population, &decisions, &mut rng);
            for group in population.groups.bottom_up() {
                arms[a].react(world, population, group);
            }
        });
    started.elapsed()
}
