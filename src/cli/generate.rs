//! `throng generate`: one prompt streamed, N seeded copies, or a JSONL file of requests,
//! as an offline batch-inference tool.

use super::ModelArgs;
use super::numbers::{at_least_one, temperature, top_p};
use crate::engine::jsonl::{request_from_json, response_line};
use crate::engine::summary;
use crate::engine::{
    Client, Engine, Fill, Message, Prompt, Queue, Request, RequestError, Response, SamplingParams,
    Schema,
};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
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

/// A request to run, or why its line could not become one.
struct Item {
    index: usize,
    request: Result<Request, String>,
    tag: Option<String>,
    /// Where it was read (`requests.jsonl line 3`), for the errors the engine finds in it.
    at: Option<String>,
}

/// What a [`Source`] has for the engine next.
enum Pull {
    Item(Box<Item>),
    /// Nothing yet (standard input has not sent the next line); more may come.
    Later,
    /// Nothing more will come.
    End,
}

/// Where the lines of `--requests` come from.
enum Lines {
    /// A file, read as the engine has room: reading it never waits long.
    File(std::io::Split<std::io::BufReader<std::fs::File>>),
    /// Standard input, read on a thread of its own as lines arrive: a writer that pauses (it
    /// waits for a response before it writes the next request) must not stall the requests
    /// already in flight, nor be left waiting for responses to requests that never started.
    Stdin(std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>),
}

impl Lines {
    /// Standard input's lines, read on a thread that keeps at most `ahead` lines the engine
    /// has not taken, so that a large file piped in is not read into memory whole.
    fn stdin(ahead: usize) -> Self {
        let (tx, rx) = std::sync::mpsc::sync_channel(ahead.max(1));
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().split(b'\n') {
                let failed = line.is_err();
                if tx.send(line).is_err() || failed {
                    break;
                }
            }
        });
        Lines::Stdin(rx)
    }

    /// The next line; with `wait`, waits for it rather than say [`Next::Later`].
    fn next(&mut self, wait: bool) -> Next {
        match self {
            Lines::File(lines) => lines.next().map_or(Next::End, Next::Line),
            Lines::Stdin(rx) if wait => rx.recv().map_or(Next::End, Next::Line),
            Lines::Stdin(rx) => match rx.try_recv() {
                Ok(line) => Next::Line(line),
                Err(std::sync::mpsc::TryRecvError::Empty) => Next::Later,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => Next::End,
            },
        }
    }
}

/// A line of input, or why there is none.
enum Next {
    Line(std::io::Result<Vec<u8>>),
    Later,
    End,
}

/// The requests of a run, made one at a time as the engine has room for them.
enum Source {
    Copies {
        template: Request,
        n: usize,
        next: usize,
        seed: u64,
    },
    File {
        /// What error lines name: the file's path, or `stdin`.
        name: String,
        /// Read as bytes: a line that is not UTF-8 is an error of its own, not the end of
        /// the file.
        lines: Lines,
        line: usize,
        index: usize,
        max_tokens: usize,
        sampling: SamplingParams,
    },
}

impl Source {
    /// The next request; with `wait`, waits for standard input's next line rather than say
    /// [`Pull::Later`].
    fn next_item(&mut self, wait: bool) -> Result<Pull> {
        match self {
            Source::Copies {
                template,
                n,
                next,
                seed,
            } => {
                if *next >= *n {
                    return Ok(Pull::End);
                }
                let i = *next;
                *next += 1;
                let mut request = template.clone();
                if *n > 1 {
                    request.sampling.seed = crate::seed::derive(*seed, &[i as u64]);
                }
                Ok(Pull::Item(Box::new(Item {
                    index: i,
                    request: Ok(request),
                    tag: None,
                    at: None,
                })))
            }
            Source::File {
                name,
                lines,
                line,
                index,
                max_tokens,
                sampling,
            } => loop {
                let bytes = match lines.next(wait) {
                    Next::Line(bytes) => bytes,
                    Next::Later => return Ok(Pull::Later),
                    Next::End => return Ok(Pull::End),
                };
                *line += 1;
                let mut bytes = bytes.with_context(|| format!("reading {name}"))?;
                if bytes.last() == Some(&b'\r') {
                    bytes.pop();
                }
                let text = String::from_utf8(bytes);
                if text.as_ref().is_ok_and(|t| t.trim().is_empty()) {
                    continue;
                }
                let i = *index;
                *index += 1;
                return Ok(Pull::Item(Box::new(match text {
                    Ok(text) => parse_line(&text, i, *line, name, *max_tokens, *sampling),
                    Err(e) => not_utf8(&e, i, *line, name),
                })));
            },
        }
    }
}

