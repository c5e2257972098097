//! Keyword arguments, checked here rather than by pyo3's conversions (which name no argument
//! for a negative count) or the command line's parser (whose errors speak of flags and
//! `--help`): a bad one is an `ArgumentError` naming it, the value given and what it takes.

use crate::errors;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
use std::path::PathBuf;

/// `name=value: problem`, as an `ArgumentError`.
pub fn refuse(value: &Bound<'_, PyAny>, name: &str, problem: &str) -> PyErr {
    let given = value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    errors::argument(value.py(), format!("{name}={given}: {problem}"))
}

/// An int, or an int-like object (`numpy.int64`: one with `__index__`), that is not a bool
/// (`True` is an int to Python, never a count to a caller).
pub fn int(value: &Bound<'_, PyAny>) -> Option<i128> {
    let int_like = value.is_instance_of::<PyInt>() || value.hasattr("__index__").unwrap_or(false);
    if value.is_instance_of::<PyBool>() || !int_like {
        return None;
    }
    value
        .extract::<i64>()
        .map(i128::from)
        .or_else(|_| value.extract::<u64>().map(i128::from))
        .ok()
}

/// A whole number from 1 up: `takes` says what it counts.
pub fn count(value: &Bound<'_, PyAny>, name: &str, takes: &str) -> PyResult<usize> {
    int(value)
        .filter(|n| *n >= 1)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| refuse(value, name, &format!("give a positive int ({takes})")))
}

/// As [`count`], or `None`.
pub fn optional_count(
    value: Option<&Bound<'_, PyAny>>,
    name: &str,
    takes: &str,
) -> PyResult<Option<usize>> {
    match value {
        Some(v) if !v.is_none() => count(v, name, takes).map(Some),
        _ => Ok(None),
    }
}

/// A seed: a whole number from 0 to 2^64 - 1.
pub fn seed(value: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    int(value)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| {
            refuse(
                value,
                name,
                "give a non-negative int (at most 2**64 - 1), or a list of them (one per prompt)",
            )
        })
}

/// A finite number (an int or a float, not a bool) that `within` accepts; `takes` says which.
pub fn number(
    value: &Bound<'_, PyAny>,
    name: &str,
    within: impl Fn(f64) -> bool,
    takes: &str,
) -> PyResult<f32> {
    let x = match int(value) {
        Some(n) => Some(n as f64),
        None if value.is_instance_of::<PyFloat>() => value.extract::<f64>().ok(),
        None => None,
    };
    x.filter(|x| x.is_finite() && within(*x))
        .map(|x| x as f32)
        .ok_or_else(|| refuse(value, name, &format!("give a number {takes}")))
}

/// A string.
pub fn text(value: &Bound<'_, PyAny>, name: &str, takes: &str) -> PyResult<String> {
    if value.is_instance_of::<PyString>() {
        return value.extract();
    }
    Err(refuse(value, name, &format!("give a string ({takes})")))
}

/// One of `choices`, as a string.
pub fn choice(value: &Bound<'_, PyAny>, name: &str, choices: &[&str]) -> PyResult<String> {
    let one_of = format!("give one of {}", quoted(choices));
    let given = text(value, name, &one_of)?;
    match choices.contains(&given.as_str()) {
        true => Ok(given),
        false => Err(refuse(value, name, &one_of)),
    }
}

/// `True` or `False`.
pub fn flag(value: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    match value.is_instance_of::<PyBool>() {
        true => value.extract(),
        false => Err(refuse(value, name, "give True or False")),
    }
}

/// A path: a string or an `os.PathLike`.
pub fn path(value: &Bound<'_, PyAny>, name: &str, takes: &str) -> PyResult<PathBuf> {
    value.extract::<PathBuf>().map_err(|_| {
        refuse(
            value,
            name,
            &format!("give a path, as a str or a Path ({takes})"),
        )
    })
}

/// `'a', 'b', 'c'`, as Python writes them.
pub fn quoted(choices: &[&str]) -> String {
    choices
        .iter()
        .map(|c| format!("{c:?}").replace('"', "'"))
        .collect::<Vec<_>>()
        .join(", ")
}
