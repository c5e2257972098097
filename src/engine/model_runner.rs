//! Turns a step's plan into the model's explicit inputs, runs the forward pass, and hands
//! back one row of logits per sequence that samples.

use super::scheduler::Scheduled;
use super::sequence::Sequence;
use crate::model::{BatchInputs, CausalLm, KvCache, ModelError, SeqChunk};

pub struct ModelRunner {
    model: Box<dyn CausalLm>,
    kv: KvCache,
}

impl ModelRunner {
    pub fn new(model: Box<dyn CausalLm>, kv: KvCache) -> Self {
        Self { model, kv }
    }

    pub fn model(&self) -> &dyn CausalLm {
        self.model.as_ref()
    }

    /// Runs `plan` over `running`; returns the logits rows in plan order, one per entry that
    /// wants logits.
    pub fn run(
        &mut self,
        running: &[Sequence],
        plan: &[Scheduled],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let chunks: Vec<SeqChunk<'_>> = plan
            .iter()
            .map(|p| {
                let seq = &running[p.index];
                SeqChunk {
                    tokens: &seq.tokens[seq.computed..seq.computed + p.len],
                    start: seq.computed,
                    blocks: &seq.blocks,
                    wants_logits: p.wants_logits,
                }
            })
            .collect();
        let batch = BatchInputs::new(&chunks, &self.kv)?;
        let logits = self.model.forward(&batch, &mut self.kv)?;
        Ok(logits.to_vec2::<f32>()?)
    }
}
