//! Decisions taken from earlier runs instead of the model (`throng run --reuse`). This run's
//! own replies reach its store through the decisions' traces, which carry their request keys
//! (the recorder keeps them, every rank's).
//!
//! A request's reply is a function of its complete input (the engine's
//! [`crate::engine::RequestKey`]: model identity, prompt tokens, schema, sampling, seed), so
//! a request whose key an earlier run's store holds gets that run's reply, token for token,
//! and the decision, history and records that follow from it are those of a fresh run. The
//! stores are the run folders' `decisions.redb` ([`crate::record::store`]).

use crate::engine::{FinishReason, RequestKey, Response, Timings};
use crate::record::RecordError;
use crate::record::store::{Lookup, Reader, Source, StoredReply};

/// The stores a run reads replies from.
#[derive(Default)]
pub struct Reuse {
    sources: Vec<(Source, Reader)>,
    /// Per source: the entries found damaged (their checksum failed) and computed again.
    damaged: Vec<u64>,
    /// Decisions taken from the sources so far.
    pub reused: u64,
    /// Why a source stopped being read mid-run (redb could not read it), once per source.
    dropped: Vec<String>,
}

impl Reuse {
    /// Reads replies from `sources`, in order.
    pub fn new(sources: Vec<Source>) -> Result<Self, RecordError> {
        let sources: Vec<(Source, Reader)> = sources
            .into_iter()
            .map(|s| {
                let reader = s.reader()?;
                Ok((s, reader))
            })
            .collect::<Result<_, RecordError>>()?;
        Ok(Self {
            damaged: vec![0; sources.len()],
            sources,
            ..Self::default()
        })
    }

    /// What went wrong while reading the sources: each source that could not be read any
    /// more, and each one's damaged entries.
    pub fn warnings(&self) -> Vec<String> {
        let damaged = self
            .sources
            .iter()
            .zip(&self.damaged)
            .filter(|&(_, &n)| n > 0)
            .map(|((source, _), n)| {
                format!(
                    "{}: {n} stored repl{} failed {} checksum (the store was damaged after it \
                     was written) and {} asked of the model again instead",
                    source.dir.display(),
                    if *n == 1 { "y" } else { "ies" },
                    if *n == 1 { "its" } else { "their" },
                    if *n == 1 { "was" } else { "were" },
                )
            });
        self.dropped.iter().cloned().chain(damaged).collect()
    }

    /// The run folders read from.
    pub fn source_dirs(&self) -> impl Iterator<Item = &std::path::Path> {
        self.sources.iter().map(|(s, _)| s.dir.as_path())
    }

    /// The reply an earlier run recorded under `key`, as the engine's response. An entry
    /// whose checksum fails is not trusted (counted for a warning; the next source is
    /// searched, and then the model asked); a source redb cannot read is dropped, with a
    /// warning, and never read again.
    pub fn lookup(&mut self, key: &RequestKey) -> Option<Response> {
        let mut unreadable = None;
        let mut found = None;
        for (i, (source, reader)) in self.sources.iter().enumerate() {
            match reader.get(key) {
                Ok(Lookup::Hit(reply)) => {
                    found = Some(reply);
                    break;
                }
                Ok(Lookup::Miss) => {}
                Ok(Lookup::Damaged) => self.damaged[i] += 1,
                Err(e) => {
                    unreadable = Some((
                        i,
                        format!("{}: {e}; not read further", source.dir.display()),
                    ));
                    break;
                }
            }
        }
        if let Some((i, warning)) = unreadable {
            self.sources.remove(i);
            self.damaged.remove(i);
            self.dropped.push(warning);
            return self.lookup(key);
        }
        let reply = found?;
        self.reused += 1;
        Some(response(reply))
    }
}

/// A recorded reply as the engine would have given it: the same text, value and token
/// counts; its whole prompt counts as cached, and it took no time.
fn response(reply: StoredReply) -> Response {
    let finish_reason = match reply.stopped {
        true => FinishReason::Stop,
        false => FinishReason::Length,
    };
    // As the engine parses a constrained reply that stopped (every policy request has a
    // schema); a reply that does not parse is the engine's error, and the policy's fallback.
    let value = match finish_reason {
        FinishReason::Stop => serde_json::from_str(&reply.text).ok(),
        FinishReason::Length => None,
    };
    Response {
        value,
        finish_reason,
        prompt_tokens: reply.prompt_tokens as usize,
        cached_tokens: reply.prompt_tokens as usize,
        generated_tokens: reply.generated_tokens as usize,
        token_ids: Vec::new(),
        timings: Timings::default(),
        tag: None,
        text: reply.text,
    }
}
