//! A scenario written in Python, run by throng's runner: a class whose instances answer what
//! a Rust [`Scenario`] answers, registered as one more kind of scenario. It gets the same run
//! folder, records, checkpoints, exact resume and report as a Rust one.
//!
//! The class (`python/throng/scenario.py` documents the protocol) gives its name, roles and
//! columns as attributes; an instance is made per arm from the arm's `[scenario]` table. A
//! world is any picklable Python object (checkpoints hold its pickle), and decisions and rows
//! are JSON-like values (dicts).
//!
//! The [`Scenario`] methods cannot fail, so an exception raised by the class stops the run by
//! unwinding with a [`Halt`] (without the panic hook: [`std::panic::resume_unwind`]): the
//! command marks the run failed with the exception and its traceback's last lines, and
//! [`crate::runs`] raises it again in Python; the steps finished before it are kept, as after
//! a kill.

use crate::columns;
use arrow_array::RecordBatch;
use arrow_schema::{FieldRef, SchemaRef};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use throng::scenarios::{Kind, Loaded, ReportError};
use throng::sim::config::{ConfigError, ScenarioProblem};
use throng::sim::experiment::Experiment;
use throng::sim::groups::GroupRef;
use throng::sim::population::{Population, PopulationSpec};
use throng::sim::scenario::{
    CellInfo, Descriptor, Halt, ParseError, Parsed, Records, Scenario, Turn,
};

/// An exception raised by a scenario's Python code, carried out of the run.
pub struct Raised {
    /// The method that raised it (`turn`, `resolve`...).
    pub method: &'static str,
    pub error: PyErr,
}

/// Stops the run with `error`, raised by `method` (see the module's notes).
fn raise(method: &'static str, error: PyErr) -> ! {
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
const TRACEBACK_LINES: usize = 6;

/// What the manifest says of an exception raised by `method`: the exception, then the last
/// lines of its traceback.
fn halt_message(py: Python<'_>, method: &str, error: &PyErr) -> String {
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

/// Interns a name for the life of the process: the runner takes roles and table names as
/// `&'static str`, and a class is loaded a handful of times per process at most.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.push(leaked);
    leaked
}

/// A Python class of scenario, as the registry knows it.
pub struct PyKind(Arc<Class>);

/// What the runner asks of a Python class, read once from it.
struct Class {
    class: Py<PyAny>,
    /// Its kind: `name`, `roles`, the names of its `tables` and its `aggregates_columns`
    /// (the runner writes the cell's keys in front of them).
    descriptor: Descriptor,
    /// The state table's own columns (`columns`); none without `row`.
    columns: Vec<FieldRef>,
    /// Each of its own tables' columns after the cell's keys, in the order of
    /// `descriptor.tables`.
    tables: Vec<SchemaRef>,
    /// The knobs its `[scenario]` table may set (`knobs`), in the class's order.
    knobs: Vec<String>,
    /// Their defaults, when `knobs` is a dict.
    defaults: Option<Py<PyDict>>,
    /// Whether scripted decisions are held to their turn's schema (`check_scripted`).
    check_scripted: bool,
}

/// The keys that begin every row of a Python scenario's aggregates and own tables.
const CELL_KEYS: [(&str, arrow_schema::DataType); 4] = [
    ("arm", arrow_schema::DataType::LargeUtf8),
    ("population", arrow_schema::DataType::UInt64),
    ("replicate", arrow_schema::DataType::UInt64),
    ("step", arrow_schema::DataType::UInt64),
];

/// The cell's keys, then `own`.
fn keyed(own: Vec<FieldRef>) -> SchemaRef {
    let mut fields: Vec<FieldRef> = CELL_KEYS
        .iter()
        .map(|(n, t)| Arc::new(arrow_schema::Field::new(*n, t.clone(), false)))
        .collect();
    fields.extend(own);
    Arc::new(arrow_schema::Schema::new(fields))
}

/// A dict of column name to type (`what` names it in errors), read into fields.
fn fields_of(dict: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<FieldRef>> {
    let dict = dict.cast::<PyDict>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{what} is a dict of column name to type (`{{\"payoff\": \"float64\"}}`)"
        ))
    })?;
    dict.iter()
        .map(|(k, v)| {
            columns::field(&k.extract::<String>()?, &v.extract::<String>()?)
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{what}: {e}")))
        })
        .collect()
}

