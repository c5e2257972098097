//! What `throng bench` measured: per step and for the run, as JSON and as a text table.

use crate::engine::StepMetrics;
use serde::Serialize;
use std::time::Duration;

/// Where a step's time went, in seconds. `forward` includes `attention`; `masks` runs beside
/// the forward pass on a GPU (see `masks_overlap_forward`) and before it on the CPU.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Phases {
    /// Packing each engine step's inputs and copying them to the device.
    pub inputs: f64,
    /// Forward passes, attention included.
    pub forward: f64,
    /// Of `forward`: attention.
    pub attention: f64,
    /// Of `forward`: everything but attention (the matmuls, norms, RoPE, embeddings).
    pub matmuls_and_rest: f64,
    /// Computing grammar masks on CPU threads.
    pub masks: f64,
    /// Applying masks and picking tokens.
    pub sampling: f64,
    /// Copies of logits, masks, draws and token ids between host and device.
    pub copies: f64,
    /// The rest of the wall time: scheduling, grammar advances, detokenising, bookkeeping.
    pub other: f64,
}

impl Phases {
    /// Sums the engine steps of one bench step, with `wall` the bench step's time.
    pub(crate) fn from_steps(steps: &[StepMetrics], wall: Duration, masks_overlap: bool) -> Self {
        let sum = |f: fn(&StepMetrics) -> Duration| steps.iter().map(f).sum::<Duration>();
        let secs = |d: Duration| d.as_secs_f64();
        let forward = sum(|m| m.forward);
        let attention = sum(|m| m.attention.unwrap_or_default());
        let masks = sum(|m| m.masks);
        let mut p = Phases {
            inputs: secs(sum(|m| m.inputs)),
            forward: secs(forward),
            attention: secs(attention),
            matmuls_and_rest: secs(forward.saturating_sub(attention)),
            masks: secs(masks),
            sampling: secs(sum(|m| m.sampling)),
            copies: secs(sum(|m| m.copies)),
            other: 0.0,
        };
        let sequential = p.inputs
            + p.forward
            + p.sampling
            + p.copies
            + if masks_overlap { 0.0 } else { p.masks };
        p.other = (wall.as_secs_f64() - sequential).max(0.0);
        p
    }

    /// Each phase as a share of `wall` seconds.
    pub fn shares(&self, wall: f64) -> Phases {
        let s = |x: f64| if wall > 0.0 { x / wall } else { 0.0 };
        Phases {
            inputs: s(self.inputs),
            forward: s(self.forward),
            attention: s(self.attention),
            matmuls_and_rest: s(self.matmuls_and_rest),
            masks: s(self.masks),
            sampling: s(self.sampling),
            copies: s(self.copies),
            other: s(self.other),
        }
    }
}

/// One simulation step: every agent submits a prompt and gets its reply.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    pub step: usize,
    /// Wall time from submitting the agents' prompts to the last reply.
    pub seconds: f64,
    /// Engine steps (forward passes) it took.
    pub engine_steps: usize,
    pub prompt_tokens: u64,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: u64,
    /// Tokens computed in prompt (multi-token) chunks.
    pub prefill_tokens: u64,
    /// Tokens of the replies (sampled and grammar-forced).
    pub reply_tokens: u64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    /// `decode_tokens_per_s` per agent: how fast one agent's reply grows.
    pub decode_tokens_per_s_per_agent: f64,
    /// Share of the step's prompt tokens served by the prefix cache.
    pub prefix_cache_hit_rate: f64,
    /// Most KV blocks held at once, and their bytes.
    pub kv_blocks_peak: usize,
    pub kv_bytes_peak: u64,
    /// Cached KV blocks evicted to make room.
    pub kv_evictions: u64,
    /// Replies that ended by completing their schema (or their stop), by their token limit,
    /// and by an error.
    pub finished_stop: usize,
    pub finished_length: usize,
    pub failed: usize,
    pub phases: Phases,
    pub shares: Phases,
}

/// A whole `throng bench` run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub shape: String,
    pub parameters: u64,
    pub device: String,
    /// How the weights are stored and computed (`Dense(BF16)`, ...).
    pub weights: String,
    /// The KV cache's dtype.
    pub kv_format: String,
    pub attention: String,
    /// `device` or `host`.
    pub sampling_on: String,
    pub block_size: usize,
    pub kv_blocks: usize,
    pub kv_bytes: u64,
    /// Which cached blocks go first when the cache is full (`--kv-policy`).
    pub kv_policy: String,
    pub agents: usize,
    pub shared_tokens: usize,
    pub own_tokens: usize,
    pub reply_tokens: usize,
    pub constrained: bool,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub seed: u64,
    /// On a GPU masks are computed while the forward pass runs, so their time overlaps it.
    pub masks_overlap_forward: bool,
    /// Seconds to build the random model and the engine.
    pub load_seconds: f64,
    pub steps: Vec<StepReport>,
}

fn gib(bytes: u64) -> String {
    if bytes < 1 << 30 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

fn count(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else {
        format!("{:.2}B", n as f64 / 1e9)
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn time(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

impl BenchReport {
    /// The report as a text table.
    pub fn text(&self) -> String {
        let mut out = format!(
            "throng bench: {} ({} parameters, random weights), {} on {}, attention: {}, sampling on the {}\n\
             {} agents; step 1 prompts: {} shared + {} own tokens; later steps add each agent's reply and {} own tokens; \
             replies <= {} tokens{}\n\
             KV cache: {} as {} ({} blocks of {} tokens, {} eviction); built in {:.1} s\n\n",
            self.shape,
            count(self.parameters),
            self.weights,
            self.device,
            self.attention,
            self.sampling_on,
            self.agents,
            self.shared_tokens,
            self.own_tokens,
            self.own_tokens,
            self.reply_tokens,
            if self.constrained {
                ", JSON decision schema"
            } else {
                ""
            },
            gib(self.kv_bytes),
            self.kv_format,
            self.kv_blocks,
            self.block_size,
            self.kv_policy,
            self.load_seconds,
        );
        out.push_str(
            "step  time      prefill tok/s  decode tok/s  per agent  cache hits  KV peak     | forward (attn)   masks  sampling  copies  inputs  other\n",
        );
        for s in &self.steps {
            let sh = &s.shares;
            out.push_str(&format!(
                "{:<5} {:<9} {:<14.0} {:<13.0} {:<10.2} {:<11} {:<11} | {:<4} ({:<4})      {:<6} {:<9} {:<7} {:<7} {}\n",
                s.step,
                time(s.seconds),
                s.prefill_tokens_per_s,
                s.decode_tokens_per_s,
                s.decode_tokens_per_s_per_agent,
                pct(s.prefix_cache_hit_rate),
                gib(s.kv_bytes_peak),
                pct(sh.forward),
                pct(sh.attention),
                pct(sh.masks),
                pct(sh.sampling),
                pct(sh.copies),
                pct(sh.inputs),
                pct(sh.other),
            ));
        }
        let failed: usize = self.steps.iter().map(|s| s.failed).sum();
        if failed > 0 {
            out.push_str(&format!("\n{failed} replies failed (see the JSON)\n"));
        }
        if self.masks_overlap_forward {
            out.push_str(
                "\nmasks run on CPU threads beside the forward pass; their share overlaps it\n",
            );
        }
        out
    }
}
