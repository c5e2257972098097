//! Turns a step's plan into the model's explicit inputs, runs the forward pass, and hands
//! back one row of logits per sequence that samples.

use super::scheduler::Scheduled;
use super::sequence::Sequence;
use crate::model::{BatchInputs, CausalLm, KvCache, ModelError, SeqChunk};
use candle_core::Tensor;

pub struct ModelRunner {
    model: Box<dyn CausalLm>,
    kv: KvCache,
    /// Time attention, and wait for the device after the inputs and the forward pass so that
    /// each phase's time is its own.
    profile: bool,
}

impl ModelRunner {
    pub fn new(model: Box<dyn CausalLm>, kv: KvCache, profile: bool) -> Self {
        Self { model, kv, profile }
    }

    pub fn model(&self) -> &dyn CausalLm {
        self.model.as_ref()
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn profiles(&self) -> bool {
        self.profile
    }

    fn synchronize(&self) -> Result<(), ModelError> {
        self.model
            .device()
            .synchronize()
            .map_err(|e| ModelError::during("waiting for the device", e))
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
        let mut batch = BatchInputs::new(&chunks, &self.kv)?;
        if self.profile {
            batch.time_attention();
            self.synchronize()?;
        }
        Ok(batch)
    }

    /// Runs the batch; returns the logits `(rows, vocab)` in plan order, one row per chunk
    /// that wants them, on the model's device.
    pub fn forward(&mut self, batch: &BatchInputs) -> Result<Tensor, ModelError> {
        let logits = self.model.forward(batch, &mut self.kv)?;
        if self.profile {
            self.synchronize()?;
        }
        Ok(logits)
    }
}
