//! How the ranks of a job share a step, and how their parts come back together in the order
//! one process would have produced them, so that records never depend on the rank count.
//!
//! - `cells`: cell `c` belongs to rank `c % ranks`; a rank decides and resolves its own cells
//!   and sends rank 0 their decisions and worlds.
//! - `agents`: every rank holds every cell; the step's turns (cell by cell, agent by agent)
//!   are cut into one contiguous run per rank, each rank decides its run, the decisions are
//!   all-gathered, and every rank resolves every cell with the same seeds.
//! - `models`: as `agents`, but a turn belongs to the rank of its agent's model
//!   ([`model_rank`]), so that each rank loads only its own models.
//!
//! Either way rank 0 alone writes the run folder, then sends every rank the step's outcome
//! (go on, pause, or fail), so that all stop together.

use super::SimError;
use super::cells::Cells;
use super::step::{self, Decisions, Policies};
use crate::cluster::Ranks;
use crate::sim::config::{PolicyKind, Split};
use crate::sim::experiment::Experiment;
use crate::sim::policy::{AgentTurn, Decided, PolicyTimes};
use crate::sim::scenario::Scenario;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::time::{Duration, Instant};

/// The split used for a population size of `cells` cells on `ranks` ranks: `auto` deals
/// cells out when they divide evenly (no exchange of decisions, and a rank's KV cache holds
/// only its own cells' prefixes), else splits by agents.
pub fn choose(split: Split, cells: usize, ranks: usize) -> Split {
    match split {
        Split::Auto if cells.is_multiple_of(ranks) => Split::Cells,
        Split::Auto => Split::Agents,
        chosen => chosen,
    }
}

/// The ranks of each of the run's models (in [`Experiment::models`]'s order) when the split
/// is by models, from the agents each decides for. With at least as many ranks as models,
/// each model gets ranks of its own: one each, then every further rank to the model with the
/// most agents per rank (a model's ranks are consecutive, in model order). With fewer, model
/// `m` goes to rank `m % ranks`, which then holds several. `throng plan` places models the
/// same way.
pub fn model_ranks(agents: &[u64], ranks: usize) -> Vec<Vec<usize>> {
    let models = agents.len();
    if ranks < models {
        return (0..models).map(|m| vec![m % ranks.max(1)]).collect();
    }
    let mut count = vec![1usize; models];
    for _ in models..ranks {
        let Some(next) = (0..models).max_by(|&a, &b| {
            let per = |m: usize| agents[m] as f64 / count[m] as f64;
            per(a).total_cmp(&per(b)).then(b.cmp(&a))
        }) else {
            break;
        };
        count[next] += 1;
    }
    let mut first = 0;
    count
        .iter()
        .map(|&n| {
            let owned = (first..first + n).collect();
            first += n;
            owned
        })
        .collect()
}

/// This rank's part of a population size's steps.
#[derive(Debug, Clone)]
pub(crate) struct Share {
    pub rank: usize,
    pub ranks: usize,
    /// `Cells`, `Agents` or `Models`, never `Auto`.
    pub split: Split,
    /// Split by models: worked out once per population size, not per step.
    by_model: Option<ByModel>,
}

/// Where each model's turns go when the split is by models.
#[derive(Debug, Clone)]
struct ByModel {
    /// The ranks of each model ([`model_ranks`]).
    ranks_of: Vec<Vec<usize>>,
    /// The model of each (arm, route), at `arm * routes_per_arm + route` (`None`: scripted).
    model_of_route: Vec<Option<usize>>,
    routes_per_arm: usize,
}

