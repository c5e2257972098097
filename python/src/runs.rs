//! Runs from Python: `throng.run` runs a config through the library's run, as the command
//! line does (Python scenarios registered beside the built-in ones), and a run folder's
//! tables read as throng reads them (checksums verified), handed to pyarrow without a copy.

use crate::errors;
use crate::scenario::{PyKind, Raised};
use arrow_pyarrow::IntoPyArrow;
use pyo3::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use throng::run::{Bar, Observer};
use throng::scenarios::Registry;
use throng::sim::runner::Progress;
use throng::sim::scenario::Halt;

/// The built-in scenarios and the Python `classes`.
pub(crate) fn registry(classes: &[Bound<'_, PyAny>]) -> PyResult<Registry> {
    let mut registry = Registry::builtin();
    for class in classes {
        registry = registry.with_kind(Arc::new(PyKind::new(class)?));
    }
    Ok(registry)
}

/// Runs the experiment `config` (or continues the run folder `resume`) with the scenario
/// `classes` registered, as `throng run` does, from keyword arguments checked here (a bad one
/// is a `ConfigError` naming it). Returns the run folder and whether the run finished
/// (`False`: paused, by `stop_after` or a Ctrl-C, and resumable). The interpreter's lock is
/// released while the run works, and taken back briefly to call a Python scenario and to look
/// for a Ctrl-C, which pauses the run after the current step, then raises
/// `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (
    config,
    classes,
    *,
    resume=None,
    out=None,
    policy=None,
    steps=None,
    replicates=None,
    agents=None,
    model=None,
    device=None,
    weights=None,
    no_report=None,
    stop_after=None,
    reuse=None,
    split=None,
    devices=None,
    rank_timeout=None,
    stop_timeout=None,
    serve=None,
    public=None,
    tokenizer=None,
    kv_memory=None,
    kv_format=None,
    max_batch_tokens=None,
    max_seqs=None,
    no_prefix_cache=None,
    kv_policy=None,
    threads=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn run<'py>(
    py: Python<'py>,
    config: Option<PathBuf>,
    classes: Vec<Bound<'py, PyAny>>,
    resume: Option<Bound<'py, PyAny>>,
    out: Option<Bound<'py, PyAny>>,
    policy: Option<Bound<'py, PyAny>>,
    steps: Option<Bound<'py, PyAny>>,
    replicates: Option<Bound<'py, PyAny>>,
    agents: Option<Bound<'py, PyAny>>,
    model: Option<Bound<'py, PyAny>>,
    device: Option<Bound<'py, PyAny>>,
    weights: Option<Bound<'py, PyAny>>,
    no_report: Option<Bound<'py, PyAny>>,
    stop_after: Option<Bound<'py, PyAny>>,
    reuse: Option<Bound<'py, PyAny>>,
    split: Option<Bound<'py, PyAny>>,
    devices: Option<Bound<'py, PyAny>>,
    rank_timeout: Option<Bound<'py, PyAny>>,
    stop_timeout: Option<Bound<'py, PyAny>>,
    serve: Option<Bound<'py, PyAny>>,
    public: Option<Bound<'py, PyAny>>,
    tokenizer: Option<Bound<'py, PyAny>>,
    kv_memory: Option<Bound<'py, PyAny>>,
    kv_format: Option<Bound<'py, PyAny>>,
    max_batch_tokens: Option<Bound<'py, PyAny>>,
    max_seqs: Option<Bound<'py, PyAny>>,
    no_prefix_cache: Option<Bound<'py, PyAny>>,
    kv_policy: Option<Bound<'py, PyAny>>,
    threads: Option<Bound<'py, PyAny>>,
) -> PyResult<(PathBuf, bool)> {
    let registry = registry(&classes)?;
    let kwargs = crate::run_options::Kwargs {
        resume,
        out,
        policy,
        steps,
        replicates,
        agents,
        model,
        device,
        weights,
        no_report,
        stop_after,
        reuse,
        split,
        devices,
        rank_timeout,
        stop_timeout,
        serve,
        public,
        tokenizer,
        kv_memory,
        kv_format,
        max_batch_tokens,
        max_seqs,
        no_prefix_cache,
        kv_policy,
        threads,
    };
    let mut options = crate::run_options::of(py, config, kwargs)?;
    // The interpreter owns the signal handlers: a Ctrl-C is looked for between steps.
    options.catch_signals = false;
    let mut interrupted: Option<PyErr> = None;
    let outcome = py.detach(|| {
        let mut watch = Interrupt {
            bar: Bar::default(),
            interrupted: &mut interrupted,
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            throng::run::run(&registry, options, &mut watch)
        }))
    });
    let outcome = match outcome {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => return Err(errors::from_run(&e)),
        Err(payload) => return Err(stopped(py, payload)?),
    };
    say(&outcome)?;
    let finished = outcome.ended == throng::sim::runner::Ended::Finished;
    if let Some(e) = interrupted {
        match finished {
            true => mark(
                py,
                &e,
                &outcome.dir,
                "finished before the Ctrl-C took effect",
            )?,
            false => paused_by(py, &e, &outcome.dir)?,
        }
        return Err(e);
    }
    Ok((outcome.dir, finished))
}

