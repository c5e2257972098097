//! Cell setup: the arms x replicates of one population size, each with its drawn
//! population, its world, which agents use which policy, and which agents' decisions are
//! logged. Everything but the worlds is drawn from the seed again on resume.

use super::streams::{INIT, LOG_SAMPLE, POLICY, POPULATION};
use crate::sim::config::DecisionLogMode;
use crate::sim::experiment::{Experiment, PolicyPlan};
use crate::sim::policy::{Assigned, CellView, assign};
use crate::sim::population::Population;
use crate::sim::scenario::{CellInfo, Scenario};
use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// The seed a replicate's population is drawn from (and its personas written with).
pub(crate) fn population_seed(exp: &Experiment, size: usize, replicate: usize) -> u64 {
    crate::seed::derive(
        exp.config.seed,
        &[POPULATION, size as u64, replicate as u64],
    )
}

/// Replicate 0's agents of population `size`, as a run draws them (without LLM-written
/// personas, which need the model).
pub fn first_population(exp: &Experiment, size: usize) -> Population {
    exp.population.draw(size, population_seed(exp, size, 0))
}

/// Whether scenarios `a` and `b` make the same first world for replicate 0 of population
/// `size` (whose agents are `population`) from the run's seed: a knob that changes it shapes
/// the worlds at the start, so it cannot change from a later step.
pub fn same_start<S: Scenario>(
    exp: &Experiment,
    a: &S,
    b: &S,
    size: usize,
    population: &Population,
) -> bool {
    let world = |s: &S| {
        let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(
            exp.config.seed,
            &[INIT, size as u64, 0],
        ));
        postcard::to_stdvec(&s.init(population, &mut rng)).ok()
    };
    world(a) == world(b)
}

/// Each arm's policies and routes for `population`, drawn from `seed`: the same draw for
/// arms with the same policies, so that they share their agents' routes as they share the
/// agents.
fn assigned(exp: &Experiment, population: &Population, seed: u64) -> Vec<Arc<Assigned>> {
    let kinds = exp.kinds();
    let mixed = kinds.len() > 1;
    let mut drawn: Vec<(&PolicyPlan, Arc<Assigned>)> = Vec::new();
    exp.arms
        .iter()
        .map(|arm| {
            if let Some((_, a)) = drawn.iter().find(|(p, _)| **p == arm.policies) {
                return a.clone();
            }
            let a = Arc::new(assign(&arm.policies, population, seed, &kinds, mixed));
            drawn.push((&arm.policies, a.clone()));
            a
        })
        .collect()
}

/// What a replicate's cells share: the same agents, whatever the arm (common random
/// numbers), each with the policy and route its arm gives it.
pub struct Agents {
    pub population: Arc<Population>,
    /// Per arm: each agent's policy and route (the route says its model and sampling with
    /// its arm). Arms with the same policies share one.
    pub assigned: Vec<Arc<Assigned>>,
    /// Agents whose decisions are logged; `None`: all of them (or none, by the config).
    pub logged: Option<Vec<bool>>,
}

/// The cells of one population size, stepped in lockstep.
pub struct Cells<S: Scenario> {
    pub infos: Vec<CellInfo>,
    /// Index of each cell's arm.
    pub arm_of: Vec<usize>,
    pub worlds: Vec<S::World>,
    /// Per replicate.
    pub agents: Vec<Agents>,
}

impl<S: Scenario> Cells<S> {
    /// The cells in their fixed order (replicate, then arm), without worlds.
    pub fn layout(exp: &Experiment, population: usize) -> (Vec<CellInfo>, Vec<usize>) {
        let mut infos = Vec::new();
        let mut arm_of = Vec::new();
        for replicate in 0..exp.config.replicates.0 {
            for (a, arm) in exp.arms.iter().enumerate() {
                infos.push(CellInfo {
                    arm: arm.name.clone(),
                    population,
                    replicate,
                });
                arm_of.push(a);
            }
        }
        (infos, arm_of)
    }

    /// Draws every replicate's agents for a population of `size`.
    ///
    /// Their LLM-written personas, if any, are added by the caller.
    pub(crate) fn draw_agents(exp: &Experiment, size: usize) -> Vec<Agents> {
        let seed = exp.config.seed;
        (0..exp.config.replicates.0)
            .map(|replicate| {
                let at = |stream: u64| {
                    crate::seed::derive(seed, &[stream, size as u64, replicate as u64])
                };
                let population = exp
                    .population
                    .draw(size, population_seed(exp, size, replicate));
                let assigned = assigned(exp, &population, at(POLICY));
                let logged = match exp.records.decisions {
                    DecisionLogMode::Sample(n) if n < size => {
                        let mut rng = ChaCha8Rng::seed_from_u64(at(LOG_SAMPLE));
                        let mut mask = vec![false; size];
                        for i in sample(&mut rng, size, n) {
                            mask[i] = true;
                        }
                        Some(mask)
                    }
                    _ => None,
                };
                Agents {
                    population: Arc::new(population),
                    assigned,
                    logged,
                }
            })
            .collect()
    }

