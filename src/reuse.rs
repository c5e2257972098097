//! Replies taken from earlier runs' decision stores instead of the model (`throng run
//! --reuse`, `throng api --reuse`): the stores opened and checked against the engines that
//! would otherwise compute the replies, and looked up by request key.
//!
//! It stands between the engine, whose responses it gives, and the records, whose stores it
//! reads: the engine knows no run folder, and the records know no engine, so neither holds it.
//!
//! A request's reply is a function of its complete input (the engine's
//! [`RequestKey`]: model identity, prompt tokens, schema, sampling, seed), so
//! a request whose key an earlier run's store holds gets that run's reply, token for token,
//! and the decision, history and records that follow from it are those of a fresh run. The
//! stores are the run folders' `decisions.redb` ([`crate::record::store`]).

use crate::engine::{FinishReason, KnownReplies, ModelIdentity, RequestKey, Response, Timings};
use crate::record::RecordError;
use crate::record::store::{Lookup, Reader, Source, StoredReply};
use std::path::{Path, PathBuf};

/// Why stores cannot be reused.
#[derive(Debug, thiserror::Error)]
pub enum ReuseError {
    #[error(
        "--reuse {}: its decisions by {theirs} were computed as {} on {} with a {} KV cache, and \
         this run's by {ours} would be computed as {} on {} with a {} KV cache, which gives other \
         bits: none of them would be this run's decisions. Run with the weight format, kind of \
         device and KV format it used (--weights, --device, --kv-format), or drop --reuse {}",
        dir.display(), stored.format, stored.device, stored.kv, own.format, own.device, own.kv,
        dir.display()
    )]
    OtherComputation {
        dir: PathBuf,
        theirs: String,
        ours: String,
        stored: Box<ModelIdentity>,
        own: Box<ModelIdentity>,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// Stores opened for reuse, and what was left out of them.
pub struct Opened {
    pub reuse: Reuse,
    /// Stores that could not be opened, or whose replies no model here could give.
    pub warnings: Vec<String>,
}

/// Opens the stores of `dirs` for engines of `models` (each model's name and identity). A
/// store that is missing or damaged is left out with a warning; one whose replies another
/// weight format, class of device or KV format computed is refused, since none of them would
/// be these engines'.
pub fn open(dirs: &[PathBuf], models: &[(&str, &ModelIdentity)]) -> Result<Opened, ReuseError> {
    let mut sources = Vec::new();
    let mut warnings = Vec::new();
    for from in dirs {
        let source = match Source::open(from) {
            Ok(s) => s,
            Err(e) => {
                warnings.push(format!(
                    "--reuse {}: {e}; none of its decisions are reused",
                    from.display()
                ));
                continue;
            }
        };
        if !shares_a_model(&source, from, models)? {
            warnings.push(format!(
                "--reuse {}: its decisions were made by other weights ({}) than this run's \
                 ({}); none of them can be reused",
                from.display(),
                source.models.keys().cloned().collect::<Vec<_>>().join(", "),
                models
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        sources.push(source);
    }
    Ok(Opened {
        reuse: Reuse::new(sources)?,
        warnings,
    })
}

/// Whether `source` holds replies of one of `models`' weights; an error if it holds them as
/// another computation (format, device, KV type) made them.
fn shares_a_model(
    source: &Source,
    dir: &Path,
    models: &[(&str, &ModelIdentity)],
) -> Result<bool, ReuseError> {
    let mut shared = false;
    for (name, json) in &source.models {
        let Ok(identity) = serde_json::from_str::<ModelIdentity>(json) else {
            continue;
        };
        for (mine, own) in models {
            if identity.weights != own.weights {
                continue;
            }
            // A store from before the KV type was recorded (`kv` empty) has keys of another
            // scheme, which match nothing.
            let kv_differs = !identity.kv.is_empty() && identity.kv != own.kv;
            if identity.format != own.format || identity.device != own.device || kv_differs {
                return Err(ReuseError::OtherComputation {
                    dir: dir.to_path_buf(),
                    theirs: name.clone(),
                    ours: mine.to_string(),
                    stored: Box::new(identity),
                    own: Box::new((*own).clone()),
                });
            }
            shared = true;
        }
    }
    Ok(shared)
}

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
    pub(crate) fn warnings(&self) -> Vec<String> {
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
    pub(crate) fn source_dirs(&self) -> impl Iterator<Item = &std::path::Path> {
        self.sources.iter().map(|(s, _)| s.dir.as_path())
    }
}

impl KnownReplies for Reuse {
    /// The reply an earlier run recorded under `key`, as the engine's response. An entry
    /// whose checksum fails is not trusted (counted for a warning; the next source is
    /// searched, and then the model asked); a source redb cannot read is dropped, with a
    /// warning, and never read again.
    fn lookup(&mut self, key: &RequestKey) -> Option<Response> {
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
        token_ids: reply.token_ids,
        timings: Timings::default(),
        tag: None,
        text: reply.text,
        logprobs: None,
    }
}
