//! `throng bench`: the engine on a random-weight model of a preset's shape, stepped as a
//! simulation steps its agents. No download is needed, so the same command measures a laptop
//! CPU and a GPU node.
//!
//! Step 1 is cold: only the prompt prefix every agent shares can come from the prefix cache.
//! Later steps extend each agent's previous prompt and reply (see [`Workload`]), which the
//! prefix cache serves, as a simulation whose agents keep their history does. Like a
//! simulation's LLM policy, the bench announces each step's agents to the engine, in order
//! ([`Engine::expect_calls`]), each request keyed by its agent, so that with a KV budget too
//! small for every agent `--kv-policy next-call` keeps the histories needed soonest.
//! `benches/synthetic.rs` runs the same code under criterion.

mod report;
mod workload;

pub use report::{BenchReport, Phases, StepReport};
pub use workload::Workload;

use crate::engine::{
    Engine, EngineConfig, EngineError, FinishReason, Prompt, Request, RequestError, SamplingParams,
    Schema,
};
use crate::model::loader::{ChatSpec, LoadedModel};
use crate::model::synthetic::{Shape, activation_dtype, random_llama};
use crate::model::{KvCache, ModelError, WeightFormat};
use candle_core::Device;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("invalid benchmark settings: {0}")]
    Settings(String),
    #[error("the tokenizer: {0}")]
    Tokenizer(String),
    #[error("agent {agent}'s request was refused: {source}")]
    Refused {
        agent: usize,
        #[source]
        source: RequestError,
    },
}

/// What to run. [`BenchSpec::check`] says what is wrong with a spec, if anything.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    pub shape: Shape,
    pub agents: usize,
    /// Prompt tokens every agent shares (the rules).
    pub shared: usize,
    /// Prompt tokens of its own each agent adds every step (its state).
    pub own: usize,
    /// Most reply tokens per agent and step.
    pub reply: usize,
    pub steps: usize,
    /// Constrain replies by a JSON decision schema (grammar masks), as simulations do.
    pub constrained: bool,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub seed: u64,
    pub weights: WeightFormat,
    /// Engine settings; `max_seqs` of 0 means every agent at once.
    pub engine: EngineConfig,
}

impl BenchSpec {
    pub fn check(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Settings(m));
        if self.agents == 0 || self.steps == 0 || self.reply == 0 {
            return bad("--agents, --steps and --reply must be at least 1".into());
        }
        if self.shared + self.own == 0 {
            return bad("a prompt needs tokens: --shared plus --own must be at least 1".into());
        }
        let params = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: 0,
        };
        if let Some(problem) = params.problem() {
            return bad(problem);
        }
        let longest = Workload::max_context(self.shared, self.own, self.reply, self.steps);
        let limit = self.shape.config().max_position_embeddings;
        if longest >= limit {
            return bad(format!(
                "an agent's context reaches {longest} tokens after {} steps, over the {} model's {limit}; \
                 lower --steps, --shared, --own or --reply",
                self.steps,
                self.shape.name()
            ));
        }
        // Every agent's context stays in memory as token ids between steps, beside the
        // prompts built from it.
        let contexts = self.agents as f64 * longest as f64 * 8.0;
        if let Some(host) = crate::host::HostMemory::here()
            && contexts > host.usable()
        {
            return bad(format!(
                "{} agents with contexts of up to {longest} tokens need about {}, more than the \
                 {} this process may use; lower --agents",
                self.agents,
                crate::host::human_bytes(contexts),
                crate::host::human_bytes(host.usable())
            ));
        }
        Ok(())
    }

    /// The JSON schema of a decision, as the energy market's producers answer.
    pub(crate) fn decision_schema() -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {
            "production_change": {"type": "integer", "minimum": -50, "maximum": 50},
            "energy_price_change": {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.1},
            "upgrade_capacity": {"type": "boolean"},
            "reason": {"type": "string", "maxLength": 40}},
            "required": ["production_change", "energy_price_change", "upgrade_capacity", "reason"],
            "additionalProperties": false})
    }
}

