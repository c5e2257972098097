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
use throng::record::DefinedIn;
use throng::scenarios::{Kind, Loaded, ReportError};
use throng::sim::config::{ConfigError, ScenarioProblem};
use throng::sim::experiment::Experiment;
use throng::sim::groups::GroupRef;
use throng::sim::population::{Population, PopulationSpec};
use throng::sim::scenario::{
    CellInfo, Descriptor, Halt, ParseError, Parsed, Records, Scenario, Turn,
};

mod calls;
mod halt;
mod population;
mod rng;
mod world;

pub use calls::PyScenario;
pub use halt::Raised;
use halt::*;
pub use population::PyPopulation;
use population::*;
pub use rng::PyRng;
use rng::*;
pub use world::PyWorld;

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
    /// Its module and file, recorded in its runs' folders.
    defined_in: DefinedIn,
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
        let (knobs, defaults) = knobs_of(class, type_error)?;
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
            defined_in: defined_in(class),
        })))
    }
}

/// Where `class` is defined: its module, its file when it has one (`inspect.getfile`, absolute;
/// none for a class typed at the prompt), its qualified name.
fn defined_in(class: &Bound<'_, PyAny>) -> DefinedIn {
    let text = |attribute: &str| {
        class
            .getattr(attribute)
            .and_then(|v| v.extract::<String>())
            .unwrap_or_default()
    };
    let py = class.py();
    let file = py
        .import("inspect")
        .and_then(|inspect| inspect.call_method1("getfile", (class,)))
        .and_then(|f| f.extract::<String>())
        .ok()
        .map(|f| {
            std::path::absolute(&f)
                .map(|p| p.display().to_string())
                .unwrap_or(f)
        });
    DefinedIn {
        language: "python".into(),
        module: text("__module__"),
        file,
        class: text("__qualname__"),
    }
}

/// The class's `knobs`: a dict of each knob its `[scenario]` table may set to its default, or
/// a list of their names; none without it. An error (`type_error`'s, which names the class)
/// says what `knobs` must be.
fn knobs_of(
    class: &Bound<'_, PyAny>,
    type_error: impl Fn(&str) -> PyErr,
) -> PyResult<(Vec<String>, Option<Py<PyDict>>)> {
    let Ok(declared) = class.getattr("knobs") else {
        return Ok((Vec::new(), None));
    };
    let wrong = || {
        type_error(
            "`knobs` is a dict of each knob its `[scenario]` table may set to its default \
             (`{\"endowment\": 20}`), or a list of their names",
        )
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

    fn defined_in(&self) -> Option<DefinedIn> {
        Some(self.0.defined_in.clone())
    }

    fn report(&self, dir: &std::path::Path) -> Result<String, ReportError> {
        throng::analysis::overview::write(
            dir,
            &throng::analysis::overview::OverviewOptions::default(),
        )
        .map(|r| r.summary)
    }
}
