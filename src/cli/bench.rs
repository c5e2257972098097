//! `throng bench`: the engine on a random-weight model of a preset's shape, stepped as a
//! simulation steps its agents; prints a table and writes the same as JSON.

use super::choice::{AttentionArg, KvFormatArg, KvPolicyArg, ShapeArg, WeightsArg};
use super::numbers::{at_least_one, temperature, top_p};
use crate::bench::{Bench, BenchSpec};
use crate::engine::{EngineConfig, KvPolicy};
use crate::model::synthetic::Shape;
use crate::model::{AttentionBackend, KvFormat, WeightFormat};
use crate::run::parse_device;
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The model's shape (its weights are random): `tiny` (the test model) or a preset's.
    #[arg(long, value_parser = ShapeArg::parser(), default_value = "tiny")]
    pub shape: Shape,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Agents deciding every step, all in one continuous batch.
    #[arg(long, default_value_t = 64, value_parser = at_least_one())]
    pub agents: usize,
    /// Prompt tokens every agent shares (the rules).
    #[arg(long, default_value_t = 400)]
    pub shared: usize,
    /// Prompt tokens of its own each agent adds every step (its state).
    #[arg(long, default_value_t = 200)]
    pub own: usize,
    /// Most reply tokens per agent and step.
    #[arg(long, default_value_t = 40, value_parser = at_least_one())]
    pub reply: usize,
    /// Simulation steps; step 1 is cold, later ones reuse each agent's previous turn.
    #[arg(long, default_value_t = 3, value_parser = at_least_one())]
    pub steps: usize,
    /// Free replies instead of JSON decisions (no grammar masks).
    #[arg(long)]
    pub no_schema: bool,
    /// Sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.7, value_parser = temperature(), allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0, value_parser = top_p(), allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long, value_parser = at_least_one())]
    pub top_k: Option<usize>,
    /// Seeds the weights, the prompts and the sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Format of the weights (auto: f32 on the CPU, bf16 on CUDA).
    #[arg(long, value_parser = WeightsArg::parser(), default_value = "auto")]
    pub weights: WeightFormat,
    /// Attention implementation (default: the fastest the device runs).
    #[arg(long, value_parser = AttentionArg::parser())]
    pub attention: Option<AttentionBackend>,
    /// On a GPU, copy logits to the host and sample there (for comparison).
    #[arg(long)]
    pub host_sampling: bool,
    /// Tokens per KV block (default: 16 on the CPU, 32 on a GPU).
    #[arg(long, value_parser = at_least_one())]
    pub block_size: Option<usize>,
    /// Memory for the KV cache, e.g. `40GiB` (default: what the agents' contexts need).
    #[arg(long)]
    pub kv_memory: Option<bytesize::ByteSize>,
    /// How the KV cache stores keys and values.
    #[arg(long, value_parser = KvFormatArg::parser(), default_value = "auto")]
    pub kv_format: KvFormat,
    /// Tokens per forward pass (default: 512 on the CPU, 8192 on a GPU).
    #[arg(long, value_parser = at_least_one())]
    pub max_batch_tokens: Option<usize>,
    /// Sequences running at once (default: every agent).
    #[arg(long, value_parser = at_least_one())]
    pub max_seqs: Option<usize>,
    /// Turn off prefix caching (for comparisons).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Which cached KV blocks go first when the cache is full: `next-call` keeps the agents
    /// called soonest (the bench announces each step's agents), `lru` the least recently
    /// freed, for comparison (with a --kv-memory too small for every agent's context).
    #[arg(long, value_parser = KvPolicyArg::parser(), default_value = "next-call")]
    pub kv_policy: KvPolicy,
    /// Where to write the JSON report (default: runs/bench-SHAPE-AGENTS-TIME.json).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Measure this CPU instead: how fast every thread reads memory together, and the most
    /// 8-bit products a second the integer kernel's instructions make (no memory traffic),
    /// printed as one JSON line; the benchmarks give their rates as shares of these.
    #[arg(long)]
    pub machine: bool,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.machine {
        let line = serde_json::json!({
            "kernel": crate::model::quant::kernel_name(),
            "threads": rayon::current_num_threads(),
            "memory_read_gb_per_s": crate::model::quant::memory_read_bytes_per_second() / 1e9,
            "int8_products_g_per_s": crate::model::quant::int8_peak() / 1e9,
        });
        println!("{line}");
        return Ok(());
    }
    let device = parse_device(&args.device)?;
    let spec = BenchSpec {
        shape: args.shape,
        agents: args.agents,
        shared: args.shared,
        own: args.own,
        reply: args.reply,
        steps: args.steps,
        constrained: !args.no_schema,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        weights: args.weights,
        engine: EngineConfig {
            block_size: args.block_size,
            kv_memory: args.kv_memory.map(|b| b.as_u64() as usize),
            max_batch_tokens: args.max_batch_tokens,
            max_seqs: args.max_seqs.unwrap_or(0),
            prefix_caching: !args.no_prefix_cache,
            kv_policy: args.kv_policy,
            attention: args.attention,
            kv_format: args.kv_format,
            host_sampling: args.host_sampling,
            ..EngineConfig::default()
        },
    };
    eprintln!(
        "throng bench: building a random {} model on {}",
        spec.shape.name(),
        args.device
    );
    let mut bench = Bench::new(spec, &device).context("setting up the benchmark")?;
    for _ in 0..args.steps {
        let step = bench.step()?;
        eprintln!(
            "throng bench: step {} took {:.3} s ({:.0} decode tok/s, {:.0}% prefix-cache hits, \
             {} KV blocks evicted)",
            step.step,
            step.seconds,
            step.decode_tokens_per_s,
            100.0 * step.prefix_cache_hit_rate,
            step.kv_evictions
        );
    }
    let report = bench.report();
    print!("{}", report.text());
    let path = args.json.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from("runs").join(format!(
            "bench-{}-{}-{now}.json",
            report.shape, report.agents
        ))
    });
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("throng bench: wrote {}", path.display());
    Ok(())
}
