//! The engine: requests in, responses out, one continuous batch per step.
//!
//! `step()` is three moves, as in nano-vllm: schedule, run, postprocess. Everything the step
//! touches is owned here and moves one way: request -> sequence -> scheduler -> batch ->
//! model -> constrained sampler -> response.

use super::batch_sampling::{self, Mask, PickOn};
use super::block_manager::BlockManager;
use super::chat::ChatTemplate;
use super::constraint::Grammars;
use super::logit_rules::TokenLogprob;
use super::metrics::{EngineTotals, StepMetrics};
use super::model_runner::ModelRunner;
use super::postprocess::{Ending, Postprocess, push_token, streamable};
use super::prompt_encoder::PromptEncoder;
use super::request::{FinishReason, Prompt, Request, RequestError, Response, Timings};
use super::retention::KvPolicy;
use super::sampler::Sampler;
use super::scheduler::{Scheduled, Scheduler, SchedulerConfig};
use super::sequence::{SeqId, Sequence};
use super::tokenizer::Tokenizer;
use crate::model::{AttentionBackend, CausalLm, KvCache, KvFormat, LoadedModel, ModelError};
use candle_core::Tensor;
use rayon::prelude::*;
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
    /// Tokens per KV block (default: 16 on the CPU; 32 on a GPU, the multiple of 32 paged
    /// FlashAttention needs).
    pub block_size: Option<usize>,
    /// Bytes of device memory for the KV cache (default: a quarter of free host memory on the
    /// CPU, up to 16 GiB; on a GPU, 90% of what the weights leave free).
    pub kv_memory: Option<usize>,
    /// Tokens one forward pass may process, prefill chunks plus decodes (default: 512 on
    /// the CPU, 8192 on a GPU).
    pub max_batch_tokens: Option<usize>,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// Longest sequence, prompt plus reply (default: the model's context length).
    pub max_context: Option<usize>,
    /// Reuse computed KV blocks across requests with the same prefix.
    pub prefix_caching: bool,
    /// Which cached blocks go first when the KV cache is full (see [`Engine::expect_calls`]).
    pub kv_policy: KvPolicy,
    /// Append the tokens a grammar forces without sampling them one per step.
    pub fast_forward: bool,
    /// The attention implementation (default: the fastest that runs on the device with the
    /// cache's dtype, head size and block size).
    pub attention: Option<AttentionBackend>,
    /// How the KV cache stores keys and values.
    pub kv_format: KvFormat,
    /// On a GPU, copy logits to the host and sample there instead of on the device.
    pub host_sampling: bool,
    /// Measure each phase of a step exactly (inputs, forward, attention, sampling, copies):
    /// on a GPU this waits for the device at every phase boundary, a few times per step.
    pub profile: bool,
    /// Read a control token's text inside a message (`<|im_end|>`) as that control token, as
    /// throng did before: only for callers who write every message themselves. By default a
    /// message's content is text, whatever it spells.
    pub control_tokens_in_content: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: None,
            kv_memory: None,
            max_batch_tokens: None,
            max_seqs: 256,
            max_context: None,
            prefix_caching: true,
            kv_policy: KvPolicy::default(),
            fast_forward: true,
            attention: None,
            kv_format: KvFormat::Auto,
            host_sampling: false,
            profile: false,
            control_tokens_in_content: false,
        }
    }
}

/// What a step produced.
#[derive(Debug, Default)]
pub(super) struct StepOutput {
    /// New text per sequence (streaming); a sequence's deltas join to its response's text.
    pub deltas: Vec<(SeqId, String)>,
    pub finished: Vec<(SeqId, Result<Response, RequestError>)>,
}

pub struct Engine {
    /// The tokenizer, chat template and model identity (see [`Engine::request_key`]).
    prompts: PromptEncoder,
    runner: ModelRunner,
    pick_on: PickOn,
    scheduler: Scheduler,
    max_context: usize,
    fast_forward: bool,
    next_id: SeqId,
    totals: EngineTotals,
    last_step: StepMetrics,
    /// Metrics of every step since the last `take_step_metrics`.
    history: Vec<StepMetrics>,
    /// Time to compute one grammar mask, in nanoseconds.
    mask_times: hdrhistogram::Histogram<u64>,
    /// The most KV blocks held at the end of a step since the last `take_kv_peak_bytes`.
    kv_peak_blocks: usize,
}