impl Share {
    pub fn new(ranks: &Ranks, split: Split, cells: usize, exp: &Experiment) -> Self {
        let split = choose(split, cells, ranks.size());
        let by_model = (split == Split::Models).then(|| {
            let models = exp.models();
            let agents: Vec<u64> = super::model_agents(exp)
                .into_iter()
                .map(|(_, n)| n)
                .collect();
            let routes = exp.routes_per_arm();
            let model_of_route = (0..exp.arms.len() * routes)
                .map(|i| {
                    let (arm, route) = (i / routes, (i % routes) as u8);
                    (exp.policy_of_route(arm, route) == PolicyKind::Llm).then(|| {
                        let model = &exp.llm_of(arm, route).model;
                        models.iter().position(|m| m == model).unwrap_or(0)
                    })
                })
                .collect();
            ByModel {
                ranks_of: model_ranks(&agents, ranks.size()),
                model_of_route,
                routes_per_arm: routes,
            }
        });
        Share {
            rank: ranks.rank(),
            ranks: ranks.size(),
            split,
            by_model,
        }
    }

    fn owner(&self, cell: usize) -> usize {
        cell % self.ranks
    }

    /// Whether this rank steps cell `cell`'s world.
    pub(crate) fn steps_cell(&self, cell: usize) -> bool {
        self.split != Split::Cells || self.owner(cell) == self.rank
    }

    /// The turns of rank `rank`'s run when the split is by agents.
    fn run_of(&self, rank: usize, turns: usize) -> Range<usize> {
        turns * rank / self.ranks..turns * (rank + 1) / self.ranks
    }

    /// The rank that decides each of the step's turns.
    fn owners<S: Scenario>(&self, cells: &Cells<S>, turns: &[AgentTurn]) -> Vec<usize> {
        let Some(m) = &self.by_model else {
            return self.owners_by(&[], turns, |_| None);
        };
        self.owners_by(&m.ranks_of, turns, |t| {
            let route = cells.assigned(t.cell).route_of(t.agent);
            m.model_of_route[cells.arm_of[t.cell] * m.routes_per_arm + route as usize]
        })
    }

    /// [`Share::owners`], given the ranks of each model ([`model_ranks`]) and the index of
    /// each turn's model (`None`: a scripted agent). A model's turns are cut into one run per
    /// rank of the model, in order.
    fn owners_by(
        &self,
        ranks_of: &[Vec<usize>],
        turns: &[AgentTurn],
        model_of: impl Fn(&AgentTurn) -> Option<usize>,
    ) -> Vec<usize> {
        match self.split {
            Split::Cells => turns.iter().map(|t| self.owner(t.cell)).collect(),
            Split::Models => {
                let models: Vec<Option<usize>> = turns.iter().map(&model_of).collect();
                let mut total = vec![0usize; ranks_of.len()];
                for m in models.iter().flatten() {
                    total[*m] += 1;
                }
                let mut seen = vec![0usize; ranks_of.len()];
                turns
                    .iter()
                    .zip(models)
                    .map(|(t, m)| match m {
                        None => self.owner(t.cell),
                        Some(m) => {
                            let own = &ranks_of[m];
                            let at = seen[m] * own.len() / total[m];
                            seen[m] += 1;
                            own[at]
                        }
                    })
                    .collect()
            }
            _ => (0..self.ranks)
                .flat_map(|r| std::iter::repeat_n(r, self.run_of(r, turns.len()).len()))
                .collect(),
        }
    }
}

/// What a rank sends after deciding (and, split by cells, resolving) its part of a step.
#[derive(Serialize, Deserialize)]
struct Part {
    /// Whether this rank was asked to stop (SIGINT/SIGTERM).
    stop: bool,
    work: Result<Work, String>,
}

#[derive(Serialize, Deserialize)]
struct Work {
    /// `Vec<Decided<D>>` as MessagePack: self-describing, since decisions may be `untagged`.
    decided: Vec<u8>,
    /// Split by cells: the rank's cells' worlds after the step (postcard, as in checkpoints).
    worlds: Vec<(u32, Vec<u8>)>,
    template_ns: u64,
    tokenize_ns: u64,
    forward_ns: u64,
    masks_ns: u64,
    kv_peak_bytes: u64,
    reused: u64,
    /// The rank's own time for its part of the step, before the exchange.
    own_ns: u64,
}

