//! Which agents of a cell use which policy, when a config mixes them: each policy group takes
//! a seeded sample of the agents that match its conditions and are not taken yet; the rest
//! use their arm's policy (the experiment's, unless the arm sets its own).

use crate::sim::config::PolicyKind;
use crate::sim::experiment::{Condition, PolicyPlan};
use crate::sim::population::{Column, Population};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Which policy and route each agent of one arm's cells has.
#[derive(Debug, Clone, PartialEq)]
pub struct Assigned {
    /// Each agent's policy, as an index into the experiment's kinds; `None` when every agent
    /// uses `default` and the run mixes no policies.
    pub policy: Option<Vec<u8>>,
    /// Each agent's route (see [`routes`]); `None`: the arm has no policy groups.
    pub route: Option<Vec<u8>>,
    /// The arm's own policy, as an index into the experiment's kinds.
    pub default: u8,
}

impl Assigned {
    /// Agent `agent`'s policy, as an index into the experiment's kinds.
    pub fn policy_of(&self, agent: usize) -> u8 {
        self.policy.as_ref().map_or(self.default, |p| p[agent])
    }

    /// Agent `agent`'s route.
    pub fn route_of(&self, agent: usize) -> u8 {
        self.route.as_ref().map_or(0, |r| r[agent])
    }
}

/// The policies and routes of an arm's agents under `plan`, drawn from `seed`; policies as
/// indices into `kinds` (the experiment's, which hold every kind of `plan`), listed for every
/// agent when the run `mixed` policies, in this arm or across arms.
pub fn assign(
    plan: &PolicyPlan,
    population: &Population,
    seed: u64,
    kinds: &[PolicyKind],
    mixed: bool,
) -> Assigned {
    let route = routes(plan, population, seed);
    let default = index_in(kinds, plan.default);
    let policy = match &route {
        Some(route) => Some(policies_of(plan, route, kinds)),
        None => mixed.then(|| vec![default; population.size]),
    };
    Assigned {
        policy,
        route,
        default,
    }
}

fn index_in(kinds: &[PolicyKind], kind: PolicyKind) -> u8 {
    kinds
        .iter()
        .position(|&x| x == kind)
        .expect("invariant: the experiment's kinds hold every arm's") as u8
}

/// The policy of each agent of `routes` (see [`routes`]), as an index into `kinds`.
pub fn policies_of(plan: &PolicyPlan, routes: &[u8], kinds: &[PolicyKind]) -> Vec<u8> {
    let of_route: Vec<u8> = std::iter::once(plan.default)
        .chain(plan.groups.iter().map(|g| g.policy))
        .map(|k| index_in(kinds, k))
        .collect();
    routes.iter().map(|&r| of_route[r as usize]).collect()
}

/// Each agent's route: 0 for the experiment's policy (and its arm's model), `g + 1` for
/// policy group `g` (its policy, and its own model and sampling, if it names them); `None`
/// when there are no groups.
pub fn routes(plan: &PolicyPlan, population: &Population, seed: u64) -> Option<Vec<u8>> {
    if plan.groups.is_empty() {
        return None;
    }
    let mut assigned: Vec<Option<u8>> = vec![None; population.size];
    for (g, group) in plan.groups.iter().enumerate() {
        let mut matching: Vec<usize> = (0..population.size)
            .filter(|&a| assigned[a].is_none())
            .filter(|&a| {
                group.filter.iter().all(|(attr, condition)| {
                    match (&population.columns[*attr].1, condition) {
                        (Column::Categorical { codes, .. }, Condition::OneOf(ok)) => {
                            ok.contains(&codes[a])
                        }
                        (Column::Numeric { values, .. }, Condition::Within(lo, hi)) => {
                            (*lo..=*hi).contains(&(values[a] as f64))
                        }
                        _ => false,
                    }
                })
            })
            .collect();
        let take = (group.share * matching.len() as f64).round() as usize;
        let mut rng = ChaCha8Rng::seed_from_u64(crate::seed::derive(seed, &[g as u64]));
        matching.shuffle(&mut rng);
        for &a in &matching[..take] {
            assigned[a] = Some(g as u8 + 1);
        }
    }
    Some(assigned.into_iter().map(|a| a.unwrap_or(0)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::experiment::PolicyGroup;
    use std::sync::Arc;

    #[test]
    fn a_group_takes_its_share_of_the_matching_agents() {
        let population = Population {
            size: 1000,
            columns: vec![(
                "education".into(),
                Column::Categorical {
                    categories: Arc::from(vec!["school".to_string(), "university".to_string()]),
                    codes: (0..1000).map(|i| (i % 2) as u16).collect(),
                },
            )],
            ..Population::default()
        };
        let plan = PolicyPlan {
            default: PolicyKind::Scripted,
            groups: vec![PolicyGroup {
                policy: PolicyKind::Llm,
                share: 0.1,
                filter: vec![(0, Condition::OneOf(vec![1]))],
                llm: Default::default(),
                span: 0..0,
            }],
        };
        let draw = |seed| assign(&plan, &population, seed, &plan.kinds(), false);
        let a = draw(7).policy.unwrap();
        // kinds() = [scripted, llm]: 10% of the 500 university agents use the model.
        let llm: Vec<usize> = (0..1000).filter(|&i| a[i] == 1).collect();
        assert_eq!(llm.len(), 50);
        assert!(llm.iter().all(|i| i % 2 == 1));
        assert_eq!(draw(7).policy.unwrap(), a, "seeded");
        assert_ne!(draw(8).policy.unwrap(), a);
    }
}