/// The class's `attribute`, a dict of columns, when it has one.
fn declared(class: &Bound<'_, PyAny>, attribute: &str) -> PyResult<Option<Vec<FieldRef>>> {
    if !class.hasattr(attribute)? {
        return Ok(None);
    }
    fields_of(&class.getattr(attribute)?, attribute).map(Some)
}

impl PyKind {
    /// Reads a scenario class: `name`, `roles`, `columns`, `aggregates_columns` and
    /// `tables`.
    pub fn new(class: &Bound<'_, PyAny>) -> PyResult<Self> {
        let type_error = |what: &str| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "scenario class {}: {what}",
                class
                    .getattr("__name__")
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        };
        let name: String = class
            .getattr("name")
            .and_then(|n| n.extract())
            .map_err(|_| type_error("give it `name`, the name configs use (`[scenario] name`)"))?;
        let roles: Vec<String> = class
            .getattr("roles")
            .and_then(|r| r.extract())
            .map_err(|_| type_error("give it `roles`, a list of role names (one template each)"))?;
        if roles.is_empty() {
            return Err(type_error("`roles` is empty: give at least one role"));
        }
        for method in ["init", "num_agents", "turn", "scripted", "resolve"] {
            if !class.hasattr(method)? {
                return Err(type_error(&format!(
                    "it has no `{method}` method (see help(throng.Scenario))"
                )));
            }
        }
        let roles: Vec<&'static str> = roles.iter().map(|r| intern(r)).collect();
        let columns = declared(class, "columns")?.unwrap_or_default();
        if class.hasattr("row")? && columns.is_empty() {
            return Err(type_error(
                "it has `row` but no `columns`: declare the row's columns and their types",
            ));
        }
        let (knobs, defaults) = knobs_of(class).map_err(|e| type_error(&e))?;
        let check_scripted = match class.getattr("check_scripted") {
            Ok(c) if c.is_instance_of::<pyo3::types::PyBool>() => c.extract()?,
            Ok(_) => {
                return Err(type_error(
                    "`check_scripted` is True (hold scripted decisions to their turn's schema) \
                     or False",
                ));
            }
            Err(_) => true,
        };
        // The runner writes the cell's keys in front of them.
        let aggregates = declared(class, "aggregates_columns")?
            .map(|own| Arc::new(arrow_schema::Schema::new(own)));
        let mut table_names = Vec::new();
        let mut tables = Vec::new();
        if class.hasattr("tables")? {
            let declared = class.getattr("tables")?;
            let declared = declared.cast::<PyDict>().map_err(|_| {
                type_error("`tables` is a dict of table name to its columns (a dict each)")
            })?;
            for (name, columns) in declared.iter() {
                let name: String = name.extract()?;
                if ["state", "groups", "personas"].contains(&name.as_str()) {
                    return Err(type_error(&format!(
                        "table `{name}` is one throng writes itself: name yours otherwise"
                    )));
                }
                tables.push(keyed(fields_of(&columns, &format!("tables[{name:?}]"))?));
                table_names.push(intern(&name));
            }
            if !tables.is_empty() && !class.hasattr("table")? {
                return Err(type_error(
                    "it declares `tables` but has no `table(name, world, cell, step)` method",
                ));
            }
        }
        let mut descriptor = Descriptor::new(name, Box::leak(roles.into_boxed_slice()))
            .with_tables(Box::leak(table_names.into_boxed_slice()));
        if let Some(aggregates) = aggregates {
            descriptor = descriptor.with_aggregates(aggregates);
        }
        Ok(Self(Arc::new(Class {
            class: class.clone().unbind(),
            descriptor,
            columns,
            tables,
            knobs,
            defaults,
            check_scripted,
        })))
    }
}