/// A line of a requests file that is not UTF-8 (JSON must be): an error of its own, carrying
/// the line's `tag` when the rest of the line still says it.
fn not_utf8(e: &std::string::FromUtf8Error, index: usize, line: usize, name: &str) -> Item {
    let bytes = e.as_bytes();
    let at = e.utf8_error().valid_up_to();
    let tag = serde_json::from_str::<serde_json::Value>(&String::from_utf8_lossy(bytes))
        .ok()
        .and_then(|v| v.get("tag").and_then(|t| t.as_str()).map(str::to_string));
    Item {
        index,
        request: Err(format!(
            "{name} line {line}: not valid UTF-8 (byte 0x{:02x} at column {}): a requests file is \
             JSON Lines, which must be UTF-8; re-save the file as UTF-8 (e.g. `iconv -f latin1 -t \
             utf-8`)",
            bytes[at],
            at + 1
        )),
        tag,
        at: None,
    }
}

/// A request from one line of a requests file; a line that is not one becomes an error of
/// its own, carrying the line's `tag` when it has one.
fn parse_line(
    text: &str,
    index: usize,
    line: usize,
    name: &str,
    max_tokens: usize,
    sampling: SamplingParams,
) -> Item {
    let at = format!("{name} line {line}");
    let tag = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v.get("tag").and_then(|t| t.as_str()).map(str::to_string));
    Item {
        index,
        request: request_from_json(text, index, &at, max_tokens, sampling),
        tag,
        at: Some(at),
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let schema = schema_of(&args)?;
    let mut source = source_of(&args, sampling, &schema)?;
    let (mut engine, _) = args.model.settings().load_engine_with(args.profile)?;
    let json_lines = schema.is_some() || args.n > 1 || args.requests.is_some();
    let started = Instant::now();
    if !json_lines {
        stream_one(&mut engine, &mut source)?;
        eprintln!("{}", summary(&engine, 1, started.elapsed()));
    } else {
        let counts = stream(&mut engine, &mut source, args.unordered)?;
        eprintln!("{}", summary(&engine, counts.total, started.elapsed()));
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
    if let Some(profile) = engine.model().profile() {
        eprintln!("throng: forward pass profile\n{}", profile.table());
    }
    Ok(())
}

/// The JSON schema of `--schema`, read.
fn schema_of(args: &GenerateArgs) -> Result<Option<serde_json::Value>> {
    Ok(match &args.schema {
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
    })
}

/// Where the requests come from: a `--requests` file (or standard input), else copies of
/// `--prompt`.
fn source_of(
    args: &GenerateArgs,
    sampling: SamplingParams,
    schema: &Option<serde_json::Value>,
) -> Result<Source> {
    Ok(match &args.requests {
        Some(path) => {
            let (name, lines) = if path.as_os_str() == "-" {
                ("stdin".to_string(), Lines::stdin(STDIN_AHEAD))
            } else {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                let lines = Lines::File(std::io::BufReader::new(file).split(b'\n'));
                (path.display().to_string(), lines)
            };
            Source::File {
                name,
                lines,
                line: 0,
                index: 0,
                max_tokens: args.max_tokens,
                sampling,
            }
        }
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
            let mut template = Request::new(prompt)
                .with_max_tokens(args.max_tokens)
                .with_sampling(sampling);
            template.json_schema = schema.clone().map(Schema::new);
            Source::Copies {
                template,
                n: args.n,
                next: 0,
                seed: args.seed,
            }
        }
    })
}

