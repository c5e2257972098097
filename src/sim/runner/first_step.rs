//! The first step of a population size, looked at before a run (`throng plan`): how many
//! agents decide, the tokens of their rendered prompts and of their cells' shared system
//! prompts, and, for a sample of them, what deciding costs on this device.

use super::SimError;
use super::cells::Cells;
use super::step;
use crate::sim::experiment::Experiment;
use crate::sim::policy::{Llm, Policy};
use crate::sim::scenario::Scenario;
use std::time::Instant;

/// Turns whose prompts are rendered and tokenized for the counts (evenly spaced), at most.
const TOKENIZED: usize = 20_000;

/// A population size's first step, as seen by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstStep {
    pub population: usize,
    pub cells: usize,
    /// Agents that decide in the step, over all cells.
    pub decisions: usize,
    /// Of their prompts (a sample of at most 20,000, evenly spaced): the mean tokens of the
    /// whole prompt, and of the cell's shared system prompt within it.
    pub prompt_tokens: f64,
    pub shared_tokens: f64,
    /// Prompts tokenized for these means.
    pub tokenized: usize,
    /// Tokens of each distinct system prompt of the step.
    pub prefixes: Vec<usize>,
    /// The model deciding a sample of agents, if asked for.
    pub sample: Option<Sample>,
}

/// A sample of first-step decisions made on this device.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub decisions: usize,
    pub seconds: f64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// Looks at the first step of population size `size`; decides `sample` of its agents
/// (evenly spaced) through `llm` when `sample > 0`.
pub fn first_step<S: Scenario>(
    exp: &Experiment,
    arms: &[S],
    size: usize,
    llm: &mut Llm,
    sample: usize,
) -> Result<FirstStep, SimError> {
    // Personas written by the model are left out: the plan does not write them.
    let cells = Cells::setup(exp, arms, size, Cells::<S>::draw_agents(exp, size));
    let turns = step::turns(exp, arms, &cells, 0)?;
    let views = cells.views(exp, arms, 0);
    let spaced = |n: usize| -> Vec<_> {
        let n = n.min(turns.len());
        (0..n).map(|i| turns[i * turns.len() / n]).collect()
    };
    let tokenized = spaced(TOKENIZED);
    let crate::sim::policy::PromptSizes {
        turns: sizes,
        prefixes,
    } = llm.prompt_sizes(&views, &tokenized)?;
    let n = sizes.len().max(1) as f64;
    let prompt_tokens = sizes.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let shared_tokens = sizes.iter().map(|s| s.0 as f64).sum::<f64>() / n;
    let sample = if sample > 0 {
        let chosen = spaced(sample);
        let started = Instant::now();
        let decided = Policy::<S>::decide(llm, &views, &chosen, &mut |_| {})?;
        let seconds = started.elapsed().as_secs_f64();
        let traces = decided.iter().filter_map(|d| d.llm.as_deref());
        let (mut generated, mut prompt, mut cached) = (0, 0, 0);
        for t in traces {
            generated += t.generated_tokens as u64;
            prompt += t.prompt_tokens as u64;
            cached += t.cached_tokens as u64;
        }
        Some(Sample {
            decisions: decided.len(),
            seconds,
            generated_tokens: generated,
            prompt_tokens: prompt,
            cached_tokens: cached,
        })
    } else {
        None
    };
    Ok(FirstStep {
        population: size,
        cells: cells.infos.len(),
        decisions: turns.len(),
        prompt_tokens,
        shared_tokens,
        tokenized: sizes.len(),
        prefixes,
        sample,
    })
}
