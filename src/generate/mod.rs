//! `generate`: one prompt streamed, N seeded copies, or a JSON Lines batch of requests (from a
//! file or standard input) through one engine, as an offline batch-inference tool. The
//! library does the work; `throng generate` only turns its arguments into [`GenerateOptions`] and
//! prints what comes back.

mod batch;
mod error;
mod options;
mod source;

pub use batch::Counts;
pub use error::GenerateError;
pub use options::{GenerateOptions, Requests};
pub use source::Source;

use crate::engine::{Engine, Response};
use source::Pull;
use std::io::Write;
use std::path::Path;

/// How a run ended.
#[derive(Debug)]
pub enum Outcome {
    /// One prompt's reply, its text streamed as it was generated.
    One(Option<Box<Response>>),
    /// JSON Lines, one per request.
    Lines(Counts),
}

/// A JSON schema file, read.
pub(crate) fn read_schema(path: &Path) -> Result<serde_json::Value, GenerateError> {
    let text = std::fs::read_to_string(path).map_err(|source| GenerateError::ReadSchema {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| GenerateError::SchemaNotJson {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs the requests of `source` through `engine`, writing to `out` either the one reply's
/// text as it is generated or, when [`Source::json_lines`], one JSON line per request
/// (in input order, unless `unordered`).
pub fn run(
    engine: &mut Engine,
    source: &mut Source,
    unordered: bool,
    out: impl Write,
) -> Result<Outcome, GenerateError> {
    if source.json_lines() {
        batch::stream(engine, source, unordered, out).map(Outcome::Lines)
    } else {
        one(engine, source, out).map(|r| Outcome::One(r.map(Box::new)))
    }
}

/// The one request of a prompt, its reply streamed to `out` as it is generated.
fn one(
    engine: &mut Engine,
    source: &mut Source,
    mut out: impl Write,
) -> Result<Option<Response>, GenerateError> {
    let Pull::Item(item) = source.next_item(true)? else {
        return Err(GenerateError::Nothing);
    };
    let request = item.request.map_err(GenerateError::Invalid)?;
    let mut write_error = None;
    let results = engine.generate_with(vec![request], |_, text| {
        if write_error.is_none()
            && let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush())
        {
            write_error = Some(e);
        }
    });
    if let Some(e) = write_error {
        return Err(e.into());
    }
    writeln!(out)?;
    out.flush()?;
    match results.into_iter().next() {
        Some(Ok(r)) => Ok(Some(r)),
        Some(Err(e)) => Err(GenerateError::Failed(e)),
        None => Ok(None),
    }
}
