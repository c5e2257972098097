//! The engine: requests in, responses out, one continuous batch per step.
//!
//! `step()` is three moves, as in nano-vllm: schedule, run, postprocess. Everything the step
//! touches is owned here and moves one way: request -> sequence -> scheduler -> batch ->
//! model -> sampler -> response.

use super::block_manager::BlockManager;
use super::chat::ChatTemplate;
use super::model_runner::ModelRunner;
use super::request::{FinishReason, Prompt, Request, RequestError, Response, Timings};
use super::sampler::Sampler;
use super::scheduler::{Scheduler, SchedulerConfig};
use super::sequence::{SeqId, Sequence};
use super::tokenizer::Tokenizer;
use crate::model::{CausalLm, KvCache, LoadedModel, ModelError};
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the model's chat template: {0}")]
    Chat(#[from] super::chat::ChatError),
    #[error("invalid engine settings: {0}")]
    Settings(String),
}

/// Engine settings; `None` fields are derived from the device and the model.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Bytes of device memory for the KV cache.
    pub kv_memory: Option<usize>,
    /// Tokens one forward pass may process (prefill chunks plus decodes).
    pub max_batch_tokens: Option<usize>,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// Longest sequence, prompt plus reply (default: the model's context length).
    pub max_context: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            kv_memory: None,
            max_batch_tokens: None,
            max_seqs: 256,
            max_context: None,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepMetrics {
    /// Sequences in the batch.
    pub seqs: usize,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Of which prompt (or recomputed) tokens.
    pub prefill_tokens: usize,
    /// KV blocks held after the step.
    pub blocks_used: usize,
    pub forward: Duration,
    pub sampling: Duration,
}

/// Totals over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineTotals {
    pub steps: u64,
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
    pub forward: Duration,
    pub sampling: Duration,
    pub preemptions: u64,
}

pub struct Engine {
    runner: ModelRunner,
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    scheduler: Scheduler,
    max_context: usize,
    next_id: SeqId,
    totals: EngineTotals,
    last_step: StepMetrics,
}

/// What a step produced for the caller.
struct StepOutput {
    /// New text per sequence (streaming).
    deltas: Vec<(SeqId, String)>,
    finished: Vec<(SeqId, Response)>,
}

/// Default KV budget on the CPU: a quarter of the memory available, at most 16 GiB.
fn default_cpu_kv_memory() -> usize {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(8 << 30, |kb| kb * 1024);
    (available / 4).min(16 << 30)
}

