//! Runs from Python: `throng.run` as the command line runs a config (Python scenarios
//! registered beside the built-in ones), and a run folder's tables read as throng reads them
//! (checksums verified), handed to pyarrow without a copy.

use crate::errors;
use crate::scenario::{PyKind, Raised};
use arrow_pyarrow::IntoPyArrow;
use pyo3::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use throng::scenarios::Registry;

/// The built-in scenarios and the Python `classes`.
fn registry(classes: &[Bound<'_, PyAny>]) -> PyResult<Registry> {
    let mut registry = Registry::builtin();
    for class in classes {
        registry = registry.with_kind(Arc::new(PyKind::new(class)?));
    }
    Ok(registry)
}

/// Runs `throng run ARGS` (as the command line parses them), with the scenario `classes`
/// registered. Returns the run folder and whether the run finished (`False`: paused, by
/// `--stop-after` or a Ctrl-C, and resumable). The interpreter's lock is released while the
/// run works, and taken back briefly to call a Python scenario and to look for a Ctrl-C,
/// which pauses the run after the current step, then raises `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (args, classes))]
pub fn run(
    py: Python<'_>,
    args: Vec<OsString>,
    classes: Vec<Bound<'_, PyAny>>,
) -> PyResult<(PathBuf, bool)> {
    let registry = registry(&classes)?;
    let args = throng::cli::parse_run(args)
        .map_err(|e| errors::ConfigError::new_err(errors::message(&e)))?;
    let mut interrupted: Option<PyErr> = None;
    let outcome = py.detach(|| {
        let mut watch = || {
            Python::attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    interrupted.get_or_insert(e);
                    true
                }
            })
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            throng::cli::run::run_with(
                &registry,
                args,
                None,
                throng::cli::run::Signals::Watch(&mut watch),
            )
        }))
    });
    let outcome = match outcome {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => return Err(errors::from_anyhow(e)),
        Err(payload) => {
            return Err(match payload.downcast::<Raised>() {
                // A Ctrl-C that landed in the scenario's Python code stopped the step at once:
                // the records end at the last checkpoint, from which the run resumes.
                Ok(raised)
                    if raised
                        .error
                        .is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) =>
                {
                    eprintln!(
                        "\nthrong: stopped at once by Ctrl-C; the step in progress is lost, the \
                         steps before it are kept: resume with throng.run(resume=<the run's \
                         folder>)"
                    );
                    raised.error
                }
                Ok(raised) => {
                    let e = errors::RunError::new_err(format!(
                        "the scenario's `{}` raised {}; the run stopped, keeping the steps it \
                         had finished: fix the scenario, then resume the run \
                         (throng.run(resume=...))",
                        raised.method,
                        raised.error.value(py).repr()?
                    ));
                    e.set_cause(py, Some(raised.error));
                    e
                }
                Err(other) => {
                    let what = other
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| other.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    errors::RunError::new_err(format!(
                        "throng failed inside the run ({what}); the steps it had finished are \
                         kept; please report this"
                    ))
                }
            });
        }
    };
    if let Some(e) = interrupted {
        return Err(e);
    }
    Ok((
        outcome.dir,
        outcome.ended == throng::sim::runner::Ended::Finished,
    ))
}

/// Every batch of the run's Parquet table `name` (`state`, `groups`, a scenario's own), as
/// throng reads it: the joined file of a finished run, else its parts so far, each checked
/// against the manifest's checksums. A `pyarrow.Table`, sharing throng's buffers.
#[pyfunction]
pub fn read_table(py: Python<'_>, dir: PathBuf, name: &str) -> PyResult<Py<PyAny>> {
    let batches = py
        .detach(|| throng::record::read_table(&dir, name))
        .map_err(|e| errors::ThrongError::new_err(e.to_string()))?;
    let Some(first) = batches.first() else {
        let pa = py.import("pyarrow")?;
        return Ok(pa
            .call_method1("table", (pyo3::types::PyDict::new(py),))?
            .unbind());
    };
    let schema = first.schema();
    let table = arrow_pyarrow::Table::try_new(batches, schema).map_err(|e| {
        errors::ThrongError::new_err(format!(
            "{}: the parts of table `{name}` do not share one schema: {e}",
            dir.display()
        ))
    })?;
    table.into_pyarrow(py).map(Bound::unbind)
}

/// Whether the run in `dir` has written Parquet table `name`.
#[pyfunction]
pub fn has_table(dir: PathBuf, name: &str) -> bool {
    throng::record::has_table(&dir, name)
}

/// Checks the run file `name` of `dir` against the manifest's checksums (a file the run is
/// still appending to has none yet, and passes).
#[pyfunction]
pub fn verify(dir: PathBuf, name: &str) -> PyResult<()> {
    throng::record::verify(&dir, name).map_err(|e| errors::ThrongError::new_err(e.to_string()))
}

/// Writes the report of the run in `dir` (`report.html`, figures, tables), with the scenario
/// `classes` known beside the built-in ones; returns its key numbers as text.
#[pyfunction]
pub fn report(py: Python<'_>, dir: PathBuf, classes: Vec<Bound<'_, PyAny>>) -> PyResult<String> {
    let registry = registry(&classes)?;
    py.detach(|| registry.report(&dir))
        .map_err(|e| errors::ThrongError::new_err(e.to_string()))
}