/// The class's `knobs`: a dict of each knob its `[scenario]` table may set to its default, or
/// a list of their names; none without it. An error says what `knobs` must be.
fn knobs_of(class: &Bound<'_, PyAny>) -> Result<(Vec<String>, Option<Py<PyDict>>), String> {
    let Ok(declared) = class.getattr("knobs") else {
        return Ok((Vec::new(), None));
    };
    let wrong = || {
        "`knobs` is a dict of each knob its `[scenario]` table may set to its default \
         (`{\"endowment\": 20}`), or a list of their names"
            .to_string()
    };
    if let Ok(dict) = declared.cast::<PyDict>() {
        let names = dict
            .keys()
            .iter()
            .map(|k| k.extract::<String>())
            .collect::<PyResult<Vec<_>>>()
            .map_err(|_| wrong())?;
        return Ok((names, Some(dict.clone().unbind())));
    }
    if declared.is_instance_of::<PyString>() {
        return Err(wrong());
    }
    let names: Vec<String> = declared.extract().map_err(|_| wrong())?;
    Ok((names, None))
}

/// One row of `method`'s output (a dict), after the cell's keys, in a table of `schema`.
fn keyed_batch(
    method: &'static str,
    schema: &SchemaRef,
    cell: &CellInfo,
    step: usize,
    rows: Vec<Value>,
) -> RecordBatch {
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            let mut own = dict_row(method, row);
            let mut keyed = serde_json::Map::new();
            keyed.insert("arm".into(), Value::from(cell.arm.clone()));
            keyed.insert("population".into(), Value::from(cell.population));
            keyed.insert("replicate".into(), Value::from(cell.replicate));
            keyed.insert("step".into(), Value::from(step));
            keyed.append(&mut own);
            Value::Object(keyed)
        })
        .collect();
    own_batch(method, schema, rows)
}

/// A row `method` gave, which must be a dict of its columns.
fn dict_row(method: &'static str, row: Value) -> serde_json::Map<String, Value> {
    match row {
        Value::Object(map) => map,
        other => raise(
            method,
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{method} gives rows as dicts of their columns, not {other}"
            )),
        ),
    }
}

/// The batch of `rows` (dicts) with the columns of `schema`.
fn own_batch(method: &'static str, schema: &SchemaRef, rows: Vec<Value>) -> RecordBatch {
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|row| Value::Object(dict_row(method, row)))
        .collect();
    columns::batch(schema.fields(), &rows).unwrap_or_else(|e| {
        raise(
            method,
            pyo3::exceptions::PyValueError::new_err(format!("{method}: {e}")),
        )
    })
}