impl Engine {
    pub fn new(loaded: LoadedModel, cfg: EngineConfig) -> Result<Self, EngineError> {
        let LoadedModel {
            model,
            tokenizer,
            chat,
            ..
        } = loaded;
        let model_cfg = model.config().clone();
        if cfg.block_size == 0 || cfg.max_seqs == 0 {
            return Err(EngineError::Settings(
                "block_size and max_seqs must be positive".into(),
            ));
        }
        let device = model.device().clone();
        let dtype = model.dtype();
        let kv_memory = cfg.kv_memory.unwrap_or_else(default_cpu_kv_memory);
        let max_context = cfg
            .max_context
            .unwrap_or(model_cfg.max_position_embeddings)
            .min(model_cfg.max_position_embeddings);
        let num_blocks = KvCache::blocks_for_budget(&model_cfg, cfg.block_size, dtype, kv_memory);
        if num_blocks == 0 {
            return Err(EngineError::Settings(format!(
                "a KV memory budget of {kv_memory} bytes holds no block of {} bytes; raise --kv-memory",
                KvCache::bytes_per_block(&model_cfg, cfg.block_size, dtype)
            )));
        }
        let kv = KvCache::new(&model_cfg, num_blocks, cfg.block_size, dtype, &device)?;
        let max_batch_tokens =
            cfg.max_batch_tokens
                .unwrap_or(if device.is_cpu() { 512 } else { 8192 });
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_batch_tokens,
                max_seqs: cfg.max_seqs,
            },
            BlockManager::new(num_blocks, cfg.block_size),
        );
        let tokenizer = Tokenizer::new(tokenizer, model_cfg.eos_token_ids.clone());
        Ok(Self {
            runner: ModelRunner::new(Box::new(model), kv),
            tokenizer,
            chat: ChatTemplate::new(&chat)?,
            scheduler,
            max_context,
            next_id: 0,
            totals: EngineTotals::default(),
            last_step: StepMetrics::default(),
        })
    }

    pub fn model(&self) -> &dyn CausalLm {
        self.runner.model()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat
    }

    pub fn totals(&self) -> EngineTotals {
        EngineTotals {
            preemptions: self.scheduler.preemptions(),
            ..self.totals
        }
    }

    pub fn last_step(&self) -> StepMetrics {
        self.last_step
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Token ids of a request's prompt.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, RequestError> {
        let tokens = match prompt {
            Prompt::Messages(messages) => {
                if messages.is_empty() {
                    return Err(RequestError::EmptyMessages);
                }
                let text = self
                    .chat
                    .render(messages, true)
                    .map_err(|e| RequestError::Template(e.to_string()))?;
                self.tokenizer
                    .encode(&text, false)
                    .map_err(|e| RequestError::Tokenizer(e.to_string()))?
            }
            Prompt::Text(text) => self
                .tokenizer
                .encode(text, true)
                .map_err(|e| RequestError::Tokenizer(e.to_string()))?,
            Prompt::Tokens(tokens) => tokens.clone(),
        };
        if tokens.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        let vocab = self.model().config().vocab_size;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(RequestError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        Ok(tokens)
    }

    /// Validates `request` and turns it into a sequence.
    fn admit(&mut self, request: &Request) -> Result<Sequence, RequestError> {
        if request.max_tokens == 0 {
            return Err(RequestError::ZeroMaxTokens);
        }
        if let Some(problem) = request.sampling.problem() {
            return Err(RequestError::InvalidSampling(problem));
        }
        let tokens = self.prompt_tokens(&request.prompt)?;
        if tokens.len() >= self.max_context {
            return Err(RequestError::PromptTooLong {
                tokens: tokens.len(),
                limit: self.max_context,
            });
        }
        let needed = self.scheduler.blocks.blocks_for(tokens.len() + 1);
        if needed > self.scheduler.blocks.num_blocks() {
            return Err(RequestError::PromptExceedsCache {
                needed,
                available: self.scheduler.blocks.num_blocks(),
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut seq = Sequence::new(
            id,
            tokens,
            Sampler::new(request.sampling),
            request.max_tokens,
        );
        seq.stop = request.stop.clone();
        seq.tag = request.tag.clone();
        Ok(seq)
    }

    /// Runs `requests` to completion, all in one continuous batch; one result per request, in
    /// order. A refused request does not stop the others.
    pub fn generate(&mut self, requests: Vec<Request>) -> Vec<Result<Response, RequestError>> {
        self.generate_with(requests, |_, _| {})
    }

    /// As [`Engine::generate`], calling `on_text(request_index, new_text)` as text arrives.
    pub fn generate_with(
        &mut self,
        requests: Vec<Request>,
        mut on_text: impl FnMut(usize, &str),
    ) -> Vec<Result<Response, RequestError>> {
        let mut results: Vec<Option<Result<Response, RequestError>>> =
            Vec::with_capacity(requests.len());
        let mut index_of: HashMap<SeqId, usize> = HashMap::new();
        for (i, request) in requests.iter().enumerate() {
            match self.admit(request) {
                Ok(seq) => {
                    index_of.insert(seq.id, i);
                    self.scheduler.add(seq);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        while !self.scheduler.is_idle() {
            match self.step() {
                Ok(out) => {
                    for (id, text) in &out.deltas {
                        on_text(index_of[id], text);
                    }
                    for (id, response) in out.finished {
                        results[index_of[&id]] = Some(Ok(response));
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for seq in self.scheduler.drain() {
                        results[index_of[&seq.id]] =
                            Some(Err(RequestError::Engine(message.clone())));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("invariant: every admitted sequence finishes or fails"))
            .collect()
    }

    /// One scheduling step: plan, forward, sample, retire.
    fn step(&mut self) -> Result<StepOutput, EngineError> {
        let plan = self.scheduler.schedule();
        if plan.is_empty() {
            return Err(EngineError::Settings(
                "no sequence fits in the KV cache; raise --kv-memory or --max-batch-tokens".into(),
            ));
        }
        let start = Instant::now();
        let rows = self.runner.run(self.scheduler.running(), &plan)?;
        let forward = start.elapsed();

        let start = Instant::now();
        let mut row_of = vec![None; self.scheduler.running().len()];
        let mut row = 0;
        for p in &plan {
            if p.wants_logits {
                row_of[p.index] = Some(row);
                row += 1;
            }
        }
        let sampled: Vec<Option<u32>> = self
            .scheduler
            .running_mut()
            .par_iter_mut()
            .enumerate()
            .map(|(i, seq)| row_of[i].and_then(|r| seq.sampler.sample(&rows[r])))
            .collect();
        let sampling = start.elapsed();

        let mut out = StepOutput {
            deltas: Vec::new(),
            finished: Vec::new(),
        };
        let mut finished = Vec::new();
        let mut prefill_tokens = 0;
        for p in &plan {
            let seq = &mut self.scheduler.running_mut()[p.index];
            if seq.computed < seq.prompt_len || !p.wants_logits || p.len > 1 {
                prefill_tokens += p.len;
            }
            seq.computed += p.len;
            if !p.wants_logits {
                continue;
            }
            let now = Instant::now();
            seq.first_token.get_or_insert(now);
            let reason = match sampled[p.index] {
                None => Some(FinishReason::Stop),
                Some(token) if self.tokenizer.is_eos(token) => Some(FinishReason::Stop),
                Some(token) => {
                    seq.tokens.push(token);
                    self.totals.generated_tokens += 1;
                    if let Ok(Some(delta)) = seq.detok.push(&self.tokenizer, token) {
                        seq.text.push_str(&delta);
                        out.deltas.push((seq.id, delta));
                    }
                    if let Some(at) = find_stop(&seq.text, &seq.stop) {
                        seq.text.truncate(at);
                        Some(FinishReason::Stop)
                    } else if seq.num_generated() >= seq.max_tokens
                        || seq.tokens.len() >= self.max_context
                    {
                        Some(FinishReason::Length)
                    } else {
                        None
                    }
                }
            };
            if let Some(reason) = reason {
                finished.push((p.index, reason));
            }
        }
        finished.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (index, reason) in finished {
            let seq = self.scheduler.finish(index);
            out.finished.push((seq.id, self.response(seq, reason)));
        }
        self.last_step = StepMetrics {
            seqs: plan.len(),
            tokens: plan.iter().map(|p| p.len).sum(),
            prefill_tokens,
            blocks_used: self.scheduler.blocks.num_blocks() - self.scheduler.blocks.num_free(),
            forward,
            sampling,
        };
        self.totals.steps += 1;
        self.totals.prefill_tokens += prefill_tokens as u64;
        self.totals.forward += forward;
        self.totals.sampling += sampling;
        Ok(out)
    }

    fn response(&self, seq: Sequence, finish_reason: FinishReason) -> Response {
        let now = Instant::now();
        let scheduled = seq.first_scheduled.unwrap_or(now);
        let first_token = seq.first_token.unwrap_or(now);
        let token_ids = seq.generated().to_vec();
        // Decoding the whole reply once gives exactly the tokenizer's text; stop strings
        // were found in the incremental text and cut there.
        let text = if seq.stop.is_empty() {
            self.tokenizer
                .decode(&token_ids, true)
                .unwrap_or_else(|_| seq.text.clone())
        } else {
            seq.text.clone()
        };
        Response {
            text,
            value: None,
            finish_reason,
            prompt_tokens: seq.prompt_len,
            cached_tokens: seq.cached_tokens,
            generated_tokens: token_ids.len(),
            token_ids,
            timings: Timings {
                queue: scheduled - seq.arrived,
                prefill: first_token - scheduled,
                decode: now - first_token,
            },
            tag: seq.tag,
        }
    }
}

/// Byte offset of the first stop string in `text`.
fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}
