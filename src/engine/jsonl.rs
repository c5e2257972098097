//! Requests and responses as JSON Lines, as `throng generate --requests` reads and writes
//! them (also for programs that embed throng, such as the Python package).

use super::{Message, Prompt, Request, Response, SamplingParams, Schema};
use serde::{Deserialize, Serialize};

/// One line of a `--requests` file. `messages` go through the model's chat template;
/// `prompt` is raw text, tokenized as it is (no template), unlike `--prompt`.
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

/// Why a line of a `--requests` file is no request; `at` names the line
/// (`requests.jsonl line 3`).
#[derive(Debug, thiserror::Error)]
pub enum RequestLineError {
    #[error("{at}: not a valid request: {source}")]
    NotARequest {
        at: String,
        source: serde_json::Error,
    },
    #[error("{at}: give either `messages` or `prompt`")]
    NoPrompt { at: String },
    #[error(
        "{at}: not valid UTF-8 (byte 0x{byte:02x} at column {column}): a requests file is JSON \
         Lines, which must be UTF-8; re-save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
    )]
    NotUtf8 { at: String, byte: u8, column: usize },
}

/// One line of output.
#[derive(Serialize)]
struct ResponseLine<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    response: Option<&'a Response>,
    /// The request's tag, on error lines (a response carries its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    tag: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A request from one line of a `--requests` file, as `throng generate` reads it (also for
/// programs that embed throng, such as the Python package). `index` is its place: a request
/// without a `seed` gets `derive(sampling.seed, index)`. `at` names it in errors
/// (`requests.jsonl line 3`); `max_tokens` and `sampling` are the defaults.
pub fn request_from_json(
    text: &str,
    index: usize,
    at: &str,
    max_tokens: usize,
    sampling: SamplingParams,
) -> Result<Request, RequestLineError> {
    let r: RequestLine =
        serde_json::from_str(text).map_err(|source| RequestLineError::NotARequest {
            at: at.to_string(),
            source,
        })?;
    let prompt = match (r.messages, r.prompt) {
        (Some(messages), None) => Prompt::Messages(messages),
        (None, Some(text)) => Prompt::Text(text),
        _ => return Err(RequestLineError::NoPrompt { at: at.to_string() }),
    };
    let mut request = Request::new(prompt)
        .with_max_tokens(r.max_tokens.unwrap_or(max_tokens))
        .with_sampling(SamplingParams {
            temperature: r.temperature.unwrap_or(sampling.temperature),
            top_p: r.top_p.unwrap_or(sampling.top_p),
            top_k: r.top_k.or(sampling.top_k),
            seed: r
                .seed
                .unwrap_or_else(|| crate::seed::derive(sampling.seed, &[index as u64])),
        });
    request.json_schema = r.json_schema.map(Schema::new);
    request.stop = r.stop;
    request.tag = r.tag;
    Ok(request)
}

/// The output line of request `index`, as `throng generate --requests` writes it: its seed
/// (once it became a request) and its response, or its error with the request's tag.
pub fn response_line(
    index: usize,
    seed: Option<u64>,
    result: Result<&Response, (String, Option<&str>)>,
) -> String {
    let (response, error, tag) = match result {
        Ok(r) => (Some(r), None, None),
        Err((e, tag)) => (None, Some(e), tag),
    };
    serde_json::to_string(&ResponseLine {
        index,
        seed,
        response,
        tag,
        error,
    })
    .expect("invariant: response lines serialise")
}
