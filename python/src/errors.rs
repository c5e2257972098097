//! throng's errors as Python exceptions: one class per kind a caller may want to catch, each
//! carrying throng's own message (the problem and its fix), causes included.

//!
//! They are made in the module `throng` (their `__module__`), where the package exports them.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use throng::engine::RequestError as EngineRequestError;

create_exception!(
    throng,
    ThrongError,
    PyException,
    "Every error throng raises."
);
create_exception!(
    throng,
    ModelError,
    ThrongError,
    "A model that cannot be found or loaded (unknown name, missing or corrupt file)."
);
create_exception!(
    throng,
    RequestError,
    ThrongError,
    "A request the engine refused or could not finish."
);
create_exception!(
    throng,
    SchemaError,
    RequestError,
    "A JSON schema the constrained decoder cannot compile."
);
create_exception!(
    throng,
    PromptTooLongError,
    RequestError,
    "A prompt longer than the model's context or the KV cache."
);
create_exception!(
    throng,
    CutOffError,
    RequestError,
    "A reply cut off before it finished (by `max_tokens`, or the model's context): its value is None."
);
create_exception!(
    throng,
    ConfigError,
    ThrongError,
    "A malformed experiment config or bad run arguments."
);
create_exception!(
    throng,
    RunError,
    ThrongError,
    "A run that stopped on an error (its finished steps are kept)."
);

/// The class `ArgumentError`: a keyword argument of the wrong type or value. A `ThrongError`,
/// and also a `ValueError` and a `TypeError`, which Python code catches for bad arguments: a
/// class of three bases, which `create_exception!` cannot make, so it is made by calling
/// `type`.
pub fn argument_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let bases = PyTuple::new(
            py,
            [
                py.get_type::<ThrongError>(),
                py.get_type::<PyValueError>(),
                py.get_type::<PyTypeError>(),
            ],
        )?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "throng")?;
        namespace.set_item(
            "__doc__",
            "A keyword argument of the wrong type or value: the message names it, the value \
             given and what it takes. Also a ValueError and a TypeError.",
        )?;
        py.get_type::<PyType>()
            .call1(("ArgumentError", bases, namespace))?
            .cast_into::<PyType>()
            .map(Bound::unbind)
            .map_err(PyErr::from)
    })
    .map(|t| t.bind(py))
}

/// An `ArgumentError` saying `message`.
pub fn argument(py: Python<'_>, message: String) -> PyErr {
    match argument_error(py) {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(e) => e,
    }
}

/// `e`'s message with its chain of causes, as the command line prints it: a cause whose words
/// the message above already gave is not repeated.
pub fn message(e: &(dyn std::error::Error + 'static)) -> String {
    throng::causes::causes(e).join("\n  caused by: ")
}

/// Whether `e` or one of its causes is an `E`.
fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<E>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A failed run or load as the exception of its kind.
pub fn from_run(e: &throng::run::RunError) -> PyErr {
    use throng::run::RunError as Run;
    let text = message(e);
    match e.part() {
        Run::Config(_) => ConfigError::new_err(text),
        Run::Model(_) => ModelError::new_err(text),
        // A model that failed inside the engine or a step is still the model's failure.
        part if caused_by::<throng::model::ModelError>(part) => ModelError::new_err(text),
        _ => RunError::new_err(text),
    }
}

/// A refused or failed request as the exception of its kind, saying `text`.
pub fn from_request(e: &EngineRequestError, text: String) -> PyErr {
    match e {
        EngineRequestError::InvalidSchema(_) => SchemaError::new_err(text),
        EngineRequestError::PromptTooLong { .. }
        | EngineRequestError::PromptTextTooLong { .. }
        | EngineRequestError::PromptExceedsCache { .. } => PromptTooLongError::new_err(text),
        _ => RequestError::new_err(text),
    }
}