impl Class {
    /// The `[scenario]` table an instance is made from, as a dict: the class's defaults (a
    /// copy of each, so that an instance that changes one leaves the class's alone), then the
    /// table's knobs. A knob the class does not declare is refused, as a Rust scenario's
    /// table refuses a field its type lacks.
    fn knobs<'py>(
        &self,
        py: Python<'py>,
        table: &toml::Table,
    ) -> Result<Bound<'py, PyAny>, ScenarioProblem> {
        if let Some(unknown) = table.keys().find(|k| !self.knobs.contains(k)) {
            let class = self
                .class
                .bind(py)
                .getattr("__name__")
                .map(|n| n.to_string())
                .unwrap_or_default();
            let message = match self.knobs.is_empty() {
                true => format!(
                    "unknown field `{unknown}`: scenario class {class} declares no knobs; list \
                     those its `[scenario]` table may set, with their defaults, in its `knobs` \
                     (`knobs = {{\"{unknown}\": ...}}`)"
                ),
                false => format!(
                    "unknown field `{unknown}`, expected {} (the knobs scenario class {class} \
                     declares)",
                    match self.knobs.as_slice() {
                        [one] => format!("`{one}`"),
                        all => format!(
                            "one of {}",
                            all.iter()
                                .map(|k| format!("`{k}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    }
                ),
            };
            return Err(ScenarioProblem::new(unknown.as_str(), message));
        }
        let made = (|| -> PyResult<Bound<'py, PyAny>> {
            let given = pythonize::pythonize(py, table)?;
            let Some(defaults) = &self.defaults else {
                return Ok(given);
            };
            let knobs = py
                .import("copy")?
                .call_method1("deepcopy", (defaults.bind(py),))?;
            knobs.call_method1("update", (given,))?;
            Ok(knobs)
        })();
        made.map_err(|e: PyErr| problem(py, e))
    }
}

/// A problem the class's constructor or `check_population` raised: `throng.ScenarioProblem`
/// names its field; any other exception is the whole table's.
fn problem(py: Python<'_>, e: PyErr) -> ScenarioProblem {
    let value = e.value(py);
    if e.is_instance_of::<crate::ScenarioProblem>(py) {
        let field = value
            .getattr("field")
            .and_then(|f| f.extract::<String>())
            .unwrap_or_default();
        let message = value
            .getattr("message")
            .and_then(|m| m.extract::<String>())
            .unwrap_or_else(|_| value.to_string());
        return ScenarioProblem::new(field, message);
    }
    let kind = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    ScenarioProblem::new("", format!("{kind}: {value}"))
}

impl Kind for PyKind {
    fn descriptor(&self) -> &Descriptor {
        &self.0.descriptor
    }

    fn load(&self, exp: Experiment) -> Result<Box<dyn Loaded>, ConfigError> {
        throng::scenarios::load_with(exp, self.0.descriptor.clone(), |table| {
            Python::attach(|py| {
                let instance = self
                    .0
                    .class
                    .bind(py)
                    .call1((self.0.knobs(py, table)?,))
                    .map_err(|e| problem(py, e))?;
                Ok(PyScenario {
                    kind: self.0.clone(),
                    instance: instance.unbind(),
                    schemas: Mutex::new(Vec::new()),
                    validators: Mutex::new(Vec::new()),
                })
            })
        })
    }

    fn report(&self, dir: &std::path::Path) -> Result<String, ReportError> {
        throng::analysis::overview::write(dir, &throng::analysis::overview::Options::default())
            .map(|r| r.summary)
    }
}

/// One arm of a Python scenario: the class's instance made from the arm's table.
pub struct PyScenario {
    kind: Arc<Class>,
    instance: Py<PyAny>,
    /// Schemas already converted, by the identity of the Python object `turn` returned, so
    /// that turns sharing one schema object share one `Arc` (and one compiled grammar).
    schemas: Mutex<Vec<(Py<PyAny>, Arc<Value>)>>,
    /// The checks of scripted decisions, one per schema (by its `Arc`, as [`Self::schema`]
    /// shares them).
    validators: Mutex<Vec<(Arc<Value>, Arc<jsonschema::Validator>)>>,
}

/// A Python scenario's world: any Python object; a checkpoint holds its pickle.
pub struct PyWorld(pub Py<PyAny>);

impl Serialize for PyWorld {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = Python::attach(|py| {
            py.import("pickle")?
                .call_method1("dumps", (self.0.bind(py),))?
                .extract()
        })
        .map_err(|e: PyErr| {
            serde::ser::Error::custom(format!(
                "the world cannot be pickled for the checkpoint: {e}; keep it to data pickle \
                 can write (dicts, lists, numbers, dataclasses)"
            ))
        })?;
        s.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for PyWorld {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: serde_bytes_owned::Bytes = Deserialize::deserialize(d)?;
        Python::attach(|py| {
            py.import("pickle")?
                .call_method1("loads", (pyo3::types::PyBytes::new(py, &bytes.0),))
                .map(|w| PyWorld(w.unbind()))
        })
        .map_err(|e| serde::de::Error::custom(format!("the checkpoint's world: {e}")))
    }
}

/// Bytes read back whether the format wrote them as bytes or as a sequence.
mod serde_bytes_owned {
    use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

    pub struct Bytes(pub Vec<u8>);

    impl<'de> Deserialize<'de> for Bytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Bytes;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes(v.to_vec()))
                }
                fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                    Ok(Bytes(v))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                    while let Some(b) = seq.next_element::<u8>()? {
                        out.push(b);
                    }
                    Ok(Bytes(out))
                }
            }
            d.deserialize_bytes(V)
        }
    }
}

/// Something Rust lends a Python call for its duration only: the call's population or
/// random generator. A Python object that keeps it past the call finds it gone (an error),
/// never a dangling reference.
struct Lent<T>(Mutex<Option<*const T>>);

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

/// A population, as a scenario's methods see it during one call.
#[pyclass(name = "Population", module = "throng", frozen)]
pub struct PyPopulation(Lent<Population>);

/// Clears a lent population when the call that got it ends, however it ends.
struct Expire<'py>(Bound<'py, PyPopulation>);

