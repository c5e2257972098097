//! The population lent to one call of the class, and gone after it.

use super::*;
use throng::sim::population::Column;

/// Something Rust lends a Python call for its duration only: the call's population or
/// random generator. A Python object that keeps it past the call finds it gone (an error),
/// never a dangling reference.
pub(super) struct Lent<T>(Mutex<Option<*const T>>);

// SAFETY: the pointer is dereferenced only under the mutex, and only while the `&T` it came
// from is alive: `Expire` clears it before the lending call returns.
unsafe impl<T: Sync> Send for Lent<T> {}
unsafe impl<T: Sync> Sync for Lent<T> {}

impl<T> Lent<T> {
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> PyResult<R> {
        let guard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *guard {
            // SAFETY: see the `Send` impl: set only while the referent is borrowed.
            Some(p) => Ok(f(unsafe { &*p })),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this population was lent to one call of the scenario and is gone: read what \
                 you need during that call, or keep a copy in the world",
            )),
        }
    }
}

/// One attribute value, as Python gets it.
enum Typed {
    Category(String),
    Whole(i64),
    Number(f64),
}

impl Typed {
    fn of(column: &Column, agent: usize) -> Self {
        match column {
            Column::Categorical { categories, codes } => {
                Typed::Category(categories[codes[agent] as usize].clone())
            }
            Column::Numeric { values, integer } => match *integer {
                // Whole numbers are kept exactly in the floats (the config's check).
                true => Typed::Whole(values[agent] as i64),
                // The shortest decimal that is the f32, as a Python float: 0.3, not
                // 0.30000001192092896.
                false => Typed::Number(
                    values[agent]
                        .to_string()
                        .parse()
                        .expect("invariant: a float's text parses"),
                ),
            },
        }
    }

    fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Typed::Category(c) => c.into_pyobject(py)?.into_any().unbind(),
            Typed::Whole(n) => n.into_pyobject(py)?.into_any().unbind(),
            Typed::Number(x) => x.into_pyobject(py)?.into_any().unbind(),
        })
    }
}

/// A population, as a scenario's methods see it during one call.
#[pyclass(name = "Population", module = "throng", frozen)]
pub struct PyPopulation(Lent<Population>);

/// Clears a lent population when the call that got it ends, however it ends.
pub(super) struct Expire<'py>(pub(super) Bound<'py, PyPopulation>);

impl Drop for Expire<'_> {
    fn drop(&mut self) {
        *self.0.get().0.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

pub(super) fn lend<'py>(py: Python<'py>, population: &Population) -> PyResult<Expire<'py>> {
    Bound::new(
        py,
        PyPopulation(Lent(Mutex::new(Some(population as *const Population)))),
    )
    .map(Expire)
}

impl PyPopulation {
    fn level(&self, level: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.0.read(|p| {
            let levels = &p.groups.levels;
            if let Ok(i) = level.extract::<usize>() {
                return (i < levels.len()).then_some(i).ok_or_else(|| {
                    pyo3::exceptions::PyIndexError::new_err(format!(
                        "level {i}: the population has {} group levels",
                        levels.len()
                    ))
                });
            }
            let name: String = level.extract()?;
            levels.iter().position(|l| l.name == name).ok_or_else(|| {
                pyo3::exceptions::PyKeyError::new_err(format!(
                    "`{name}` is not a group level (levels: {})",
                    levels
                        .iter()
                        .map(|l| l.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
        })?
    }
}

#[pymethods]
impl PyPopulation {
    /// Agents in the population.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        self.0.read(|p| p.size)
    }

    /// The group levels' names, innermost first.
    #[getter]
    fn levels(&self) -> PyResult<Vec<String>> {
        self.0
            .read(|p| p.groups.levels.iter().map(|l| l.name.clone()).collect())
    }

    /// The group `agent` belongs to at `level` (a name or an index).
    fn group_of(&self, level: &Bound<'_, PyAny>, agent: usize) -> PyResult<usize> {
        let l = self.level(level)?;
        self.0.read(|p| {
            p.groups.levels[l]
                .of_agent
                .get(agent)
                .map(|&g| g as usize)
                .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("agent {agent}")))
        })?
    }

    /// Groups at `level`.
    fn num_groups(&self, level: &Bound<'_, PyAny>) -> PyResult<usize> {
        let l = self.level(level)?;
        self.0.read(|p| p.groups.levels[l].len())
    }

    /// Members of `group` at `level`.
    fn group_size(&self, level: &Bound<'_, PyAny>, group: usize) -> PyResult<u32> {
        let l = self.level(level)?;
        self.0
            .read(|p| p.groups.levels[l].sizes.get(group).copied())?
            .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("group {group}")))
    }

    /// The label of `group` at `level` (`team 3`, or the attribute's value it stands for).
    fn group_label(&self, level: &Bound<'_, PyAny>, group: usize) -> PyResult<String> {
        let l = self.level(level)?;
        self.0
            .read(|p| p.groups.levels[l].labels.get(group).cloned())?
            .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("group {group}")))
    }

    /// The agents of `group` at `level`.
    fn members(&self, level: &Bound<'_, PyAny>, group: usize) -> PyResult<Vec<u32>> {
        let l = self.level(level)?;
        self.0.read(|p| {
            (group < p.groups.levels[l].len())
                .then(|| p.groups.members(l, group).to_vec())
                .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("group {group}")))
        })?
    }

    /// `agent`'s `(level, group)` at every level, innermost first.
    fn path(&self, agent: usize) -> PyResult<Vec<(usize, usize)>> {
        self.0.read(|p| {
            (agent < p.size)
                .then(|| p.groups.path(agent).collect())
                .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("agent {agent}")))
        })?
    }

    /// The attributes' names, in the config's order.
    #[getter]
    fn attributes(&self) -> PyResult<Vec<String>> {
        self.0
            .read(|p| p.columns.iter().map(|(n, _)| n.clone()).collect())
    }

    /// `agent`'s attributes as `(name, value)`, in the config's order: a category as `str`,
    /// an `integer = true` attribute as `int`, any other number as `float`.
    fn profile(&self, py: Python<'_>, agent: usize) -> PyResult<Vec<(String, Py<PyAny>)>> {
        let pairs = self.0.read(|p| {
            (agent < p.size)
                .then(|| {
                    p.columns
                        .iter()
                        .map(|(n, c)| (n.clone(), Typed::of(c, agent)))
                        .collect::<Vec<_>>()
                })
                .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("agent {agent}")))
        })??;
        pairs
            .into_iter()
            .map(|(n, v)| Ok((n, v.into_py(py)?)))
            .collect()
    }

    /// `agent`'s value of attribute `name`, typed as in [`PyPopulation::profile`].
    fn attribute(&self, py: Python<'_>, agent: usize, name: &str) -> PyResult<Py<PyAny>> {
        let value = self.0.read(|p| {
            if agent >= p.size {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "agent {agent}: the population has {} agents",
                    p.size
                )));
            }
            match p.column(name) {
                Some(c) => Ok(Typed::of(c, agent)),
                None => Err(pyo3::exceptions::PyKeyError::new_err(format!(
                    "`{name}` is not an attribute (attributes: {})",
                    p.columns
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
            }
        })??;
        value.into_py(py)
    }

    /// `agent`'s persona, when the config has the model write personas.
    fn persona(&self, agent: usize) -> PyResult<Option<String>> {
        self.0.read(|p| {
            p.personas
                .as_ref()
                .and_then(|ps| ps.get(agent))
                .map(|s| s.to_string())
        })
    }
}
