//! Subcommands of the `throng` binary. Raw arguments become validated settings here; the
//! library below never sees a command line.

/// `println!` that returns the write's error instead of panicking: a closed pipe (`throng
/// models | head -1`) ends the command quietly, a full disk is reported.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(anyhow::Error::from)
    }};
}

pub mod bench;
pub mod eval;
pub mod generate;
pub mod models;
pub mod plan;
pub mod run;

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use throng::engine::{Engine, EngineConfig};
use throng::model::{LoadOptions, WeightFormat, loader};

/// Where and how to load the model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// A preset (`throng models`), a model folder, a GGUF file or a Hugging Face repo id.
    #[arg(long, default_value = throng::model::DEFAULT_MODEL)]
    pub model: String,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Format weights are converted to at load.
    #[arg(long, value_enum, default_value_t = WeightFormat::Auto)]
    pub weights: WeightFormat,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Memory for the KV cache, e.g. `2GiB` (default: derived from the device).
    #[arg(long)]
    pub kv_memory: Option<bytesize::ByteSize>,
    /// Tokens per forward pass (default: 512 on CPU, 8192 on GPU).
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Sequences running at once.
    #[arg(long, default_value_t = 256)]
    pub max_seqs: usize,
    /// Turn off prefix caching (for comparisons).
    #[arg(long)]
    pub no_prefix_cache: bool,
}

/// Whether `e` comes from writing to a pipe whose reader has gone (`| head`).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

pub fn parse_device(spec: &str) -> Result<candle_core::Device> {
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
    candle_core::Device::new_cuda(ordinal).with_context(|| {
        format!(
            "cannot open CUDA device {ordinal}: is there an NVIDIA GPU with its driver here \
             (`nvidia-smi` lists them)?"
        )
    })
}

impl ModelArgs {
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            kv_memory: self.kv_memory.map(|b| b.as_u64() as usize),
            max_batch_tokens: self.max_batch_tokens,
            max_seqs: self.max_seqs,
            prefix_caching: !self.no_prefix_cache,
            ..EngineConfig::default()
        }
    }

    /// The engine and what its weights were stored as and became (`GGUF (Q4_1) -> Dense(F32)`).
    pub fn load_engine_described(&self) -> Result<(Engine, String)> {
        self.load_engine_with(false)
    }

    /// As [`ModelArgs::load_engine_described`], with per-operation profiling of the forward
    /// pass when `profile` is set (read back through `engine.model().profile()`).
    pub fn load_engine_with(&self, profile: bool) -> Result<(Engine, String)> {
        let opts = LoadOptions {
            device: parse_device(&self.device)?,
            weights: self.weights,
            tokenizer: self.tokenizer.clone(),
        };
        let started = std::time::Instant::now();
        let mut loaded = loader::load(&self.model, &opts)
            .with_context(|| format!("loading model `{}`", self.model))?;
        if profile {
            loaded.model.enable_profiling();
        }
        eprintln!(
            "throng: loaded {} ({}) in {:.1}s",
            self.model,
            loaded.weights,
            started.elapsed().as_secs_f64()
        );
        let weights = loaded.weights.clone();
        Ok((Engine::new(loaded, self.engine_config())?, weights))
    }
}