/// What rank 0 tells every rank once the step is recorded.
#[derive(Serialize, Deserialize)]
enum Outcome {
    Go,
    /// A rank was asked to stop: everyone pauses after this step.
    Pause,
    Fail {
        rank: usize,
        message: String,
    },
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("invariant: in-memory postcard encoding cannot fail")
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], rank: usize) -> Result<T, SimError> {
    postcard::from_bytes(bytes).map_err(|e| SimError::Rank {
        rank,
        message: format!("its message could not be read ({e}): are all ranks the same throng?"),
    })
}

/// Adds a rank's times to the step's; KV memory adds up too, since each rank has its own
/// cache.
fn add(to: &mut PolicyTimes, rank: &PolicyTimes) {
    to.template += rank.template;
    to.tokenize += rank.tokenize;
    to.forward += rank.forward;
    to.masks += rank.masks;
    to.kv_peak_bytes += rank.kv_peak_bytes;
    to.reused += rank.reused;
}

/// A step as this rank sees it once the parts are back together.
pub(crate) struct Stepped<D> {
    /// At rank 0: every turn's decision, in one process's order. Elsewhere: `None`.
    pub decisions: Option<Decisions<D>>,
    pub resolve: Duration,
    /// Waiting for and moving the other ranks' parts (the all-gather or the gather).
    pub exchange: Duration,
    /// Whether any rank was asked to stop.
    pub stop: bool,
    /// At rank 0: each rank's own time for its part of the step, before the exchange.
    pub rank_seconds: Vec<f64>,
}

