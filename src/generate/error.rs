//! Why a run of `generate` stopped.

use crate::engine::RequestError;
use crate::engine::jsonl::RequestLineError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("reading schema {}", path.display())]
    ReadSchema {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not JSON (fix the file or pass another with --schema)", path.display())]
    SchemaNotJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("opening {}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Reading the requests file (or standard input) failed.
    #[error("reading {name}")]
    Read {
        name: String,
        source: std::io::Error,
    },
    #[error("nothing to generate")]
    Nothing,
    /// The one request of a prompt is not one the engine can run.
    #[error(transparent)]
    Invalid(#[from] RequestLineError),
    /// The one request of a prompt failed in the engine.
    #[error("the request failed: {0}")]
    Failed(RequestError),
    /// Writing the output failed (a closed pipe, a full disk): the cause stays in the chain,
    /// so that a caller can tell a reader gone away from a real failure.
    #[error("{0}")]
    Write(#[from] std::io::Error),
}