    /// New worlds for every cell, from the seed.
    pub fn setup(exp: &Experiment, arms: &[S], size: usize, agents: Vec<Agents>) -> Self {
        let (infos, arm_of) = Self::layout(exp, size);
        let worlds = infos
            .iter()
            .zip(&arm_of)
            .map(|(info, &a)| {
                let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(
                    exp.config.seed,
                    &[INIT, size as u64, info.replicate as u64],
                ));
                arms[a].init(&agents[info.replicate].population, &mut rng)
            })
            .collect();
        Self {
            infos,
            arm_of,
            worlds,
            agents,
        }
    }

    /// Whether scenario `other` makes the same first world for arm `arm`'s first cell as the
    /// arm's own made in `setup`, from the same seed.
    pub(crate) fn starts_alike(&self, exp: &Experiment, other: &S, arm: usize) -> bool {
        let Some(c) = self.arm_of.iter().position(|&x| x == arm) else {
            return true;
        };
        let info = &self.infos[c];
        let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(
            exp.config.seed,
            &[INIT, info.population as u64, info.replicate as u64],
        ));
        let other = other.init(&self.agents[info.replicate].population, &mut rng);
        postcard::to_stdvec(&self.worlds[c]).ok() == postcard::to_stdvec(&other).ok()
    }

    /// Every cell as its policies see it at `step`.
    pub(crate) fn views<'a>(
        &'a self,
        exp: &'a Experiment,
        arms: &'a [S],
        step: usize,
    ) -> Vec<CellView<'a, S>> {
        self.infos
            .iter()
            .enumerate()
            .map(|(c, info)| CellView {
                scenario: &arms[self.arm_of[c]],
                world: &self.worlds[c],
                population: self.population(c),
                info,
                llm: &exp.arms[self.arm_of[c]].llm,
                llms: {
                    let per_arm = exp.routes_per_arm();
                    let start = self.arm_of[c] * per_arm;
                    &exp.routes[start..start + per_arm]
                },
                route: self.assigned(c).route.as_deref(),
                step,
            })
            .collect()
    }

    /// The policy and route of each agent of cell `cell`.
    pub fn assigned(&self, cell: usize) -> &Assigned {
        &self.agents[self.infos[cell].replicate].assigned[self.arm_of[cell]]
    }

    pub fn population(&self, cell: usize) -> &Population {
        &self.agents[self.infos[cell].replicate].population
    }

    /// Whether agent `agent`'s decisions in cell `cell` go to the decisions log.
    pub fn logged(&self, exp: &Experiment, cell: usize, agent: usize) -> bool {
        match exp.records.decisions {
            DecisionLogMode::None => false,
            DecisionLogMode::All => true,
            DecisionLogMode::Sample(_) => self.agents[self.infos[cell].replicate]
                .logged
                .as_ref()
                .is_none_or(|m| m[agent]),
        }
    }
}

/// The LLM agents each model of `exp` decides for (in the order of
/// [`Experiment::models`]), counted over the cells of one replicate of the largest population
/// size: the share of the work each model has, which its share of the KV memory follows.
/// With policy groups it draws that population (as the run will) to count their members.
pub fn model_agents(exp: &Experiment) -> Vec<(Option<String>, u64)> {
    let models = exp.models();
    let mut counts = vec![0u64; models.len()];
    let Some(&size) = exp.config.agents.0.iter().max() else {
        return models.into_iter().zip(counts).collect();
    };
    let seed = |stream: u64| crate::seed::derive(exp.config.seed, &[stream, size as u64, 0]);
    let drawn = exp
        .arms
        .iter()
        .any(|a| !a.policies.groups.is_empty())
        .then(|| assigned(exp, &first_population(exp, size), seed(POLICY)));
    for arm in 0..exp.arms.len() {
        let mut per_route = vec![0u64; exp.routes_per_arm()];
        match drawn.as_ref().and_then(|d| d[arm].route.as_ref()) {
            Some(routes) => routes.iter().for_each(|&r| per_route[r as usize] += 1),
            None => per_route[0] = size as u64,
        }
        for (route, &n) in per_route.iter().enumerate() {
            let route = route as u8;
            if n == 0 || exp.policy_of_route(arm, route) != crate::sim::config::PolicyKind::Llm {
                continue;
            }
            let model = &exp.llm_of(arm, route).model;
            if let Some(i) = models.iter().position(|m| m == model) {
                counts[i] += n;
            }
        }
    }
    models.into_iter().zip(counts).collect()
}
