//! Whether a run fits in this machine's memory, checked before anything is written.

use crate::host::{HostMemory, MemoryPart};
use crate::scenarios::Loaded;
use crate::sim::footprint::SizeError;

/// Refuses a run that cannot fit in this machine's memory, before anything is written (a
/// failed allocation aborts the process, leaving a folder that says `running`): the
/// simulation's footprint once per rank of the job on this machine, each with its KV cache
/// when the model runs on the CPU. Where the kernel does not say how much memory there is
/// (not Linux), only sizes that overflow are refused.
pub struct MemoryCheck {
    pub processes: usize,
    pub model_on_cpu: bool,
    pub kv_memory: Option<u64>,
}

impl MemoryCheck {
    pub fn check(&self, loaded: &dyn Loaded) -> Result<(), SizeError> {
        let mut footprint = loaded.footprint()?;
        let Some(host) = HostMemory::here() else {
            return Ok(());
        };
        if self.model_on_cpu && crate::scenarios::needs_model(loaded.experiment()) {
            let kv = self.kv_memory.map_or_else(
                || crate::engine::default_kv_memory(&candle_core::Device::Cpu) as f64,
                |b| b as f64,
            );
            footprint.add(MemoryPart::new("the model's KV cache", "--kv-memory", kv));
        }
        footprint.check(&host, self.processes)
    }
}