/// Default KV budget on the CPU: a quarter of the memory available, at most 16 GiB.
fn default_cpu_kv_memory() -> usize {
    let available = crate::host::available_memory().unwrap_or(8 << 30);
    (available / 4).min(16 << 30)
}

#[cfg(feature = "cuda")]
fn default_gpu_kv_memory(device: &candle_core::Device) -> Option<usize> {
    use candle_core::cuda_backend::cudarc::driver::result::mem_get_info;
    let candle_core::Device::Cuda(dev) = device else {
        return None;
    };
    let _ = dev.cuda_stream().context().bind_to_thread();
    mem_get_info().ok().map(|(free, _total)| free / 10 * 9)
}

#[cfg(not(feature = "cuda"))]
fn default_gpu_kv_memory(_device: &candle_core::Device) -> Option<usize> {
    None
}

/// The KV cache an engine on `device` gets unless told otherwise: a quarter of the host's
/// available memory (at most 16 GiB) on the CPU, 90% of the device's free memory on a GPU
/// (measured now, so after the weights are loaded).
pub fn default_kv_memory(device: &candle_core::Device) -> usize {
    if device.is_cpu() {
        default_cpu_kv_memory()
    } else {
        default_gpu_kv_memory(device).unwrap_or(4 << 30)
    }
}

/// What [`Engine::forward_and_masks`] produced.
struct ForwardRun {
    /// `(sampling rows, vocab)` on the model's device.
    logits: Tensor,
    /// Per running sequence: its mask and the time it took, if it samples under a grammar.
    masks: Vec<Option<(Mask, Duration)>>,
    inputs: Duration,
    forward: Duration,
    attention: Option<Duration>,
    mask_time: Duration,
}