/// A tokenizer for the shape: the byte tokenizer for the small shapes, and for the Llama ones the
/// real Llama 3 tokenizer when replies are constrained (grammars need the real vocabulary;
/// it is a cached asset, downloaded once). Unconstrained Llama runs feed and read token ids
/// only, so any tokenizer does.
fn tokenizer(shape: Shape, constrained: bool) -> Result<tokenizers::Tokenizer, BenchError> {
    let parse = |json: &str| {
        json.parse::<tokenizers::Tokenizer>()
            .map_err(|e| BenchError::Tokenizer(e.to_string()))
    };
    if shape.byte_vocabulary() || !constrained {
        return parse(&crate::model::synthetic::byte_tokenizer_json().to_string());
    }
    let path = crate::assets::ensure_file("llama3-tokenizer", "tokenizer.json").map_err(|e| {
        BenchError::Tokenizer(format!(
            "constrained replies on the {} shape need the Llama 3 tokenizer ({e}); \
             run `throng fetch` where there is a network, or pass --no-schema",
            shape.name()
        ))
    })?;
    tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| BenchError::Tokenizer(format!("{}: {e}", path.display())))
}

/// The benchmark's engine and workload, stepped one simulation step at a time.
pub struct Bench {
    spec: BenchSpec,
    engine: Engine,
    workload: Workload,
    device: Device,
    load_seconds: f64,
    steps: Vec<StepReport>,
}

impl Bench {
    /// Builds the random model on `device` and its engine.
    pub fn new(spec: BenchSpec, device: &Device) -> Result<Self, BenchError> {
        spec.check()?;
        let started = Instant::now();
        let model = random_llama(spec.shape, spec.weights, device, spec.seed)?;
        let loaded = LoadedModel {
            name: format!("random {}", spec.shape.name()),
            weights: format!(
                "random -> {:?}",
                activation_dtype(spec.weights, device, spec.shape)
            ),
            model,
            tokenizer: tokenizer(spec.shape, spec.constrained)?,
            chat: ChatSpec::default(),
            origin: crate::model::Origin::Generated(format!(
                "random {}, seed {}, {:?}",
                spec.shape.name(),
                spec.seed,
                spec.weights
            )),
        };
        let mut cfg = spec.engine.clone();
        if cfg.max_seqs == 0 {
            cfg.max_seqs = spec.agents;
        }
        if cfg.kv_memory.is_none() {
            cfg.kv_memory = Some(Self::kv_budget(&spec, device));
        }
        cfg.profile = true;
        let engine = Engine::new(loaded, cfg)?;
        Ok(Self {
            workload: Workload::new(
                spec.agents,
                spec.shared,
                spec.own,
                spec.shape.text_vocab(),
                spec.seed,
            ),
            spec,
            engine,
            device: device.clone(),
            load_seconds: started.elapsed().as_secs_f64(),
            steps: Vec::new(),
        })
    }

