//! Numbers, names and tables as the reports write them, shared by the base report and the
//! counterfactual's.

use super::ReportError;
use serde::Serialize;
use std::path::Path;

/// `s` as a file name: every character but ASCII letters and digits becomes `_`.
pub(crate) fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `x` to three decimals, or none for a whole number or one of 1000 and more.
pub fn number(x: f64) -> String {
    if x.abs() >= 1000.0 || x == x.trunc() {
        format!("{x:.0}")
    } else {
        format!("{x:.3}")
    }
}

/// Writes `rows` as a CSV file with a header.
pub(crate) fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<(), ReportError> {
    // csv's error becomes an I/O error of the same words, so that every file the report
    // writes fails the same way.
    let failed = |e: csv::Error| ReportError::Write {
        path: path.to_path_buf(),
        source: e.into(),
    };
    let mut w = csv::Writer::from_path(path).map_err(failed)?;
    for row in rows {
        w.serialize(row).map_err(failed)?;
    }
    w.flush()?;
    Ok(())
}

/// `value [low, high]`, or `value (1 replicate: no interval)`.
pub(crate) fn interval_text(value: f64, interval: Option<(f64, f64)>, replicates: usize) -> String {
    match interval {
        Some((lo, hi)) => format!("{} [{}, {}]", number(value), number(lo), number(hi)),
        None => format!(
            "{} ({} replicate{}: no interval)",
            number(value),
            replicates,
            if replicates == 1 { "" } else { "s" }
        ),
    }
}
