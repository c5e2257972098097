//! throng's errors as Python exceptions: one class per kind a caller may want to catch, each
//! carrying throng's own message (the problem and its fix), causes included.

use pyo3::PyErr;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use throng::engine::RequestError as EngineRequestError;

create_exception!(
    _throng,
    ThrongError,
    PyException,
    "Every error throng raises."
);
create_exception!(
    _throng,
    ModelError,
    ThrongError,
    "A model that cannot be found or loaded (unknown name, missing or corrupt file)."
);
create_exception!(
    _throng,
    RequestError,
    ThrongError,
    "A request the engine refused or could not finish."
);
create_exception!(
    _throng,
    SchemaError,
    RequestError,
    "A JSON schema the constrained decoder cannot compile."
);
create_exception!(
    _throng,
    PromptTooLongError,
    RequestError,
    "A prompt longer than the model's context or the KV cache."
);
create_exception!(
    _throng,
    ConfigError,
    ThrongError,
    "A malformed experiment config or bad run arguments."
);
create_exception!(
    _throng,
    RunError,
    ThrongError,
    "A run that stopped on an error (its finished steps are kept)."
);

/// `e`'s message with its chain of causes, as the command line prints it: a cause whose words
/// the message above already gave is not repeated.
pub fn message(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    let mut said = text.clone();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !said.contains(&cause) {
            text.push_str("\n  caused by: ");
            text.push_str(&cause);
        }
        said = cause;
    }
    text
}

/// A failed run or load as the exception of its kind.
pub fn from_anyhow(e: anyhow::Error) -> PyErr {
    let text = message(&e);
    let config = e.chain().any(|c| {
        c.downcast_ref::<throng::sim::config::ConfigError>()
            .is_some()
    });
    let model = e
        .chain()
        .any(|c| c.downcast_ref::<throng::model::ModelError>().is_some());
    if config {
        ConfigError::new_err(text)
    } else if model {
        ModelError::new_err(text)
    } else {
        RunError::new_err(text)
    }
}

/// A refused or failed request as the exception of its kind; `at` says which request.
pub fn from_request(at: &str, e: &EngineRequestError) -> PyErr {
    let text = format!("{at}: {e}");
    match e {
        EngineRequestError::InvalidSchema(_) => SchemaError::new_err(text),
        EngineRequestError::PromptTooLong { .. }
        | EngineRequestError::PromptExceedsCache { .. } => PromptTooLongError::new_err(text),
        _ => RequestError::new_err(text),
    }
}