/// Decides and resolves this rank's part of `step`, and exchanges the parts.
#[allow(clippy::too_many_arguments)]
pub fn step<S: Scenario>(
    exp: &Experiment,
    arms: &[S],
    cells: &mut Cells<S>,
    step: usize,
    share: &Share,
    ranks: &Ranks,
    policies: &mut Policies<'_>,
    stop: bool,
    done: &mut dyn FnMut(usize),
) -> Result<Stepped<S::Decision>, SimError> {
    let began = Instant::now();
    let all = step::turns(exp, arms, cells, step)?;
    let owners = share.owners(cells, &all);
    let mine: Vec<AgentTurn> = all
        .iter()
        .zip(&owners)
        .filter(|(_, o)| **o == share.rank)
        .map(|(t, _)| *t)
        .collect();
    let local = step::decide(exp, arms, cells, step, mine, policies, done);
    let mut resolve = Duration::ZERO;
    if let (Ok(local), Split::Cells) = (&local, share.split) {
        resolve = step::resolve(exp, arms, cells, step, local, |c| share.steps_cell(c));
    }
    let part = Part {
        stop,
        work: match &local {
            Ok(d) => Ok(Work {
                decided: rmp_serde::to_vec_named(&d.decided)
                    .map_err(|e| SimError::Setup(format!("encoding decisions: {e}")))?,
                worlds: match share.split {
                    Split::Cells => (0..cells.infos.len())
                        .filter(|&c| share.steps_cell(c) && share.rank != 0)
                        .map(|c| (c as u32, encode(&cells.worlds[c])))
                        .collect(),
                    _ => Vec::new(),
                },
                template_ns: d.prompts.template.as_nanos() as u64,
                tokenize_ns: d.prompts.tokenize.as_nanos() as u64,
                forward_ns: d.prompts.forward.as_nanos() as u64,
                masks_ns: d.prompts.masks.as_nanos() as u64,
                kv_peak_bytes: d.prompts.kv_peak_bytes,
                reused: d.prompts.reused,
                own_ns: began.elapsed().as_nanos() as u64,
            }),
            Err(e) => Err(e.to_string()),
        },
    };
    let own = began.elapsed();
    let started = Instant::now();
    let mut bytes = encode(&part);
    let parts: Option<Vec<Vec<u8>>> = match share.split {
        Split::Cells => {
            if share.rank == 0 {
                // Rank 0 keeps its own part as it is; the others need nothing of it.
                bytes.clear();
            }
            ranks.gather(bytes)?
        }
        _ => Some(ranks.all_gather(bytes)?),
    };
    let Some(parts) = parts else {
        // Split by cells, not rank 0: the outcome comes with the next `finish`.
        return Ok(Stepped {
            decisions: None,
            resolve,
            exchange: started.elapsed(),
            stop,
            rank_seconds: Vec::new(),
        });
    };
    let mut local = Some(local);
    let mut decided: Vec<Option<std::vec::IntoIter<Decided<S::Decision>>>> = Vec::new();
    let mut prompts = PolicyTimes::default();
    let mut any_stop = false;
    let mut rank_seconds = Vec::with_capacity(parts.len());
    for (rank, bytes) in parts.iter().enumerate() {
        if rank == share.rank {
            any_stop |= stop;
            let mine = local.take().expect("invariant: one part per rank");
            let mine = mine.map_err(|e| SimError::Rank {
                rank,
                message: e.to_string(),
            })?;
            add(&mut prompts, &mine.prompts);
            rank_seconds.push(own.as_secs_f64());
            decided.push(Some(mine.decided.into_iter()));
            continue;
        }
        let part: Part = decode(bytes, rank)?;
        any_stop |= part.stop;
        let work = part
            .work
            .map_err(|message| SimError::Rank { rank, message })?;
        let list: Vec<Decided<S::Decision>> =
            rmp_serde::from_slice(&work.decided).map_err(|e| SimError::Rank {
                rank,
                message: format!("its decisions could not be read: {e}"),
            })?;
        for (c, world) in work.worlds {
            cells.worlds[c as usize] = decode(&world, rank)?;
        }
        add(
            &mut prompts,
            &PolicyTimes {
                template: Duration::from_nanos(work.template_ns),
                tokenize: Duration::from_nanos(work.tokenize_ns),
                forward: Duration::from_nanos(work.forward_ns),
                masks: Duration::from_nanos(work.masks_ns),
                kv_peak_bytes: work.kv_peak_bytes,
                reused: work.reused,
            },
        );
        rank_seconds.push(Duration::from_nanos(work.own_ns).as_secs_f64());
        decided.push(Some(list.into_iter()));
    }
    // Back into one process's order: each turn's decision from its owner, whose own
    // decisions come in the order of its turns.
    let mut merged = Vec::with_capacity(all.len());
    for &from in &owners {
        let next = decided[from].as_mut().and_then(|it| it.next());
        merged.push(next.ok_or_else(|| {
            SimError::Rank {
                rank: from,
                message:
                    "it sent fewer decisions than it had turns: are all ranks the same throng \
                      with the same config?"
                        .into(),
            }
        })?);
    }
    let exchange = started.elapsed();
    let decisions = Decisions {
        policy_of: step::policy_of(exp, cells, &all),
        turns: all,
        decided: merged,
        prompts,
    };
    if share.split != Split::Cells {
        resolve = step::resolve(exp, arms, cells, step, &decisions, |_| true);
    }
    Ok(Stepped {
        decisions: (share.rank == 0).then_some(decisions),
        resolve,
        exchange,
        stop: any_stop,
        rank_seconds,
    })
}