impl Drop for Expire<'_> {
    fn drop(&mut self) {
        *self.0.get().0.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn lend<'py>(py: Python<'py>, population: &Population) -> PyResult<Expire<'py>> {
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

    /// `agent`'s attributes as `(name, value as text)`, in the config's order.
    fn profile(&self, agent: usize) -> PyResult<Vec<(String, String)>> {
        self.0.read(|p| {
            (agent < p.size)
                .then(|| {
                    p.profile(agent)
                        .map(|(n, v)| (n.to_string(), v.to_string()))
                        .collect()
                })
                .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("agent {agent}")))
        })?
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
fn with_rng<'py, R>(
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

/// A Python value returned by `method` as JSON; anything else stops the run.
fn to_json(method: &'static str, value: &Bound<'_, PyAny>) -> Value {
    match pythonize::depythonize(value) {
        Ok(v) => v,
        Err(e) => raise(
            method,
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{method} returned {}, which is not JSON-like data (dicts, lists, str, numbers, \
                 bools, None): {e}",
                value.repr().map(|r| r.to_string()).unwrap_or_default()
            )),
        ),
    }
}

fn jinja(value: &Value) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(value))
}

impl PyScenario {
    /// Calls `method` of the instance with `args`; an exception stops the run.
    fn call<'py>(
        &self,
        py: Python<'py>,
        method: &'static str,
        args: impl pyo3::call::PyCallArgs<'py>,
    ) -> Bound<'py, PyAny> {
        self.instance
            .bind(py)
            .call_method1(method, args)
            .unwrap_or_else(|e| raise(method, e))
    }

    /// `turn`'s pair for `agent` at `step`: the template's variables, and the schema.
    fn turn_of<'py>(
        &self,
        py: Python<'py>,
        world: &PyWorld,
        population: &Population,
        agent: usize,
        step: usize,
    ) -> (Bound<'py, PyAny>, Arc<Value>) {
        let lent = lend(py, population).unwrap_or_else(|e| raise("turn", e));
        let out = self.call(py, "turn", (world.0.bind(py), &lent.0, agent, step));
        let pair = out.cast::<PyTuple>().ok().filter(|t| t.len() == 2);
        let Some(pair) = pair else {
            raise(
                "turn",
                pyo3::exceptions::PyTypeError::new_err(
                    "turn returns a pair: (the template's variables as a dict, the decision's \
                     JSON schema)",
                ),
            )
        };
        let context = pair.get_item(0).unwrap_or_else(|e| raise("turn", e));
        let schema = pair.get_item(1).unwrap_or_else(|e| raise("turn", e));
        (context, self.schema(py, &schema))
    }

    /// The check of decisions against `schema`, made once per schema.
    fn validator(&self, schema: &Arc<Value>) -> Result<Arc<jsonschema::Validator>, String> {
        let mut known = self.validators.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, v)) = known.iter().find(|(s, _)| Arc::ptr_eq(s, schema)) {
            return Ok(v.clone());
        }
        let validator = jsonschema::validator_for(schema)
            .map(Arc::new)
            .map_err(|e| {
                format!("the turn's schema cannot check it, as it is not a valid JSON schema: {e}")
            })?;
        if known.len() >= 256 {
            known.clear();
        }
        known.push((schema.clone(), validator.clone()));
        Ok(validator)
    }

    fn has(&self, py: Python<'_>, method: &str) -> bool {
        self.instance.bind(py).hasattr(method).unwrap_or(false)
    }

    fn schema(&self, py: Python<'_>, schema: &Bound<'_, PyAny>) -> Arc<Value> {
        let mut known = self.schemas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = known.iter().find(|(o, _)| o.bind(py).is(schema)) {
            return s.clone();
        }
        let value = Arc::new(to_json("turn", schema));
        if known.len() >= 256 {
            known.clear();
        }
        known.push((schema.clone().unbind(), value.clone()));
        value
    }
}

impl Scenario for PyScenario {
    type World = PyWorld;
    type Decision = Value;
    type Row = Value;

    /// A Python scenario's kind is its class's: the runner reads it from the descriptor
    /// its [`PyKind`] hands to the arms it loads, never from the type.
    const NAME: &'static str = "python";

