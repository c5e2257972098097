//! A Python scenario instance answering the runner: the [`Scenario`] and [`Records`] items
//! as calls of its methods.

use super::*;
use throng::prelude::{DecisionProblem, TableError};

/// One arm of a Python scenario: the class's instance made from the arm's table.
pub struct PyScenario {
    pub(super) kind: Arc<Class>,
    pub(super) instance: Py<PyAny>,
    /// Schemas already converted, by the identity of the Python object `turn` returned, so
    /// that turns sharing one schema object share one `Arc` (and one compiled grammar).
    pub(super) schemas: Mutex<Vec<(Py<PyAny>, Arc<Value>)>>,
    /// The checks of scripted decisions, one per schema (by its `Arc`, as [`Self::schema`]
    /// shares them).
    pub(super) validators: Mutex<Vec<(Arc<Value>, Arc<jsonschema::Validator>)>>,
}

/// A Python value returned by `method` as JSON; anything else stops the run.
pub(super) fn to_json(method: &'static str, value: &Bound<'_, PyAny>) -> Value {
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

pub(super) fn jinja(value: &Value) -> minijinja::Value {
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
    fn validator(
        &self,
        schema: &Arc<Value>,
    ) -> Result<Arc<jsonschema::Validator>, DecisionProblem> {
        let mut known = self.validators.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, v)) = known.iter().find(|(s, _)| Arc::ptr_eq(s, schema)) {
            return Ok(v.clone());
        }
        let validator = jsonschema::validator_for(schema)
            .map(Arc::new)
            .map_err(|e| {
                DecisionProblem(format!(
                    "the turn's schema cannot check it, as it is not a valid JSON schema: {e}"
                ))
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

    fn check_population(
        &self,
        population: &PopulationSpec,
        sizes: &[usize],
    ) -> Result<(), ScenarioProblem> {
        Python::attach(|py| {
            if !self.has(py, "check_population") {
                return Ok(());
            }
            let spec = PyDict::new(py);
            let levels: Vec<&str> = population.groups.iter().map(|l| l.name.as_str()).collect();
            let attributes: Vec<&str> = population.attributes.iter().map(|a| a.name()).collect();
            let filled = spec
                .set_item("levels", levels)
                .and_then(|_| spec.set_item("attributes", attributes))
                .and_then(|_| spec.set_item("sizes", sizes.to_vec()));
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
    ) -> Result<(), DecisionProblem> {
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
            false => Err(DecisionProblem(format!(
                "{decision} is outside the turn's schema: {}",
                problems.join("; ")
            ))),
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

    fn row_fields(&self) -> Result<Vec<FieldRef>, TableError> {
        Ok(self.kind.columns.clone())
    }

    fn row_columns(&self, fields: &[FieldRef], rows: &[Value]) -> Result<RecordBatch, TableError> {
        columns::batch(fields, rows).map_err(|e| TableError(format!("row: {e}")))
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