/// Ends a shared step: rank 0 says how it went (`recorded`: its own recording's result, and
/// whether any rank asked to stop); every rank learns it. Returns whether to pause.
pub fn finish(ranks: &Ranks, recorded: Result<bool, SimError>) -> Result<bool, SimError> {
    let outcome = if ranks.is_root() {
        let outcome = match &recorded {
            Ok(false) => Outcome::Go,
            Ok(true) => Outcome::Pause,
            Err(e) => Outcome::Fail {
                rank: 0,
                message: e.to_string(),
            },
        };
        ranks.broadcast(encode(&outcome))?;
        return recorded;
    } else {
        decode::<Outcome>(&ranks.broadcast(Vec::new())?, 0)?
    };
    match outcome {
        Outcome::Go => Ok(false),
        Outcome::Pause => Ok(true),
        Outcome::Fail { rank, message } => Err(SimError::Rank { rank, message }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(cells: &[usize]) -> Vec<AgentTurn> {
        cells
            .iter()
            .enumerate()
            .map(|(i, &cell)| AgentTurn {
                cell,
                agent: i,
                seed: i as u64,
                logged: false,
            })
            .collect()
    }

    /// Agents 0, 3, 6, ... are scripted; the others ask model `agent % 3`.
    fn model_of(t: &AgentTurn) -> Option<usize> {
        (!t.agent.is_multiple_of(3)).then_some(t.agent % 3)
    }

    #[test]
    // Guards that every turn is decided by exactly one rank, for any rank count, in every
    // split: a turn decided twice or never would change the records.
    fn every_turn_has_exactly_one_rank() {
        let all = turns(&[0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 4]);
        for split in [Split::Cells, Split::Agents, Split::Models] {
            for ranks in 1..=5 {
                let share = Share {
                    rank: 0,
                    ranks,
                    split,
                    by_model: None,
                };
                let owners = share.owners_by(&model_ranks(&[0, 5, 3], ranks), &all, model_of);
                assert_eq!(owners.len(), all.len());
                assert!(
                    owners.iter().all(|&o| o < ranks),
                    "{split:?} on {ranks} ranks"
                );
            }
        }
    }

    #[test]
    // Guards `--split models`: a model's agents are all decided on ranks that hold that
    // model, and every rank of a model gets a share of them.
    fn split_by_models_sends_each_agent_to_a_rank_of_its_model() {
        let all = turns(&[0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        for ranks in 1..=5 {
            let share = Share {
                rank: 0,
                ranks,
                split: Split::Models,
                by_model: None,
            };
            // Model 1 (agents 1, 4, 7, 10) and model 2 (agents 2, 5, 8, 11).
            let ranks_of = model_ranks(&[0, 4, 4], ranks);
            let owners = share.owners_by(&ranks_of, &all, model_of);
            for (t, owner) in all.iter().zip(&owners) {
                match model_of(t) {
                    Some(m) => assert!(ranks_of[m].contains(owner), "agent {}", t.agent),
                    None => assert_eq!(*owner, t.cell % ranks, "scripted agent {}", t.agent),
                }
            }
            for own in ranks_of.iter().skip(1) {
                for r in own {
                    assert!(owners.contains(r), "rank {r} of {ranks} has no turn");
                }
            }
        }
    }

    #[test]
    // Guards the placement rule the run and `throng plan` share: ranks of their own while
    // there are enough (extra ranks to the model with most agents per rank), shared when not.
    fn models_get_ranks_by_their_agents() {
        assert_eq!(model_ranks(&[10, 10], 2), vec![vec![0], vec![1]]);
        assert_eq!(model_ranks(&[30, 10], 4), vec![vec![0, 1, 2], vec![3]]);
        assert_eq!(
            model_ranks(&[10, 10, 10], 2),
            vec![vec![0], vec![1], vec![0]]
        );
        assert_eq!(model_ranks(&[7], 3), vec![vec![0, 1, 2]]);
    }

    #[test]
    // Guards the default: cells when they deal out evenly, else agents.
    fn auto_deals_cells_only_when_they_divide_evenly() {
        assert_eq!(choose(Split::Auto, 6, 3), Split::Cells);
        assert_eq!(choose(Split::Auto, 6, 4), Split::Agents);
        assert_eq!(choose(Split::Auto, 1, 2), Split::Agents);
        assert_eq!(choose(Split::Cells, 1, 2), Split::Cells);
    }
}
