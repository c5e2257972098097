//! The scenario's deterministic rules, decided in parallel: each agent draws from its own
//! seeded stream, so the result does not depend on the thread count.

use super::{AgentTurn, CellView, Decided, Policy, PolicyError};
use crate::sim::scenario::Scenario;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

pub struct Scripted;

/// Turns decided per parallel task: enough to hide the task overhead.
const CHUNK: usize = 4096;

impl<S: Scenario> Policy<S> for Scripted {
    fn decide(
        &mut self,
        cells: &[CellView<'_, S>],
        turns: &[AgentTurn],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<Decided<S::Decision>>, PolicyError> {
        let decided: Vec<Decided<S::Decision>> = turns
            .par_chunks(CHUNK)
            .flat_map_iter(|chunk| {
                chunk.iter().map(|t| {
                    let cell = &cells[t.cell];
                    let mut rng = ChaCha8Rng::seed_from_u64(t.seed);
                    let decision =
                        cell.scenario
                            .scripted(cell.world, cell.population, t.agent, &mut rng);
                    cell.scenario
                        .check_scripted(cell.world, cell.population, t.agent, cell.step, &decision)
                        .map_err(|problem| PolicyError::Scripted {
                            agent: t.agent,
                            step: cell.step + 1,
                            arm: cell.info.arm.clone(),
                            replicate: cell.info.replicate,
                            problem,
                        })?;
                    Ok(Decided::plain(decision))
                })
            })
            .collect::<Result<_, PolicyError>>()?;
        done(decided.len());
        Ok(decided)
    }
}