    /// Enough KV memory for every agent's longest context without sharing, plus a tenth: the
    /// prefix cache then never has to evict a previous turn. The engine's own default (most of
    /// what the device has free once the weights are in) bounds it.
    fn kv_budget(spec: &BenchSpec, device: &Device) -> usize {
        let cfg = spec.shape.config();
        let dtype = spec
            .engine
            .kv_format
            .dtype(device, activation_dtype(spec.weights, device, spec.shape));
        let block = spec
            .engine
            .block_size
            .unwrap_or(if device.is_cpu() { 16 } else { 32 });
        let tokens = Workload::max_context(spec.shared, spec.own, spec.reply, spec.steps) + block;
        let blocks = spec
            .agents
            .saturating_mul(tokens.div_ceil(block))
            .saturating_mul(11)
            / 10
            + 1;
        let wanted = blocks.saturating_mul(KvCache::bytes_per_block(&cfg, block, dtype));
        wanted.min(crate::engine::default_kv_memory(device))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs the next simulation step: every agent's prompt in one continuous batch.
    pub fn step(&mut self) -> Result<&StepReport, BenchError> {
        let (step, prompts) = self.workload.next_prompts();
        // Agents are submitted in order, every step: the engine's retention hints.
        self.engine
            .expect_calls((0..self.spec.agents).map(Workload::agent_key));
        let requests = self.requests(step, prompts);
        let prompt_tokens: u64 = requests
            .iter()
            .map(|r| match &r.prompt {
                Prompt::Tokens(t) => t.len() as u64,
                _ => 0,
            })
            .sum();
        self.engine.take_step_metrics();
        let before = self.engine.totals();
        let started = Instant::now();
        let results = self.engine.generate(requests);
        let wall = started.elapsed();
        let after = self.engine.totals();
        let metrics = self.engine.take_step_metrics();

        let mut replies = Vec::with_capacity(results.len());
        let (mut stop, mut length, mut failed, mut reply_tokens) = (0, 0, 0, 0u64);
        for (agent, result) in results.into_iter().enumerate() {
            match result {
                Ok(r) => {
                    match r.finish_reason {
                        FinishReason::Stop => stop += 1,
                        FinishReason::Length => length += 1,
                    }
                    reply_tokens += r.token_ids.len() as u64;
                    replies.push(r.token_ids);
                }
                Err(RequestError::Engine(_)) => {
                    failed += 1;
                    replies.push(Vec::new());
                }
                Err(source) => return Err(BenchError::Refused { agent, source }),
            }
        }
        self.workload.record_replies(&replies);

        let secs = wall.as_secs_f64();
        let queried = after.cache.queried_tokens - before.cache.queried_tokens;
        let hits = after.cache.hit_tokens - before.cache.hit_tokens;
        let evictions = after.cache.evictions - before.cache.evictions;
        let kv_blocks_peak = metrics.iter().map(|m| m.blocks_used).max().unwrap_or(0);
        let kv = self.engine.kv_cache();
        let bytes_per_block = (kv.bytes() / kv.num_blocks()) as u64;
        let phases = Phases::from_steps(&metrics, wall, !self.device.is_cpu());
        let prefill_tokens = after.prefill_tokens - before.prefill_tokens;
        let decode_per_s = reply_tokens as f64 / secs;
        self.steps.push(StepReport {
            step,
            seconds: secs,
            engine_steps: metrics.len(),
            prompt_tokens,
            cached_tokens: hits,
            prefill_tokens,
            reply_tokens,
            prefill_tokens_per_s: prefill_tokens as f64 / secs,
            decode_tokens_per_s: decode_per_s,
            decode_tokens_per_s_per_agent: decode_per_s / self.spec.agents as f64,
            prefix_cache_hit_rate: if queried == 0 {
                0.0
            } else {
                hits as f64 / queried as f64
            },
            kv_blocks_peak,
            kv_bytes_peak: kv_blocks_peak as u64 * bytes_per_block,
            kv_evictions: evictions,
            finished_stop: stop,
            finished_length: length,
            failed,
            shares: phases.shares(secs),
            phases,
        });
        Ok(self.steps.last().expect("invariant: just pushed"))
    }

    /// The requests of step `step`: each agent's prompt, kept under its retention key and
    /// sampled with its own seed, under the decision schema when the spec is constrained.
    fn requests(&self, step: usize, prompts: Vec<Vec<u32>>) -> Vec<Request> {
        let schema = self
            .spec
            .constrained
            .then(|| Schema::new(BenchSpec::decision_schema()));
        prompts
            .into_iter()
            .enumerate()
            .map(|(a, prompt)| {
                let mut r = Request::new(Prompt::Tokens(prompt))
                    .with_retention_key(Workload::agent_key(a))
                    .with_max_tokens(self.spec.reply)
                    .with_sampling(SamplingParams {
                        temperature: self.spec.temperature,
                        top_k: self.spec.top_k,
                        top_p: self.spec.top_p,
                        seed: self.workload.sampling_seed(a, step),
                    });
                if let Some(schema) = &schema {
                    r = r.with_schema(schema.clone());
                }
                r
            })
            .collect()
    }

    /// Everything measured so far.
    pub fn report(&self) -> BenchReport {
        let kv = self.engine.kv_cache();
        let model_cfg = self.spec.shape.config();
        BenchReport {
            shape: self.spec.shape.name().to_string(),
            parameters: model_cfg.parameters(),
            device: match self.device.location() {
                candle_core::DeviceLocation::Cpu => "cpu".to_string(),
                candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
                other => format!("{other:?}"),
            },
            weights: format!("{:?}", self.engine.model().dtype()),
            kv_format: format!("{:?}", kv.dtype()),
            attention: kv.attention().name().to_string(),
            sampling_on: if self.engine.samples_on_device() {
                "device"
            } else {
                "host"
            }
            .to_string(),
            block_size: kv.block_size(),
            kv_blocks: kv.num_blocks(),
            kv_bytes: kv.bytes() as u64,
            kv_policy: self.engine.kv_policy().name().to_string(),
            agents: self.spec.agents,
            shared_tokens: self.spec.shared,
            own_tokens: self.spec.own,
            reply_tokens: self.spec.reply,
            constrained: self.spec.constrained,
            temperature: self.spec.temperature,
            top_p: self.spec.top_p,
            top_k: self.spec.top_k,
            seed: self.spec.seed,
            masks_overlap_forward: !self.device.is_cpu(),
            load_seconds: self.load_seconds,
            steps: self.steps.clone(),
        }
    }
}
