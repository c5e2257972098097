//! The body of every refusal the server answers: `{"error": "..."}` under its status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// `words` as a JSON error under `status`.
pub fn error(status: StatusCode, words: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": words.to_string() }))).into_response()
}
