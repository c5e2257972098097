//! An exception of the class's code, carried out of the run as a [`Halt`].

use super::*;

/// An exception raised by a scenario's Python code, carried out of the run.
pub struct Raised {
    /// The method that raised it (`turn`, `resolve`...).
    pub method: &'static str,
    pub error: PyErr,
}

/// Stops the run with `error`, raised by `method` (see the module's notes).
pub(super) fn raise(method: &'static str, error: PyErr) -> ! {
    let (message, interrupted) = Python::attach(|py| {
        (
            halt_message(py, method, &error),
            error.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py),
        )
    });
    std::panic::resume_unwind(Box::new(Halt {
        message,
        interrupted,
        detail: Box::new(Raised { method, error }),
        dir: None,
    }))
}

/// Lines of a traceback the run's manifest keeps: the frames nearest the raise, where the
/// fault usually is.
pub(super) const TRACEBACK_LINES: usize = 6;

/// What the manifest says of an exception raised by `method`: the exception, then the last
/// lines of its traceback.
pub(super) fn halt_message(py: Python<'_>, method: &str, error: &PyErr) -> String {
    let value = error.value(py);
    let kind = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    let mut text = format!("the scenario's `{method}` raised {kind}: {value}");
    let frames = error.traceback(py).and_then(|tb| {
        let lines: Vec<String> = py
            .import("traceback")
            .and_then(|t| t.call_method1("format_tb", (tb,)))
            .and_then(|l| l.extract())
            .ok()?;
        Some(lines.concat())
    });
    if let Some(frames) = frames {
        let lines: Vec<&str> = frames.lines().collect();
        text.push('\n');
        text.push_str(&lines[lines.len().saturating_sub(TRACEBACK_LINES)..].join("\n"));
    }
    text
}
