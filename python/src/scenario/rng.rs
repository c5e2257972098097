//! The cell's random generator, lent to one call of the class.

use super::*;

/// A cell's random generator, lent to one call: the same stream a Rust scenario draws from,
/// so that a Python scenario and its Rust twin draw the same numbers.
#[pyclass(name = "Rng", module = "throng", frozen)]
pub struct PyRng(Mutex<Option<ChaCha8Rng>>);

impl PyRng {
    fn with<R>(&self, f: impl FnOnce(&mut ChaCha8Rng) -> R) -> PyResult<R> {
        let mut guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_mut().map(f).ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "this random generator was lent to one call of the scenario and is gone",
            )
        })
    }
}

#[pymethods]
impl PyRng {
    /// A float in [0, 1) (Rust's `rng.random::<f64>()`).
    fn random(&self) -> PyResult<f64> {
        use rand::Rng;
        self.with(|r| r.random::<f64>())
    }

    /// A float in [low, high], both ends included (Rust's `rng.random_range(low..=high)`).
    fn uniform(&self, low: f64, high: f64) -> PyResult<f64> {
        use rand::Rng;
        if !(low <= high && low.is_finite() && high.is_finite()) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "uniform({low}, {high}): give finite low <= high"
            )));
        }
        self.with(|r| r.random_range(low..=high))
    }

    /// An int in [low, high), high excluded (Rust's `rng.random_range(low..high)`).
    fn integers(&self, low: i64, high: i64) -> PyResult<i64> {
        use rand::Rng;
        if low >= high {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "integers({low}, {high}): give low < high"
            )));
        }
        self.with(|r| r.random_range(low..high))
    }

    /// True with probability `p` (Rust's `rng.random_bool(p)`).
    fn bernoulli(&self, p: f64) -> PyResult<bool> {
        use rand::Rng;
        if !(0.0..=1.0).contains(&p) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "bernoulli({p}): p is within 0 to 1"
            )));
        }
        self.with(|r| r.random_bool(p))
    }
}

/// Lends `rng` to a Python call: moved into a `Rng` object for the call, and back after it.
pub(super) fn with_rng<'py, R>(
    py: Python<'py>,
    rng: &mut ChaCha8Rng,
    f: impl FnOnce(&Bound<'py, PyRng>) -> R,
) -> PyResult<R> {
    use rand::SeedableRng;
    let taken = std::mem::replace(rng, ChaCha8Rng::seed_from_u64(0));
    let lent = Bound::new(py, PyRng(Mutex::new(Some(taken))))?;
    let result = f(&lent);
    if let Some(back) = lent
        .get()
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        *rng = back;
    }
    Ok(result)
}
