//! `throng generate`: one prompt streamed, N seeded copies, or a JSONL file of requests,
//! as an offline batch-inference tool. The work is the library's (`crate::generate`); this
//! turns the arguments into its options and prints what it reports.

use super::ModelArgs;
use super::numbers::{at_least_one, temperature, top_p};
use crate::engine::summary;
use crate::engine::{Message, Prompt, SamplingParams};
use crate::generate::{GenerateOptions, Outcome, Requests, Source};
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The user message.
    #[arg(
        long,
        required_unless_present = "requests",
        conflicts_with = "requests"
    )]
    pub prompt: Option<String>,
    /// An optional system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Send the prompt as raw text instead of through the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A JSON schema file the reply must satisfy; stdout becomes JSON Lines.
    #[arg(long)]
    pub schema: Option<PathBuf>,
    /// Run N copies of the request, copy i seeded with derive(seed, i); stdout becomes JSON Lines.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    pub n: usize,
    /// A JSON Lines file of requests (`messages`, through the chat template, or `prompt`, raw
    /// text without it; optional `json_schema`, `max_tokens`, `temperature`, `top_p`,
    /// `top_k`, `seed`, `stop`, `tag`); one response line per request, in order, each written
    /// as soon as it and every earlier one are done. `-` reads standard input as requests
    /// arrive, so that another program can drive one process as a coprocess (write a request,
    /// read its response, write the next) and keep its prefix cache from call to call.
    #[arg(long)]
    pub requests: Option<PathBuf>,
    #[arg(long, default_value_t = 256, value_parser = at_least_one())]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_parser = temperature(), allow_negative_numbers = true)]
    pub temperature: f32,
    #[arg(long, value_parser = at_least_one())]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0, value_parser = top_p(), allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write each response as soon as it is done, in completion order (each line carries its
    /// request's `index` and `tag`), instead of in input order.
    #[arg(long, requires = "requests")]
    pub unordered: bool,
    /// Time every operation of the forward pass and print where the time went, as a Markdown
    /// table on stderr (matmuls by layer type, attention, norms, RoPE, copies, the rest).
    #[arg(long)]
    pub profile: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let options = options_of(&args)?;
    let mut source = Source::open(&options)?;
    let (mut engine, _) = args.model.settings().load_engine_with(args.profile)?;
    let started = Instant::now();
    let outcome = crate::generate::run(
        &mut engine,
        &mut source,
        options.unordered,
        std::io::stdout().lock(),
    )?;
    match outcome {
        Outcome::One(response) => {
            if let Some(r) = response {
                let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
                eprintln!(
                    "throng: prefill {} tokens in {:.3}s ({:.1} tokens/s), decode {} tokens in {:.3}s ({:.1} tokens/s), finish: {:?}",
                    r.prompt_tokens,
                    r.timings.prefill.as_secs_f64(),
                    rate(r.prompt_tokens, r.timings.prefill),
                    r.generated_tokens,
                    r.timings.decode.as_secs_f64(),
                    rate(r.generated_tokens.saturating_sub(1), r.timings.decode),
                    r.finish_reason,
                );
            }
            eprintln!("{}", summary(&engine, started.elapsed()));
        }
        Outcome::Lines(counts) => {
            eprintln!("{}", summary(&engine, started.elapsed()));
            if counts.failed > 0 {
                if let Some(profile) = engine.model().profile() {
                    eprintln!("throng: forward pass profile\n{}", profile.table());
                }
                bail!(
                    "{} of {} requests failed (their lines carry `error`)",
                    counts.failed,
                    counts.total
                );
            }
        }
    }
    if let Some(profile) = engine.model().profile() {
        eprintln!("throng: forward pass profile\n{}", profile.table());
    }
    Ok(())
}

/// The library's options from the arguments: a `--requests` file (`-`: standard input), else
/// copies of `--prompt`, with `--schema` read.
fn options_of(args: &GenerateArgs) -> Result<GenerateOptions> {
    let schema = args
        .schema
        .as_deref()
        .map(crate::generate::read_schema)
        .transpose()?;
    let requests = match &args.requests {
        Some(path) if path.as_os_str() == "-" => Requests::Stdin,
        Some(path) => Requests::File(path.clone()),
        None => {
            let text = args
                .prompt
                .clone()
                .expect("invariant: clap requires --prompt without --requests");
            let prompt = if args.raw {
                Prompt::Text(text)
            } else {
                let mut messages: Vec<Message> =
                    args.system.iter().cloned().map(Message::system).collect();
                messages.push(Message::user(text));
                Prompt::Messages(messages)
            };
            Requests::Prompt {
                prompt,
                schema,
                n: args.n,
            }
        }
    };
    Ok(GenerateOptions {
        requests,
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        unordered: args.unordered,
    })
}