    fn from_table(_table: &toml::Table) -> Result<Self, ScenarioProblem> {
        Err(ScenarioProblem::new(
            "",
            "a Python scenario is made by its class, through its registered kind",
        ))
    }

    fn check_population(&self, population: &PopulationSpec) -> Result<(), ScenarioProblem> {
        Python::attach(|py| {
            if !self.has(py, "check_population") {
                return Ok(());
            }
            let spec = PyDict::new(py);
            let levels: Vec<&str> = population.groups.iter().map(|l| l.name.as_str()).collect();
            let attributes: Vec<&str> = population.attributes.iter().map(|a| a.name()).collect();
            let filled = spec
                .set_item("levels", levels)
                .and_then(|_| spec.set_item("attributes", attributes));
            filled
                .and_then(|_| {
                    self.instance
                        .bind(py)
                        .call_method1("check_population", (spec,))
                })
                .map(|_| ())
                .map_err(|e| problem(py, e))
        })
    }

    fn init(&self, population: &Population, rng: &mut ChaCha8Rng) -> PyWorld {
        Python::attach(|py| {
            let lent = lend(py, population).unwrap_or_else(|e| raise("init", e));
            let world = with_rng(py, rng, |rng| self.call(py, "init", (&lent.0, rng)))
                .unwrap_or_else(|e| raise("init", e));
            // Checkpoints hold the world's pickle: a world pickle cannot write is refused
            // here, with pickle's reason, rather than at the first checkpoint.
            if let Err(e) = py
                .import("pickle")
                .and_then(|p| p.call_method1("dumps", (&world,)))
            {
                let refused = pyo3::exceptions::PyTypeError::new_err(format!(
                    "the world init returned cannot be pickled, and checkpoints hold its \
                     pickle: keep it to data pickle can write (dicts, lists, numbers, \
                     dataclasses): {e}"
                ));
                refused.set_cause(py, Some(e));
                raise("init", refused);
            }
            PyWorld(world.unbind())
        })
    }

    fn num_agents(&self, world: &PyWorld) -> usize {
        Python::attach(|py| {
            self.call(py, "num_agents", (world.0.bind(py),))
                .extract()
                .unwrap_or_else(|e| raise("num_agents", e))
        })
    }

    fn shared_context(&self, world: &PyWorld, step: usize) -> minijinja::Value {
        Python::attach(|py| {
            if !self.has(py, "shared_context") {
                return minijinja::context! { step => step };
            }
            let value = self.call(py, "shared_context", (world.0.bind(py), step));
            jinja(&to_json("shared_context", &value))
        })
    }

    fn acts(&self, world: &PyWorld, agent: usize) -> bool {
        Python::attach(|py| {
            !self.has(py, "acts")
                || self
                    .call(py, "acts", (world.0.bind(py), agent))
                    .is_truthy()
                    .unwrap_or_else(|e| raise("acts", e))
        })
    }

