//! A stream of requests through the engine, a window at a time, each response written as a
//! JSON line as soon as it (and, unless unordered, every earlier one) is done.

use super::error::GenerateError;
use super::source::{Pull, Source};
use crate::engine::jsonl::response_line;
use crate::engine::{Client, Engine, Fill, Queue, RequestError, Response};
use std::collections::BTreeMap;
use std::io::Write;

/// How a stream of requests ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Requests read (every line that was not blank).
    pub total: usize,
    /// Their lines that carry `error`.
    pub failed: usize,
}

/// Runs every request of `source` through the engine, a window at a time, writing each
/// response line to `out` as soon as it (and, unless `unordered`, every earlier one) is done,
/// and flushing, so that a killed batch keeps what it finished.
pub(super) fn stream(
    engine: &mut Engine,
    source: &mut Source,
    unordered: bool,
    out: impl Write,
) -> Result<Counts, GenerateError> {
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
        out,
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

/// The requests of a batch, and their response lines on their way to the output.
struct Batch<'a, W> {
    source: &'a mut Source,
    unordered: bool,
    out: W,
    /// Finished lines waiting for an earlier one, by index.
    ready: BTreeMap<usize, String>,
    next_out: usize,
    total: usize,
    failed: usize,
    bar: indicatif::ProgressBar,
}

impl<W: Write> Batch<'_, W> {
    /// Writes a finished line, or keeps it until every earlier one is written.
    fn write(&mut self, index: usize, line: String, ok: bool) -> Result<(), GenerateError> {
        self.failed += (!ok) as usize;
        self.bar.inc(1);
        if self.unordered {
            writeln!(self.out, "{line}")?;
        } else {
            self.ready.insert(index, line);
        }
        while let Some(l) = self.ready.remove(&self.next_out) {
            writeln!(self.out, "{l}")?;
            self.next_out += 1;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), GenerateError> {
        self.out.flush()?;
        if self.failed > 0 {
            self.bar.set_message(format!("{} failed", self.failed));
        }
        Ok(())
    }
}

impl<W: Write> Client for Batch<'_, W> {
    type Key = Line;
    type Error = GenerateError;

    fn fill(&mut self, queue: &mut Queue<'_, Line>) -> Result<Fill, GenerateError> {
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
            let submitted = item.request.map_err(|e| e.to_string()).and_then(|r| {
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

    fn finished(
        &mut self,
        key: Line,
        result: Result<Response, RequestError>,
    ) -> Result<(), GenerateError> {
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

    fn stepped(&mut self, _finished: usize) -> Result<(), GenerateError> {
        self.flush()
    }
}
