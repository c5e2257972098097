//! `throng generate`: one prompt streamed, N seeded copies, or a JSONL file of requests,
//! as an offline batch-inference tool.

use super::ModelArgs;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use throng::engine::{Engine, Message, Prompt, Request, RequestError, Response, SamplingParams};

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
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// A JSON Lines file of requests (`messages` or `prompt`, optional `json_schema`,
    /// `max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`, `tag`); one response
    /// line per request, in order.
    #[arg(long)]
    pub requests: Option<PathBuf>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Time every operation of the forward pass and print where the time went, as a Markdown
    /// table on stderr (matmuls by layer type, attention, norms, RoPE, copies, the rest).
    #[arg(long)]
    pub profile: bool,
}

/// One line of a `--requests` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestLine {
    messages: Option<Vec<Message>>,
    prompt: Option<String>,
    json_schema: Option<serde_json::Value>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    seed: Option<u64>,
    #[serde(default)]
    stop: Vec<String>,
    tag: Option<String>,
}

/// One line of output.
#[derive(Serialize)]
struct ResponseLine<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    response: Option<&'a Response>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let schema = match &args.schema {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading schema {}", path.display()))?;
            Some(
                serde_json::from_str::<serde_json::Value>(&text).with_context(|| {
                    format!(
                        "{} is not JSON (fix the file or pass another with --schema)",
                        path.display()
                    )
                })?,
            )
        }
    };
    let requests: Vec<Request> = match &args.requests {
        Some(path) => read_requests(path, &args, sampling)?,
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
            (0..args.n)
                .map(|i| {
                    let seed = if args.n == 1 {
                        args.seed
                    } else {
                        throng::seed::derive(args.seed, &[i as u64])
                    };
                    let mut r = Request::new(prompt.clone())
                        .with_max_tokens(args.max_tokens)
                        .with_sampling(SamplingParams { seed, ..sampling });
                    r.json_schema = schema.clone();
                    r
                })
                .collect()
        }
    };
    let (mut engine, _) = args.model.load_engine_with(args.profile)?;
    let json_lines = schema.is_some() || args.n > 1 || args.requests.is_some();
    let started = Instant::now();
    let results = if json_lines {
        engine.generate(requests.clone())
    } else {
        let mut stdout = std::io::stdout();
        let results = engine.generate_with(requests.clone(), |_, text| {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        });
        println!();
        results
    };
    let wall = started.elapsed();
    if json_lines {
        let mut out = std::io::stdout().lock();
        for (index, (result, request)) in results.iter().zip(&requests).enumerate() {
            let line = ResponseLine {
                index,
                seed: Some(request.sampling.seed),
                response: result.as_ref().ok(),
                error: result.as_ref().err().map(RequestError::to_string),
            };
            serde_json::to_writer(&mut out, &line)?;
            writeln!(out)?;
        }
    } else if let Some(Ok(r)) = results.first() {
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
    } else if let Some(Err(e)) = results.first() {
        bail!("the request failed: {e}");
    }
    eprintln!("{}", summary(&engine, results.len(), wall));
    if let Some(profile) = engine.model().profile() {
        eprintln!("throng: forward pass profile\n{}", profile.table());
    }
    Ok(())
}

fn read_requests(
    path: &PathBuf,
    args: &GenerateArgs,
    sampling: SamplingParams,
) -> Result<Vec<Request>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut requests = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: RequestLine = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}: not a valid request", path.display(), i + 1))?;
        let prompt = match (r.messages, r.prompt) {
            (Some(messages), None) => Prompt::Messages(messages),
            (None, Some(text)) => Prompt::Text(text),
            _ => bail!(
                "{} line {}: give either `messages` or `prompt`",
                path.display(),
                i + 1
            ),
        };
        let mut request = Request::new(prompt)
            .with_max_tokens(r.max_tokens.unwrap_or(args.max_tokens))
            .with_sampling(SamplingParams {
                temperature: r.temperature.unwrap_or(sampling.temperature),
                top_p: r.top_p.unwrap_or(sampling.top_p),
                top_k: r.top_k.or(sampling.top_k),
                seed: r
                    .seed
                    .unwrap_or_else(|| throng::seed::derive(sampling.seed, &[i as u64])),
            });
        request.json_schema = r.json_schema;
        request.stop = r.stop;
        request.tag = r.tag;
        requests.push(request);
    }
    Ok(requests)
}

/// One line on what the engine did: throughput, prefix cache, where the time went.
pub fn summary(engine: &Engine, requests: usize, wall: Duration) -> String {
    let t = engine.totals();
    let secs = wall.as_secs_f64().max(1e-9);
    let busy = (t.forward + t.masks + t.sampling).as_secs_f64().max(1e-9);
    let masks = match (
        engine.mask_time_quantile(0.5),
        engine.mask_time_quantile(0.99),
    ) {
        (Some(p50), Some(p99)) => format!(
            ", p50 {:.0}us, p99 {:.0}us",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        ),
        _ => String::new(),
    };
    format!(
        "throng: {requests} requests in {secs:.2}s ({:.1}/s); prompt {} tokens, prefix-cache hits {:.0}%; \
         generated {} tokens ({:.1}/s, {} forced by grammars); {} steps, {:.1} tokens/step; \
         forward {:.2}s, masks {:.3}s ({} masks{masks}), sampling {:.3}s ({:.1}% of step time on masks and \
         sampling); {} preemptions",
        requests as f64 / secs,
        t.prompt_tokens,
        100.0 * t.prefix_hit_rate(),
        t.generated_tokens + t.forced_tokens,
        (t.generated_tokens + t.forced_tokens) as f64 / secs,
        t.forced_tokens,
        t.steps,
        (t.prefill_tokens + t.generated_tokens) as f64 / t.steps.max(1) as f64,
        t.forward.as_secs_f64(),
        t.masks.as_secs_f64(),
        t.num_masks,
        t.sampling.as_secs_f64(),
        100.0 * (t.masks + t.sampling).as_secs_f64() / busy,
        t.preemptions,
    )
}