    fn role(&self, world: &PyWorld, agent: usize) -> &'static str {
        let roles = self.kind.descriptor.roles;
        Python::attach(|py| {
            if !self.has(py, "role") {
                return roles[0];
            }
            let role: String = self
                .call(py, "role", (world.0.bind(py), agent))
                .extract()
                .unwrap_or_else(|e| raise("role", e));
            roles
                .iter()
                .find(|r| **r == role)
                .copied()
                .unwrap_or_else(|| {
                    raise(
                        "role",
                        pyo3::exceptions::PyValueError::new_err(format!(
                            "role `{role}` is not one of the class's roles ({})",
                            roles.join(", ")
                        )),
                    )
                })
        })
    }

    /// `turn` returns `(context, schema)`: the role template's variables and the decision's
    /// JSON schema.
    fn turn(&self, world: &PyWorld, population: &Population, agent: usize, step: usize) -> Turn {
        Python::attach(|py| {
            let (context, schema) = self.turn_of(py, world, population, agent, step);
            Turn {
                context: jinja(&to_json("turn", &context)),
                schema,
            }
        })
    }

    /// A scripted decision is held to the schema of the agent's turn (`turn`'s), as the
    /// constrained decoder holds a model's reply to it, unless the class sets
    /// `check_scripted = False`.
    fn check_scripted(
        &self,
        world: &PyWorld,
        population: &Population,
        agent: usize,
        step: usize,
        decision: &Value,
    ) -> Result<(), String> {
        if !self.kind.check_scripted {
            return Ok(());
        }
        let schema = Python::attach(|py| self.turn_of(py, world, population, agent, step).1);
        let validator = self.validator(&schema)?;
        let problems: Vec<String> = validator
            .iter_errors(decision)
            .take(3)
            .map(|e| match e.instance_path().to_string() {
                at if at.is_empty() => e.to_string(),
                at => format!("at {at}: {e}"),
            })
            .collect();
        match problems.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{decision} is outside the turn's schema: {}",
                problems.join("; ")
            )),
        }
    }

    /// `parse` returns the decision, or `(decision, clamps)`; `throng.Rejected(field,
    /// reason)` or a `ValueError` rejects the reply (the agent keeps `no_change`). Without
    /// `parse`, the reply is the decision.
    fn parse(
        &self,
        world: &PyWorld,
        agent: usize,
        value: &Value,
    ) -> Result<Parsed<Value>, ParseError> {
        Python::attach(|py| {
            if !self.has(py, "parse") {
                return Ok(Parsed {
                    decision: value.clone(),
                    clamps: Vec::new(),
                });
            }
            let reply =
                pythonize::pythonize(py, value).unwrap_or_else(|e| raise("parse", e.into()));
            let out = match self
                .instance
                .bind(py)
                .call_method1("parse", (world.0.bind(py), agent, reply))
            {
                Ok(out) => out,
                Err(e) if e.is_instance_of::<crate::Rejected>(py) => {
                    let v = e.value(py);
                    let get = |name: &str| {
                        v.getattr(name)
                            .and_then(|x| x.extract::<String>())
                            .unwrap_or_default()
                    };
                    return Err(ParseError::Rejected {
                        field: get("field"),
                        reason: get("reason"),
                    });
                }
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyValueError>(py) => {
                    return Err(ParseError::Rejected {
                        field: String::new(),
                        reason: e.value(py).to_string(),
                    });
                }
                Err(e) => raise("parse", e),
            };
            let (decision, clamps) = match out.cast::<PyTuple>() {
                Ok(pair) if pair.len() == 2 => {
                    let clamps: Vec<String> = pair
                        .get_item(1)
                        .and_then(|c| c.extract())
                        .unwrap_or_else(|e| raise("parse", e));
                    (
                        pair.get_item(0).unwrap_or_else(|e| raise("parse", e)),
                        clamps,
                    )
                }
                _ => (out, Vec::new()),
            };
            Ok(Parsed {
                decision: to_json("parse", &decision),
                clamps,
            })
        })
    }

    fn no_change(&self, world: &PyWorld, agent: usize) -> Value {
        Python::attach(|py| {
            if !self.has(py, "no_change") {
                return Value::Null;
            }
            let out = self.call(py, "no_change", (world.0.bind(py), agent));
            to_json("no_change", &out)
        })
    }

    fn scripted(
        &self,
        world: &PyWorld,
        population: &Population,
        agent: usize,
        rng: &mut ChaCha8Rng,
    ) -> Value {
        Python::attach(|py| {
            let lent = lend(py, population).unwrap_or_else(|e| raise("scripted", e));
            let out = with_rng(py, rng, |rng| {
                self.call(py, "scripted", (world.0.bind(py), &lent.0, agent, rng))
            })
            .unwrap_or_else(|e| raise("scripted", e));
            to_json("scripted", &out)
        })
    }

    /// `resolve` changes the world in place, or returns the new one.
    fn resolve(
        &self,
        world: &mut PyWorld,
        population: &Population,
        decisions: &[Option<Value>],
        rng: &mut ChaCha8Rng,
    ) {
        Python::attach(|py| {
            let lent = lend(py, population).unwrap_or_else(|e| raise("resolve", e));
            let list = PyList::empty(py);
            for d in decisions {
                let item = match d {
                    Some(v) => {
                        pythonize::pythonize(py, v).unwrap_or_else(|e| raise("resolve", e.into()))
                    }
                    None => py.None().into_bound(py),
                };
                list.append(item).unwrap_or_else(|e| raise("resolve", e));
            }
            let out = with_rng(py, rng, |rng| {
                self.call(py, "resolve", (world.0.bind(py), &lent.0, list, rng))
            })
            .unwrap_or_else(|e| raise("resolve", e));
            if !out.is_none() {
                world.0 = out.unbind();
            }
        })
    }

    /// `react(world, population, group)`: `group` is a dict of `level` (index),
    /// `level_name`, `index`, `members` and `children`.
    fn react(&self, world: &mut PyWorld, population: &Population, group: GroupRef<'_>) {
        Python::attach(|py| {
            if !self.has(py, "react") {
                return;
            }
            let lent = lend(py, population).unwrap_or_else(|e| raise("react", e));
            let g = PyDict::new(py);
            let filled = g
                .set_item("level", group.level)
                .and_then(|_| {
                    g.set_item(
                        "level_name",
                        PyString::new(py, &population.groups.levels[group.level].name),
                    )
                })
                .and_then(|_| g.set_item("index", group.index))
                .and_then(|_| g.set_item("members", group.members))
                .and_then(|_| g.set_item("children", group.children));
            filled.unwrap_or_else(|e| raise("react", e));
            let out = self.call(py, "react", (world.0.bind(py), &lent.0, g));
            if !out.is_none() {
                world.0 = out.unbind();
            }
        })
    }

    fn row(&self, world: &PyWorld, agent: usize, step: usize) -> Option<Value> {
        Python::attach(|py| {
            if !self.has(py, "row") {
                return None;
            }
            let out = self.call(py, "row", (world.0.bind(py), agent, step));
            (!out.is_none()).then(|| to_json("row", &out))
        })
    }

    fn records(&self) -> &dyn Records<Self> {
        self
    }
}

