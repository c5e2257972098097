//! The requests of a run, made one at a time as the engine has room for them: copies of one
//! prompt, or the lines of a requests file or of standard input.

use super::error::GenerateError;
use super::options::{GenerateOptions, Requests};
use crate::engine::jsonl::{RequestLineError, request_from_json};
use crate::engine::{Request, SamplingParams, Schema};
use std::io::BufRead;

/// Lines of standard input read ahead of the engine at most.
const STDIN_AHEAD: usize = 1024;

/// A request to run, or why its line could not become one.
pub(super) struct Item {
    pub(super) index: usize,
    pub(super) request: Result<Request, RequestLineError>,
    pub(super) tag: Option<String>,
    /// Where it was read (`requests.jsonl line 3`), for the errors the engine finds in it.
    pub(super) at: Option<String>,
}

/// What a [`Source`] has for the engine next.
pub(super) enum Pull {
    Item(Box<Item>),
    /// Nothing yet (standard input has not sent the next line); more may come.
    Later,
    /// Nothing more will come.
    End,
}

/// Where the lines of a requests file come from.
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
pub struct Source(Kind);

enum Kind {
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
    /// The requests `options` name: a requests file (opened now, so that a missing one is
    /// reported before a model loads), standard input, or copies of one prompt.
    pub fn open(options: &GenerateOptions) -> Result<Self, GenerateError> {
        let file = |name: String, lines: Lines| Kind::File {
            name,
            lines,
            line: 0,
            index: 0,
            max_tokens: options.max_tokens,
            sampling: options.sampling,
        };
        Ok(Source(match &options.requests {
            Requests::Stdin => file("stdin".to_string(), Lines::stdin(STDIN_AHEAD)),
            Requests::File(path) => {
                let opened = std::fs::File::open(path).map_err(|source| GenerateError::Open {
                    path: path.clone(),
                    source,
                })?;
                let lines = Lines::File(std::io::BufReader::new(opened).split(b'\n'));
                file(path.display().to_string(), lines)
            }
            Requests::Prompt { prompt, schema, n } => {
                let mut template = Request::new(prompt.clone())
                    .with_max_tokens(options.max_tokens)
                    .with_sampling(options.sampling);
                template.json_schema = schema.clone().map(Schema::new);
                Kind::Copies {
                    template,
                    n: *n,
                    next: 0,
                    seed: options.sampling.seed,
                }
            }
        }))
    }

    /// Whether the replies are JSON Lines (a schema, copies, a requests file) rather than one
    /// reply's text streamed as it is generated.
    pub fn json_lines(&self) -> bool {
        match &self.0 {
            Kind::Copies { template, n, .. } => *n > 1 || template.json_schema.is_some(),
            Kind::File { .. } => true,
        }
    }

    /// The next request; with `wait`, waits for standard input's next line rather than say
    /// [`Pull::Later`].
    pub(super) fn next_item(&mut self, wait: bool) -> Result<Pull, GenerateError> {
        match &mut self.0 {
            Kind::Copies {
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
            Kind::File {
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
                let mut bytes = bytes.map_err(|source| GenerateError::Read {
                    name: name.clone(),
                    source,
                })?;
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
    let tag = tag_of(&String::from_utf8_lossy(bytes));
    Item {
        index,
        request: Err(RequestLineError::NotUtf8 {
            at: format!("{name} line {line}"),
            byte: bytes[at],
            column: at + 1,
        }),
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
    let tag = tag_of(text);
    Item {
        index,
        request: request_from_json(text, index, &at, max_tokens, sampling),
        tag,
        at: Some(at),
    }
}

/// The `tag` a line of a requests file says, when it is JSON with a text `tag`: an error line
/// carries it, so that its writer can match the error to its request.
fn tag_of(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value.get("tag")?.as_str().map(str::to_string)
}