impl Engine {
    pub fn new(loaded: LoadedModel, cfg: EngineConfig) -> Result<Self, EngineError> {
        let LoadedModel {
            model,
            tokenizer,
            chat,
            weights,
            origin,
            ..
        } = loaded;
        let model_cfg = model.config().clone();
        let device = model.device().clone();
        let dtype = cfg.kv_format.dtype(&device, model.dtype());
        let identity = crate::model::ModelIdentity::new(&origin, &weights, &device, dtype)?;
        let block_size = cfg
            .block_size
            .unwrap_or(if device.is_cpu() { 16 } else { 32 });
        if block_size == 0 || cfg.max_seqs == 0 {
            return Err(EngineError::Settings(
                "block_size and max_seqs must be positive".into(),
            ));
        }
        let kv_memory = cfg.kv_memory.unwrap_or_else(|| default_kv_memory(&device));
        let max_context = cfg
            .max_context
            .unwrap_or(model_cfg.max_position_embeddings)
            .min(model_cfg.max_position_embeddings);
        let num_blocks = KvCache::blocks_for_budget(&model_cfg, block_size, dtype, kv_memory);
        if num_blocks == 0 {
            return Err(EngineError::Settings(format!(
                "a KV memory budget of {kv_memory} bytes holds no block of {} bytes; raise --kv-memory",
                KvCache::bytes_per_block(&model_cfg, block_size, dtype)
            )));
        }
        let mut kv = KvCache::new(&model_cfg, num_blocks, block_size, dtype, &device)?;
        if let Some(attention) = cfg.attention {
            kv.set_attention(attention)
                .map_err(|e| EngineError::Settings(e.to_string()))?;
        }
        let max_batch_tokens =
            cfg.max_batch_tokens
                .unwrap_or(if device.is_cpu() { 512 } else { 8192 });
        if max_batch_tokens == 0 {
            return Err(EngineError::Settings(
                "max_batch_tokens must be positive".into(),
            ));
        }
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_batch_tokens,
                max_seqs: cfg.max_seqs,
            },
            BlockManager::with_policy(num_blocks, block_size, cfg.prefix_caching, cfg.kv_policy),
        );
        let tokenizer = Tokenizer::new(tokenizer, model_cfg.eos_token_ids.clone());
        let pick_on = if device.is_cpu() || cfg.host_sampling {
            PickOn::Host
        } else {
            PickOn::Device
        };
        let prompts = PromptEncoder {
            grammars: Grammars::new(&tokenizer, model_cfg.vocab_size),
            tokenizer,
            chat: ChatTemplate::new(&chat)?,
            identity,
            vocab: model_cfg.vocab_size,
            control_tokens_in_content: cfg.control_tokens_in_content,
            max_context,
        };
        Ok(Self {
            prompts,
            runner: ModelRunner::new(Box::new(model), kv, cfg.profile),
            pick_on,
            scheduler,
            max_context,
            fast_forward: cfg.fast_forward,
            next_id: 0,
            totals: EngineTotals::default(),
            last_step: StepMetrics::default(),
            history: Vec::new(),
            mask_times: hdrhistogram::Histogram::new(3)
                .expect("invariant: 3 significant digits is valid"),
            kv_peak_blocks: 0,
        })
    }

    pub fn model(&self) -> &dyn CausalLm {
        self.runner.model()
    }

    /// What this engine's replies are a function of, beside the request.
    pub fn identity(&self) -> &crate::model::ModelIdentity {
        &self.prompts.identity
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.prompts.tokenizer
    }

    pub fn chat_template(&self) -> &ChatTemplate {
        &self.prompts.chat
    }

    /// What renders, tokenizes and keys this engine's prompts, to do so on other threads.
    pub fn prompt_encoder(&self) -> &PromptEncoder {
        &self.prompts
    }

    pub fn totals(&self) -> EngineTotals {
        EngineTotals {
            preemptions: self.scheduler.preemptions(),
            cache: self.scheduler.blocks.stats(),
            ..self.totals
        }
    }

    /// The `q`-quantile (0..=1) of the time one grammar mask took, if any was computed.
    pub fn mask_time_quantile(&self, q: f64) -> Option<Duration> {
        (!self.mask_times.is_empty())
            .then(|| Duration::from_nanos(self.mask_times.value_at_quantile(q)))
    }

    pub fn last_step(&self) -> StepMetrics {
        self.last_step
    }

    /// Per-step metrics recorded since the previous call.
    pub(crate) fn take_step_metrics(&mut self) -> Vec<StepMetrics> {
        std::mem::take(&mut self.history)
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Sequences that run at once at most.
    pub fn max_seqs(&self) -> usize {
        self.scheduler.config().max_seqs
    }

    /// The most KV-cache memory held at once (at the end of a step, before finished
    /// sequences let go of theirs) since the last call; free blocks that still hold a cached
    /// prefix are not counted.
    pub(crate) fn take_kv_peak_bytes(&mut self) -> u64 {
        let peak = std::mem::take(&mut self.kv_peak_blocks);
        (peak * self.runner.kv().block_bytes()) as u64
    }

    /// Announces the next round of calls: requests keyed `keys` (their
    /// [`Request::retention_key`]) will come in this order, and, once served, again in the same
    /// order in the round after. Under [`KvPolicy::NextCall`] a full cache then evicts first
    /// the blocks no announced key holds, then those whose key is called furthest in the future
    /// (Belady's MIN, as far as the announcement is right), instead of the least recently freed,
    /// which is the next to be called when every caller comes once per round in the same order.
    /// Keys it does not list are forgotten. Call it before submitting the round's requests; a
    /// wrong or missing announcement costs cache hits, never a different reply.
    pub fn expect_calls<K: AsRef<str>>(&mut self, keys: impl IntoIterator<Item = K>) {
        self.scheduler.blocks.expect_calls(keys);
    }

    /// The eviction policy of the KV cache.
    pub fn kv_policy(&self) -> KvPolicy {
        self.scheduler.blocks.policy()
    }

    pub fn num_kv_blocks(&self) -> usize {
        self.scheduler.blocks.num_blocks()
    }

    /// KV blocks no request holds (some may still hold a cached prefix).
    pub fn num_free_kv_blocks(&self) -> usize {
        self.scheduler.blocks.num_free()
    }

    /// The KV cache: its size, layout and attention implementation.
    pub fn kv_cache(&self) -> &KvCache {
        self.runner.kv()
    }

    /// Whether tokens are sampled on the device (a GPU) rather than on the host.
    pub fn samples_on_device(&self) -> bool {
        self.pick_on == PickOn::Device
    }

    /// Requests queued and not admitted to the batch yet.
    pub(crate) fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting()
    }

    /// Requests in the batch.
    pub(crate) fn num_running(&self) -> usize {
        self.scheduler.running().len()
    }

    /// Whether any request is waiting or running.
    pub(super) fn has_work(&self) -> bool {
        !self.scheduler.is_idle()
    }

    /// Token ids of a request's prompt.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, RequestError> {
        self.prompts.tokens(prompt)
    }

    /// Validates `request` and queues it; the id names it in [`StepOutput`]. Errors (a bad
    /// schema, a prompt too long) are reported here, before anything runs.
    pub(super) fn submit(&mut self, request: Request) -> Result<SeqId, RequestError> {
        if request.max_tokens == 0 {
            return Err(RequestError::ZeroMaxTokens);
        }
        if let Some(problem) = request.sampling.problem() {
            return Err(RequestError::InvalidSampling(problem));
        }
        if let Some(problem) = request.logits.problem(self.prompts.vocab) {
            return Err(RequestError::InvalidSampling(problem));
        }
        if self.pick_on == PickOn::Device && !request.logits.is_neutral() {
            // The device kernel reads raw logits only; the host path applies the rules.
            return Err(RequestError::InvalidSampling(
                "logit_bias, frequency and presence penalties and logprobs are computed on the \
                 host: start the engine with host sampling (`--host-sampling`, \
                 EngineConfig::host_sampling) to use them on a GPU"
                    .into(),
            ));
        }
        let constraint = match &request.json_schema {
            None => None,
            // Compiled on the grammars' own threads (a server compiled it already).
            Some(schema) => Some(self.prompts.grammars.constraint(schema)?),
        };
        let tokens = self.prompts.take_tokens(request.prompt)?;
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
        // A stop string inside a constrained reply would cut its JSON short of parsing: the
        // grammar alone says where such a reply ends, so its stop strings are not applied.
        if constraint.is_none() {
            seq.stop = request.stop;
        }
        seq.rules = request.logits;
        seq.tag = request.tag;
        seq.retention_key = request.retention_key;
        seq.constraint = constraint;
        if self.fast_forward {
            // Tokens the grammar forces at the start ride along with the prompt's prefill.
            let room = seq.limit(self.max_context) - seq.tokens.len();
            if let Some(c) = seq.constraint.as_mut() {
                let forced = c.forced(room);
                self.totals.forced_tokens += forced.len() as u64;
                for t in forced {
                    if seq.rules.logprobs.is_some() {
                        seq.logprobs.push(TokenLogprob::forced(t));
                    }
                    push_token(&self.prompts.tokenizer, &mut seq, t);
                }
            }
        }
        self.totals.requests += 1;
        self.totals.prompt_tokens += seq.prompt_len as u64;
        self.scheduler.add(seq);
        Ok(id)
    }

    /// One scheduling step: plan, forward (with grammar masks alongside), sample, retire.
    /// A failure of the forward pass fails the requests in flight, not the engine.
    ///
    /// On a GPU the host waits for the device once per step: when it downloads the sampled
    /// token ids, which it needs to advance grammars, detokenise, and plan the next step. That
    /// wait covers the forward pass and the sampling kernel. Nothing else in a step
    /// synchronises: the batch's inputs, masks and draws go up as asynchronous copies from
    /// host memory (the host waits only until the driver has staged them), kernels are queued,
    /// and no logits come back. With `EngineConfig::host_sampling` the download is the logits
    /// instead. With `EngineConfig::profile` the device is also synchronised after the inputs,
    /// after the forward pass and before the download, so that each phase's time is its own,
    /// and attention is timed with CUDA events read after the step's wait.
    pub(super) fn step(&mut self) -> StepOutput {
        let plan = self.scheduler.schedule();
        if plan.is_empty() {
            return self
                .fail_all("no waiting request fits in the KV cache; raise --kv-memory".into());
        }
        let run = match self.forward_and_masks(&plan) {
            Ok(r) => r,
            Err(e) => return self.fail_all(e.to_string()),
        };
        let masks: Vec<Option<Mask>> = run
            .masks
            .into_iter()
            .map(|m| {
                m.map(|(mask, took)| {
                    let _ = self.mask_times.record(took.as_nanos().max(1) as u64);
                    mask
                })
            })
            .collect();

        // Logits row of each running sequence that samples, in plan order.
        let mut row_of: Vec<Option<usize>> = vec![None; self.scheduler.running().len()];
        for (row, p) in plan.iter().filter(|p| p.wants_logits).enumerate() {
            row_of[p.index] = Some(row);
        }
        let picked = match batch_sampling::pick(
            run.logits,
            &row_of,
            self.scheduler.running_mut(),
            &masks,
            self.pick_on,
            self.runner.profiles(),
        ) {
            Ok(p) => p,
            Err(e) => return self.fail_all(e.to_string()),
        };
        let sampled = picked.tokens;

        let mut out = StepOutput::default();
        let mut endings = Vec::new();
        let mut prefill_tokens = 0;
        let post = Postprocess {
            tokenizer: &self.prompts.tokenizer,
            fast_forward: self.fast_forward,
            max_context: self.max_context,
        };
        let running = self.scheduler.running_mut();
        for p in &plan {
            let seq = &mut running[p.index];
            if seq.computed < seq.prompt_len || p.len > 1 {
                prefill_tokens += p.len;
            }
            seq.computed += p.len;
            if !p.wants_logits {
                continue;
            }
            seq.first_token.get_or_insert_with(Instant::now);
            let ending = match &sampled[p.index] {
                None => unreachable!("every chunk that wants logits got a row"),
                Some(Err(why)) => Some(Ending::Failed(why.to_string())),
                Some(Ok(token)) if post.tokenizer.is_eos(*token) => {
                    Some(Ending::Finished(FinishReason::Stop))
                }
                Some(Ok(token)) => post.advance(seq, *token, &mut self.totals),
            };
            match ending {
                Some(ending) => endings.push((p.index, ending)),
                // Its text was just searched for stop strings (forced text too, which a
                // sequence in prefill has not had searched yet): what none can cut may go out.
                None => {
                    if let Some(delta) = streamable(seq) {
                        out.deltas.push((seq.id, delta));
                    }
                }
            }
        }
        // Blocks filled this step become reusable before their holders leave.
        self.scheduler.register_computed();
        // Counted before finished sequences let go of theirs: the step's peak.
        let blocks_used = self.scheduler.blocks.num_blocks() - self.scheduler.blocks.num_free();
        self.answer(endings, &mut out);
        let metrics = StepMetrics {
            seqs: plan.len(),
            tokens: plan.iter().map(|p| p.len).sum(),
            prefill_tokens,
            waiting: self.scheduler.num_waiting(),
            blocks_used,
            inputs: run.inputs,
            forward: run.forward,
            attention: run.attention,
            masks: run.mask_time,
            num_masks: masks.iter().filter(|m| m.is_some()).count(),
            sampling: picked.sampling,
            copies: picked.copies,
        };
        self.record(metrics);
        out
    }

    /// Takes the sequences that ended this step (by their index among the running) out of
    /// the scheduler and answers them in `out`, highest index first so that the indices
    /// still to go stay valid.
    fn answer(&mut self, mut endings: Vec<(usize, Ending)>, out: &mut StepOutput) {
        endings.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (index, ending) in endings {
            let seq = self.scheduler.finish(index);
            let (id, streamed) = (seq.id, seq.streamed);
            let result = self.response(seq, ending);
            // The rest of the reply goes out before the reply itself, so that a stream joins
            // to exactly the response's text (which starts with what was streamed).
            if let Some(rest) = result.as_ref().ok().and_then(|r| r.text.get(streamed..))
                && !rest.is_empty()
            {
                out.deltas.push((id, rest.to_string()));
            }
            out.finished.push((id, result));
        }
    }

    fn record(&mut self, m: StepMetrics) {
        self.kv_peak_blocks = self.kv_peak_blocks.max(m.blocks_used);
        self.last_step = m;
        self.history.push(m);
        let t = &mut self.totals;
        t.steps += 1;
        t.prefill_tokens += m.prefill_tokens as u64;
        t.inputs += m.inputs;
        t.forward += m.forward;
        t.attention += m.attention.unwrap_or_default();
        t.masks += m.masks;
        t.num_masks += m.num_masks as u64;
        t.sampling += m.sampling;
        t.copies += m.copies;
    }

    /// Runs the forward pass and computes the grammar masks of the sequences that sample
    /// this step: in parallel across sequences, and on a GPU at the same time as the forward
    /// pass (on the CPU the forward pass already uses every core).
    fn forward_and_masks(&mut self, plan: &[Scheduled]) -> Result<ForwardRun, ModelError> {
        let start = Instant::now();
        let batch = self.runner.prepare(self.scheduler.running(), plan)?;
        let inputs = start.elapsed();
        let mut sampling = vec![false; self.scheduler.running().len()];
        for p in plan.iter().filter(|p| p.wants_logits) {
            sampling[p.index] = true;
        }
        let running = self.scheduler.running_mut();
        let compute_masks =
            |running: &mut [Sequence]| -> (Vec<Option<(Mask, Duration)>>, Duration) {
                let start = Instant::now();
                let masks = running
                    .par_iter_mut()
                    .zip(sampling.par_iter())
                    .map(|(seq, &samples)| {
                        if !samples {
                            return None;
                        }
                        seq.constraint.as_mut().map(|c| {
                            let start = Instant::now();
                            let mask = c.mask();
                            (mask, start.elapsed())
                        })
                    })
                    .collect();
                (masks, start.elapsed())
            };
        let runner = &mut self.runner;
        let forward_only = |runner: &mut ModelRunner| -> Result<(Tensor, Duration), ModelError> {
            let start = Instant::now();
            let logits = runner.forward(&batch)?;
            Ok((logits, start.elapsed()))
        };
        let (logits, forward, masks, mask_time) = if runner.model().device().is_cpu() {
            let (masks, mask_time) = compute_masks(running);
            let (logits, forward) = forward_only(runner)?;
            (logits, forward, masks, mask_time)
        } else {
            std::thread::scope(|s| {
                let handle = s.spawn(|| forward_only(runner));
                let (masks, mask_time) = compute_masks(running);
                let (logits, forward) = handle
                    .join()
                    .expect("invariant: the forward pass does not panic")?;
                Ok::<_, ModelError>((logits, forward, masks, mask_time))
            })?
        };
        Ok(ForwardRun {
            logits,
            masks,
            inputs,
            forward,
            attention: batch.attention_time()?,
            mask_time,
        })
    }

    /// Takes request `id` out, waiting or running, unanswered: its caller gave up on it. Its
    /// blocks are free for the next step and nothing is kept for its retention key (see
    /// [`Scheduler::cancel`]). False if it is not in flight.
    pub(super) fn cancel(&mut self, id: SeqId) -> bool {
        self.scheduler.cancel(id).is_some()
    }

    /// Drops every request in flight, unanswered: their caller gave up on them.
    pub(super) fn abandon(&mut self) {
        self.scheduler.drain();
    }

    /// Ends every request in flight with `message`.
    fn fail_all(&mut self, message: String) -> StepOutput {
        let finished = self
            .scheduler
            .drain()
            .into_iter()
            .map(|seq| (seq.id, Err(RequestError::Engine(message.clone()))))
            .collect();
        StepOutput {
            deltas: Vec::new(),
            finished,
        }
    }

    fn response(&self, seq: Sequence, ending: Ending) -> Result<Response, RequestError> {
        let finish_reason = match ending {
            Ending::Finished(reason) => reason,
            Ending::Failed(message) => return Err(RequestError::Engine(message)),
        };
        let now = Instant::now();
        let scheduled = seq.first_scheduled.unwrap_or(now);
        let first_token = seq.first_token.unwrap_or(now);
        let token_ids = seq.generated().to_vec();
        // Decoding the whole reply once gives exactly the tokenizer's text; stop strings
        // were found in the incremental text and cut there.
        let mut text = if seq.stop.is_empty() {
            self.prompts
                .tokenizer
                .decode(&token_ids, true)
                .unwrap_or_else(|_| seq.text.clone())
        } else {
            seq.text.clone()
        };
        // What was streamed is out for good. Where decoding the whole differs from the
        // incremental text (a tokenizer whose pieces merge), the incremental text, which
        // starts with it, is the reply, so that a stream always joins to the response.
        if !seq
            .text
            .get(..seq.streamed)
            .is_some_and(|streamed| text.starts_with(streamed))
        {
            text = seq.text.clone();
        }
        let value = match (&seq.constraint, finish_reason) {
            (Some(c), FinishReason::Stop) => c.value_of(&text).map_err(|e| {
                RequestError::Engine(format!(
                    "the constrained reply {text:?} does not parse: {e}"
                ))
            })?,
            _ => None,
        };
        let logprobs = seq.rules.logprobs.is_some().then(|| {
            let mut logprobs = seq.logprobs;
            // The end-of-turn token is not a token of the reply.
            logprobs.truncate(token_ids.len());
            logprobs
        });
        Ok(Response {
            text,
            value,
            finish_reason,
            prompt_tokens: seq.prompt_len,
            cached_tokens: seq.cached_tokens.unwrap_or(0),
            generated_tokens: token_ids.len(),
            token_ids,
            timings: Timings {
                queue: scheduled - seq.arrived,
                prefill: first_token - scheduled,
                decode: now - first_token,
            },
            tag: seq.tag,
            logprobs,
        })
    }
}