/// The class's own tables, aggregates and cell descriptions, and its declared `columns`.
impl Records<PyScenario> for PyScenario {
    /// `table(name, world, cell, step)` gives the table's rows after `step`, as dicts of its
    /// declared columns (the cell's keys come first), or None.
    fn table(
        &self,
        name: &str,
        world: &PyWorld,
        cell: &CellInfo,
        step: usize,
    ) -> Option<RecordBatch> {
        let at = self
            .kind
            .descriptor
            .tables
            .iter()
            .position(|n| *n == name)?;
        Python::attach(|py| {
            let info = pythonize::pythonize(py, cell).unwrap_or_else(|e| raise("table", e.into()));
            let out = self.call(py, "table", (name, world.0.bind(py), info, step));
            if out.is_none() {
                return None;
            }
            let rows = match to_json("table", &out) {
                Value::Array(rows) => rows,
                other => raise(
                    "table",
                    pyo3::exceptions::PyTypeError::new_err(format!(
                        "table returns a list of rows (dicts), or None, not {other}"
                    )),
                ),
            };
            Some(keyed_batch(
                "table",
                &self.kind.tables[at],
                cell,
                step,
                rows,
            ))
        })
    }

    fn row_fields(&self) -> Result<Vec<FieldRef>, String> {
        Ok(self.kind.columns.clone())
    }

    fn row_columns(&self, fields: &[FieldRef], rows: &[Value]) -> Result<RecordBatch, String> {
        columns::batch(fields, rows).map_err(|e| format!("row: {e}"))
    }

    fn aggregates(&self, world: &PyWorld, cell: &CellInfo, step: usize) -> Option<RecordBatch> {
        let schema = self.kind.descriptor.aggregates.as_ref()?;
        Python::attach(|py| {
            if !self.has(py, "aggregates") {
                return None;
            }
            let info =
                pythonize::pythonize(py, cell).unwrap_or_else(|e| raise("aggregates", e.into()));
            let out = self.call(py, "aggregates", (world.0.bind(py), info, step));
            if out.is_none() {
                return None;
            }
            let row = to_json("aggregates", &out);
            Some(own_batch("aggregates", schema, vec![row]))
        })
    }

    fn describe(&self, world: &PyWorld) -> Value {
        Python::attach(|py| {
            if !self.has(py, "describe") {
                return Value::Null;
            }
            let out = self.call(py, "describe", (world.0.bind(py),));
            to_json("describe", &out)
        })
    }
}
