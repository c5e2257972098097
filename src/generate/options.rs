//! What `generate` is asked to do, with no command line in it.

use crate::engine::{Prompt, SamplingParams};
use std::path::PathBuf;

/// Where the requests of a run come from.
pub enum Requests {
    /// One prompt, run `n` times: copy i seeded with `derive(seed, i)` when `n > 1`; with a
    /// JSON schema the reply must satisfy.
    Prompt {
        prompt: Prompt,
        schema: Option<serde_json::Value>,
        n: usize,
    },
    /// A JSON Lines file of requests (`messages`, through the chat template, or `prompt`, raw
    /// text without it; optional `json_schema`, `max_tokens`, `temperature`, `top_p`,
    /// `top_k`, `seed`, `stop`, `tag`).
    File(PathBuf),
    /// The same, read from standard input as requests arrive, so that another program can
    /// drive one process as a coprocess (write a request, read its response, write the next)
    /// and keep its prefix cache from call to call.
    Stdin,
}

/// A run of `generate`.
pub struct GenerateOptions {
    pub requests: Requests,
    /// The default of every request (a line of a requests file may set its own).
    pub max_tokens: usize,
    /// The default of every request (a line of a requests file may set its own).
    pub sampling: SamplingParams,
    /// Write each response as soon as it is done, in completion order (each line carries its
    /// request's `index` and `tag`), instead of in input order.
    pub unordered: bool,
}