/// The one request of `--prompt`, its reply streamed to standard output as it is generated.
fn stream_one(engine: &mut Engine, source: &mut Source) -> Result<()> {
    let Pull::Item(item) = source.next_item(true)? else {
        bail!("nothing to generate");
    };
    let request = item.request.map_err(anyhow::Error::msg)?;
    let mut stdout = std::io::stdout();
    let mut write_error = None;
    let results = engine.generate_with(vec![request], |_, text| {
        if write_error.is_none()
            && let Err(e) = stdout
                .write_all(text.as_bytes())
                .and_then(|_| stdout.flush())
        {
            write_error = Some(e);
        }
    });
    if let Some(e) = write_error {
        return Err(e.into());
    }
    out!()?;
    match results.into_iter().next() {
        Some(Ok(r)) => {
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
        Some(Err(e)) => bail!("the request failed: {e}"),
        None => {}
    }
    Ok(())
}

/// Lines of standard input read ahead of the engine at most.
const STDIN_AHEAD: usize = 1024;

/// How a stream of requests ended.
struct Counts {
    total: usize,
    failed: usize,
}

/// Runs every request of `source` through the engine, a window at a time, writing each
/// response line as soon as it (and, unless `unordered`, every earlier one) is done, and
/// flushing, so that a killed batch keeps what it finished.
fn stream(engine: &mut Engine, source: &mut Source, unordered: bool) -> Result<Counts> {
    // Requests in flight at most: enough to fill the batch, few enough to bound memory.
    let window = 4 * engine.max_seqs().max(64);
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {pos} answered, {per_sec} [{elapsed_precise}] {msg}",
        )
        .expect("invariant: a valid template"),
    );
    let mut batch = Batch {
        source,
        unordered,
        stdout: std::io::stdout().lock(),
        ready: BTreeMap::new(),
        next_out: 0,
        total: 0,
        failed: 0,
        bar,
    };
    engine.run(window, &mut batch)?;
    batch.bar.finish_and_clear();
    Ok(Counts {
        total: batch.total,
        failed: batch.failed,
    })
}

/// A request in the engine: its index in the input and its seed, for its line, and where it
/// was read, for its error.
struct Line {
    index: usize,
    seed: u64,
    at: Option<String>,
}

/// `error`, prefixed with where its request was read (`requests.jsonl line 3: ...`).
fn located(at: Option<&str>, error: String) -> String {
    match at {
        Some(at) => format!("{at}: {error}"),
        None => error,
    }
}

/// The requests of a batch, and their response lines on their way to stdout.
struct Batch<'a> {
    source: &'a mut Source,
    unordered: bool,
    stdout: std::io::StdoutLock<'static>,
    /// Finished lines waiting for an earlier one, by index.
    ready: BTreeMap<usize, String>,
    next_out: usize,
    total: usize,
    failed: usize,
    bar: indicatif::ProgressBar,
}

impl Batch<'_> {
    /// Writes a finished line, or keeps it until every earlier one is written.
    fn write(&mut self, index: usize, line: String, ok: bool) -> Result<()> {
        self.failed += (!ok) as usize;
        self.bar.inc(1);
        if self.unordered {
            writeln!(self.stdout, "{line}")?;
        } else {
            self.ready.insert(index, line);
        }
        while let Some(l) = self.ready.remove(&self.next_out) {
            writeln!(self.stdout, "{l}")?;
            self.next_out += 1;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.stdout.flush()?;
        if self.failed > 0 {
            self.bar.set_message(format!("{} failed", self.failed));
        }
        Ok(())
    }
}

impl Client for Batch<'_> {
    type Key = Line;
    type Error = anyhow::Error;

    fn fill(&mut self, queue: &mut Queue<'_, Line>) -> Result<Fill> {
        let mut wrote = false;
        let fill = loop {
            if queue.room() == 0 {
                break Fill::More;
            }
            // With nothing in flight there is nothing to do but wait for the next request;
            // the error lines written so far go out first, as their writer may be waiting
            // for them before it writes more.
            let wait = queue.idle();
            if wait && wrote {
                self.flush()?;
                wrote = false;
            }
            let item = match self.source.next_item(wait)? {
                Pull::Item(item) => *item,
                Pull::Later => break Fill::More,
                Pull::End => break Fill::Done,
            };
            self.total += 1;
            let seed = item.request.as_ref().ok().map(|r| r.sampling.seed);
            let key = Line {
                index: item.index,
                seed: seed.unwrap_or_default(),
                at: item.at.clone(),
            };
            // The engine's refusals (an unknown chat role, a prompt too long) name the line.
            let submitted = item.request.and_then(|r| {
                queue
                    .submit(key, r)
                    .map_err(|refused| located(item.at.as_deref(), refused.error.to_string()))
            });
            if let Err(e) = submitted {
                let l = response_line(item.index, seed, Err((e, item.tag.as_deref())));
                self.write(item.index, l, false)?;
                wrote = true;
            }
        };
        if wrote {
            self.flush()?;
        }
        Ok(fill)
    }

    fn finished(&mut self, key: Line, result: Result<Response, RequestError>) -> Result<()> {
        let l = match &result {
            Ok(r) => response_line(key.index, Some(key.seed), Ok(r)),
            Err(e) => response_line(
                key.index,
                Some(key.seed),
                Err((located(key.at.as_deref(), e.to_string()), None)),
            ),
        };
        self.write(key.index, l, result.is_ok())
    }

    fn stepped(&mut self, _finished: usize) -> Result<()> {
        self.flush()
    }
}
