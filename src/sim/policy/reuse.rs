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
use crate::record::store::{Reader, Source, StoredReply};

/// The stores a run reads replies from.
#[derive(Default)]
pub struct Reuse {
    sources: Vec<(Source, Reader)>,
    /// Decisions taken from the sources so far.
    pub reused: u64,
    /// Why a source stopped being read mid-run (a damaged entry), once per source.
    pub warnings: Vec<String>,
}

impl Reuse {
    /// Reads replies from `sources`, in order.
    pub fn new(sources: Vec<Source>) -> Result<Self, RecordError> {
        let sources = sources
            .into_iter()
            .map(|s| {
                let reader = s.reader()?;
                Ok((s, reader))
            })
            .collect::<Result<_, RecordError>>()?;
        Ok(Self {
            sources,
            ..Self::default()
        })
    }

    /// The run folders read from.
    pub fn source_dirs(&self) -> impl Iterator<Item = &std::path::Path> {
        self.sources.iter().map(|(s, _)| s.dir.as_path())
    }

    /// The reply an earlier run recorded under `key`, as the engine's response. A source
    /// whose entry does not decode is damaged: it is dropped, with a warning, and never read
    /// again.
    pub fn lookup(&mut self, key: &RequestKey) -> Option<Response> {
        let mut damaged = None;
        let mut found = None;
        for (i, (source, reader)) in self.sources.iter().enumerate() {
            match reader.get(key) {
                Ok(Some(reply)) => {
                    found = Some(reply);
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    damaged = Some((
                        i,
                        format!("{}: {e}; not read further", source.dir.display()),
                    ));
                    break;
                }
            }
        }
        if let Some((i, warning)) = damaged {
            self.sources.remove(i);
            self.warnings.push(warning);
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
