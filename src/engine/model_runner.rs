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

    /// Packs `plan` over `running` into device inputs. The batch owns its data, so the
    /// sequences are free again while the forward pass runs.
    pub fn prepare(
        &self,
        running: &[Sequence],
        plan: &[Scheduled],
    ) -> Result<BatchInputs, ModelError> {
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
        BatchInputs::new(&chunks, &self.kv)
    }

    /// Runs the batch; returns the logits rows in plan order, one per chunk that wants them.
    pub fn forward(&mut self, batch: &BatchInputs) -> Result<Vec<Vec<f32>>, ModelError> {
        let logits = self.model.forward(batch, &mut self.kv)?;
        Ok(logits.to_vec2::<f32>()?)
    }
}