/// The run's progress bar, and a Ctrl-C looked for in the interpreter, which stops the run
/// after the current step and is raised once the run has paused.
struct Interrupt<'a> {
    bar: Bar,
    interrupted: &'a mut Option<PyErr>,
}

impl Observer for Interrupt<'_> {
    fn started(&mut self, planned: u64, root: bool) {
        self.bar.started(planned, root);
    }

    fn progress(&mut self, progress: &Progress) {
        self.bar.progress(progress);
    }

    fn stop_requested(&mut self) -> bool {
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                self.interrupted.get_or_insert(e);
                true
            }
        })
    }

    fn stopping(&mut self) {
        self.bar.stopping();
    }

    fn ended(&mut self, finished: bool) {
        self.bar.ended(finished);
    }
}

/// What the run says at its end (the report's key numbers, or how to resume), on standard
/// output as the command prints it.
fn say(outcome: &throng::run::Outcome) -> PyResult<()> {
    use std::io::Write;
    let mut out = std::io::stdout();
    for line in outcome.lines() {
        writeln!(out, "{line}").map_err(|e| errors::ThrongError::new_err(e.to_string()))?;
    }
    Ok(())
}

/// `throng.run(resume=...)` of the run in `dir`, as Python writes it.
fn resume_call(py: Python<'_>, dir: &Path) -> String {
    let folder = pyo3::types::PyString::new(py, &dir.display().to_string());
    let written = folder.repr().map(|r| r.to_string());
    format!("throng.run(resume={})", written.unwrap_or_default())
}

/// Tells a `KeyboardInterrupt` where the run it paused is: its message says how to resume,
/// and its `folder` is the run's folder.
fn paused_by(py: Python<'_>, e: &PyErr, dir: &Path) -> PyResult<()> {
    let how = format!(
        "is paused, its finished steps kept: resume it with {}",
        resume_call(py, dir)
    );
    mark(py, e, dir, &how)
}

/// Sets `e`'s message to say what became of the run in `dir`, and its `folder`.
fn mark(py: Python<'_>, e: &PyErr, dir: &Path, what: &str) -> PyResult<()> {
    let value = e.value(py);
    value.setattr("folder", dir.display().to_string())?;
    value.setattr("args", (format!("the run in {} {what}", dir.display()),))
}

/// The exception of a run that a panic stopped: the scenario's own (a [`Halt`], whose run
/// the command has marked failed, or paused after a Ctrl-C), or throng's failure.
fn stopped(py: Python<'_>, payload: Box<dyn std::any::Any + Send>) -> PyResult<PyErr> {
    let halt = match payload.downcast::<Halt>() {
        Ok(halt) => *halt,
        Err(other) => {
            let what = other
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| other.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Ok(errors::RunError::new_err(format!(
                "throng failed inside the run ({what}); the steps it had finished are kept; \
                 please report this"
            )));
        }
    };
    let dir = halt.dir.unwrap_or_default();
    let Ok(raised) = halt.detail.downcast::<Raised>() else {
        return Ok(errors::RunError::new_err(format!(
            "{}; the run in {} stopped, keeping the steps it had finished",
            halt.message,
            dir.display()
        )));
    };
    let Raised { method, error } = *raised;
    // A Ctrl-C that landed in the scenario's Python code stopped the step at once: the
    // records end at the last checkpoint, from which the run resumes.
    if error.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) {
        eprintln!(
            "\nthrong: stopped at once by Ctrl-C; the step in progress is lost, the steps before \
             it are kept"
        );
        paused_by(py, &error, &dir)?;
        return Ok(error);
    }
    let e = errors::RunError::new_err(format!(
        "the scenario's `{method}` raised {}; the run in {} stopped and is marked failed, \
         keeping the steps it had finished: fix the scenario, then resume it with {}",
        error.value(py).repr()?,
        dir.display(),
        resume_call(py, &dir)
    ));
    e.value(py).setattr("folder", dir.display().to_string())?;
    e.set_cause(py, Some(error));
    Ok(e)
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
/// `classes` known beside the built-in ones; returns its key numbers as text. Never into a
/// folder a run is still writing, as `throng report` does.
#[pyfunction]
pub fn report(py: Python<'_>, dir: PathBuf, classes: Vec<Bound<'_, PyAny>>) -> PyResult<String> {
    let registry = registry(&classes)?;
    py.detach(|| throng::run::report(&registry, &dir, &throng::host::Program::Python))
        .map_err(|e| errors::from_run(&e))
}
