//! Errors as OpenAI's clients expect them: a status and `{"error": {"message", "type",
//! "param", "code"}}`, so that the `openai` package raises the exception a framework catches
//! (`BadRequestError`, `AuthenticationError`, `RateLimitError`...) with throng's words in it.

use crate::engine::{RequestError, SchemaError};
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A refused or failed API request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiFailure {
    pub status: StatusCode,
    pub message: String,
    /// Where in the request the problem is (`messages[2].role`, `response_format`).
    pub param: Option<String>,
    /// A machine-readable reason (`context_length_exceeded`, `model_not_found`).
    pub code: Option<&'static str>,
    /// Seconds a client should wait before trying again (429).
    pub retry_after: Option<u64>,
}

impl ApiFailure {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A mistake in the request (400).
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message).at(param)
    }

    /// `value` read as a `T`, or a 400 naming the field it fails at (`max_tokens`,
    /// `messages[1].role`) as its `param` and in its message.
    pub fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, Self> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match path.as_str() {
                "." | "" => Self::invalid_body(format!("the request body: {inner}")),
                _ => Self::invalid(path.clone(), format!("`{path}`: {inner}")),
            }
        })
    }

    /// A body that is not a request at all (no one field to blame).
    fn invalid_body(message: String) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn at(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// OpenAI's error type for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "invalid_api_key",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_exceeded",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The error object, as an SSE event carries it after a stream began.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The engine's refusal of a request, at the part of the request it is about.
impl ApiFailure {
    /// A schema the decoder cannot take, blamed on `param`, the part of the request it came
    /// from (`response_format`, `tools`).
    pub(crate) fn schema(param: &str, e: SchemaError) -> Self {
        let code = match e {
            SchemaError::Limit(_) => "schema_too_large",
            SchemaError::Setup(_) => {
                return ApiFailure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
            }
            _ => "invalid_schema",
        };
        ApiFailure::invalid(param, format!("the JSON schema cannot be used: {e}")).code(code)
    }
}

impl From<RequestError> for ApiFailure {
    fn from(e: RequestError) -> Self {
        let message = e.to_string();
        match e {
            RequestError::EmptyMessages | RequestError::EmptyPrompt => {
                ApiFailure::invalid("messages", message)
            }
            RequestError::UnknownRole { .. } | RequestError::Template(_) => {
                ApiFailure::invalid("messages", message)
            }
            RequestError::PromptTooLong { .. } | RequestError::PromptTextTooLong { .. } => {
                ApiFailure::invalid("messages", message).code("context_length_exceeded")
            }
            RequestError::PromptExceedsCache { .. } => {
                ApiFailure::invalid("messages", message).code("context_length_exceeded")
            }
            RequestError::InvalidSchema(e) => ApiFailure::schema("response_format", e),
            RequestError::InvalidSampling(problem) => {
                // The problem starts with the field it is about.
                let field = [
                    "logit_bias",
                    "frequency_penalty",
                    "presence_penalty",
                    "top_logprobs",
                    "top_p",
                    "top_k",
                ]
                .into_iter()
                .find(|f| problem.starts_with(f))
                .unwrap_or("temperature");
                ApiFailure::invalid(field, message)
            }
            RequestError::ZeroMaxTokens => ApiFailure::invalid("max_tokens", message),
            RequestError::Tokenizer(_) => ApiFailure::invalid("messages", message),
            RequestError::Engine(_) => ApiFailure::new(StatusCode::INTERNAL_SERVER_ERROR, message),
        }
    }
}
