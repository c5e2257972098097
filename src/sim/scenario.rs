//! What a simulation is, to the runner: a world per cell, agents that take turns, decisions
//! that change the world all at once, groups that react to their members, and the rows that
//! record it. The runner knows nothing of any particular scenario.
//!
//! A scenario writes the core of [`Scenario`] (its world, roles, a turn, parsing a reply, a
//! scripted baseline, resolving a step, and its state [`Scenario::Row`]); everything else has
//! a default. A program registers it with its registry of scenarios (the layer above this
//! one) and gets the whole command line.
#![warn(missing_docs)]

use super::config::ScenarioProblem;
use super::groups::GroupRef;
use super::population::{Population, PopulationSpec};
use arrow_array::RecordBatch;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Where a cell sits in an experiment: one arm, one population size, one replicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CellInfo {
    /// The arm's name.
    pub arm: String,
    /// The population size: its number of agents.
    pub population: usize,
    /// The replicate, from 0.
    pub replicate: usize,
}

/// What an agent sees on its turn, and the schema its decision must satisfy. Built only when
/// its prompt is rendered, so that a million agents never hold a million of these at once.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The variables of its role's prompt template.
    pub context: minijinja::Value,
    /// The JSON schema of the decision, with the domain's bounds inside it; shared between
    /// turns of the same shape.
    pub schema: std::sync::Arc<serde_json::Value>,
}

/// A decision parsed from a model's reply, with the changes made to fit the rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed<D> {
    /// The decision, within the rules.
    pub decision: D,
    /// What was clamped, in words (`cost_to_consumer 300 -> 250 (cap)`).
    pub clamps: Vec<String>,
}

/// Why a model's reply is not a decision (the agent then keeps [`Scenario::no_change`], and
/// the decisions log says why).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The reply does not have the decision's shape: a field missing or of the wrong type.
    #[error("{0}")]
    Shape(#[from] serde_json::Error),
    /// A field holds a value the rules cannot apply, even clamped.
    #[error("{field}: {reason}")]
    Rejected {
        /// The field.
        field: String,
        /// Why the rules cannot apply it.
        reason: String,
    },
}

/// The panic payload with which the code behind a [`Scenario`] method stops the run when it
/// cannot go on (the methods return values, not errors): a Python class's exception, carried
/// out of the runner with [`std::panic::resume_unwind`] (so no panic hook prints it). The
/// command marks the run failed with `message` (paused when `interrupted`, a Ctrl-C landing
/// in the scenario's code: its records end at the last checkpoint, from which it resumes),
/// then unwinds on with the payload, `dir` set to the run's folder, to the program embedding
/// throng, which finds its own `detail` in it.
pub struct Halt {
    /// Why the run stopped, for its manifest.
    pub message: String,
    /// Whether a Ctrl-C stopped it (the run is then paused, not failed).
    pub interrupted: bool,
    /// What the embedding program needs to raise the error again (a Python exception).
    pub detail: Box<dyn std::any::Any + Send>,
    /// The run's folder, once the command knows it.
    pub dir: Option<std::path::PathBuf>,
}

/// What the runner knows of a kind of scenario before it has made any world: its name in
/// configs, the roles its agents play, the tables it writes beside the state table, and the
/// columns of its per-cell aggregates. A Rust scenario's comes from its type
/// ([`Scenario::descriptor`]); a kind known only at run time (a Python class) builds its own
/// and hands it to the layer above, which gives it to the arms it loads. The runner reads
/// these from here alone.
#[derive(Debug, Clone)]
pub struct Descriptor {
    /// Its name in configs (`[scenario] name = ...`), and its templates folder's.
    pub name: String,
    /// Roles agents play; each has a prompt template `<role>.jinja`. Never empty.
    pub roles: &'static [&'static str],
    /// Names of the scenario's own Parquet tables, beside `state` (long-format data such as
    /// who traded with whom), each written as `<name>.parquet` from [`Records::table`].
    pub tables: &'static [&'static str],
    /// The scenario's own columns of its per-cell aggregates (`aggregates.csv`), or `None`
    /// when it has none: the file is then not written at all. Declared up front, so that the
    /// file has its header from the start, before any step has finished. The runner writes
    /// the cell's keys (`arm`, `population`, `replicate`, `step`) in front of them.
    pub aggregates: Option<arrow_schema::SchemaRef>,
}

impl Descriptor {
    /// A kind named `name` whose agents play `roles`, with no tables or aggregates of its own.
    pub fn new(name: impl Into<String>, roles: &'static [&'static str]) -> Self {
        Self {
            name: name.into(),
            roles,
            tables: &[],
            aggregates: None,
        }
    }

    /// With its own tables, `tables`.
    pub fn with_tables(self, tables: &'static [&'static str]) -> Self {
        Self { tables, ..self }
    }

    /// With per-cell aggregates of columns `schema`.
    pub fn with_aggregates(self, schema: arrow_schema::SchemaRef) -> Self {
        Self {
            aggregates: Some(schema),
            ..self
        }
    }

    /// Whether agents play more than one role: the state table then has a `role` column.
    pub(crate) fn several_roles(&self) -> bool {
        self.roles.len() > 1
    }
}

/// A simulation, to the runner. A study writes its core: its types, name, knobs
/// ([`Scenario::from_table`]), a world, a turn, parsing a reply, the scripted baseline,
/// resolving a step, and its state row. Everything else has a default: the hooks below
/// (groups that react, who acts and in which role, checks), and two optional parts, each a
/// trait of its own that the scenario hands out when it has one: [`Records`] (its own tables,
/// aggregates and cell descriptions) and [`Sizing`] (its memory, for `throng plan` and the
/// run's memory check). Its report is the registry's, the layer above this one. A
/// minimal one, in which each agent bets a whole number of coins:
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use std::sync::Arc;
/// use throng::prelude::*;
///
/// struct Bets;
///
/// #[derive(Serialize, Deserialize)]
/// struct Row {
///     coins: u32,
/// }
///
/// impl Scenario for Bets {
///     type World = Vec<u32>;
///     type Decision = u32;
///     type Row = Row;
///     const NAME: &'static str = "bets";
///
///     fn from_table(_: &throng::toml::Table) -> Result<Self, ScenarioProblem> {
///         Ok(Bets)
///     }
///     fn init(&self, population: &Population, _: &mut ChaCha8Rng) -> Vec<u32> {
///         vec![10; population.size]
///     }
///     fn num_agents(&self, world: &Vec<u32>) -> usize {
///         world.len()
///     }
///     fn turn(&self, world: &Vec<u32>, _: &Population, agent: usize, _: usize) -> Turn {
///         Turn {
///             context: throng::minijinja::context! { coins => world[agent] },
///             schema: Arc::new(json!({
///                 "type": "object",
///                 "properties": { "bet": { "type": "integer", "minimum": 0, "maximum": 10 } },
///                 "required": ["bet"],
///             })),
///         }
///     }
///     fn parse(&self, _: &Vec<u32>, _: usize, value: &Value) -> Result<Parsed<u32>, ParseError> {
///         let bet = throng::serde_json::from_value(value["bet"].clone())?;
///         Ok(Parsed { decision: bet, clamps: vec![] })
///     }
///     fn no_change(&self, _: &Vec<u32>, _: usize) -> u32 {
///         0
///     }
///     fn scripted(&self, w: &Vec<u32>, _: &Population, a: usize, _: &mut ChaCha8Rng) -> u32 {
///         w[a] / 2
///     }
///     fn resolve(&self, w: &mut Vec<u32>, _: &Population, d: &[Option<u32>], _: &mut ChaCha8Rng) {
///         for (coins, bet) in w.iter_mut().zip(d) {
///             *coins = coins.saturating_sub(bet.unwrap_or(0).min(*coins));
///         }
///     }
///     fn row(&self, world: &Vec<u32>, agent: usize, _: usize) -> Option<Row> {
///         Some(Row { coins: world[agent] })
///     }
/// }
///
/// // Its agents play the one role `agent` (template `agent.jinja`), and it writes the state
/// // table from its rows, nothing more.
/// assert_eq!(Bets::descriptor().roles, ["agent"]);
/// ```
///
/// A scenario without [`Scenario::row`] does not compile: forgetting it would write no state
/// table at all.
///
/// ```compile_fail
/// # use throng::prelude::*;
/// struct Forgetful;
/// impl Scenario for Forgetful {
///     type World = ();
///     type Decision = ();
///     type Row = ();
///     const NAME: &'static str = "forgetful";
///     fn from_table(_: &throng::toml::Table) -> Result<Self, ScenarioProblem> { Ok(Forgetful) }
///     fn init(&self, _: &Population, _: &mut ChaCha8Rng) {}
///     fn num_agents(&self, _: &()) -> usize { 1 }
///     fn turn(&self, _: &(), _: &Population, _: usize, _: usize) -> Turn { unimplemented!() }
///     fn parse(&self, _: &(), _: usize, _: &Value) -> Result<Parsed<()>, ParseError> {
///         unimplemented!()
///     }
///     fn no_change(&self, _: &(), _: usize) {}
///     fn scripted(&self, _: &(), _: &Population, _: usize, _: &mut ChaCha8Rng) {}
///     fn resolve(&self, _: &mut (), _: &Population, _: &[Option<()>], _: &mut ChaCha8Rng) {}
/// }
/// ```
pub trait Scenario: Sized + Send + Sync + 'static {
    /// Everything that changes during a cell's run, kept in checkpoints.
    type World: Serialize + DeserializeOwned + Send + Sync;
    /// One agent's move: small, since a step may hold a million of them. Its serde form is
    /// also how it travels between ranks (self-describing, so `untagged` enums work).
    type Decision: Serialize + DeserializeOwned + Clone + Send + Sync;
    /// One agent's row of the state table after a step: a `#[derive(Serialize, Deserialize)]`
    /// struct of the scenario's own columns (numbers, booleans, text, and `Option`s of them),
    /// whose columns are traced from the type, so that every step has the same ones. The runner
    /// puts the keys before them: arm, population, replicate, step, agent, `role` (when the
    /// scenario has several), `policy` (under policy groups), one column per group level, and
    /// the population's attributes.
    type Row: Serialize + DeserializeOwned;

    /// Its name in configs (`[scenario] name = ...`), and its templates folder's.
    const NAME: &'static str;

    /// Roles agents play; each has a prompt template `<role>.jinja`. One, `agent`, by default.
    fn roles() -> &'static [&'static str] {
        &["agent"]
    }
    /// What the runner knows of the kind: [`Scenario::NAME`] and [`Scenario::roles`], and
    /// nothing more by default. A scenario with tables or aggregates of its own declares them
    /// here ([`Descriptor::with_tables`], [`Descriptor::with_aggregates`]) and writes them
    /// through its [`Records`].
    fn descriptor() -> Descriptor {
        Descriptor::new(Self::NAME, Self::roles())
    }
    /// One arm's settings, from its `[scenario]` table (the base table with the arm's
    /// overrides), validated: the one place a scenario's config is read.
    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem>;
    /// A cell's world at step 0, for the drawn `population` (its attributes and groups).
    fn init(&self, population: &Population, rng: &mut ChaCha8Rng) -> Self::World;
    /// How many agents `world` holds; they are numbered from 0.
    fn num_agents(&self, world: &Self::World) -> usize;
    /// What `agent` sees at `step`, for its own part of the prompt.
    fn turn(&self, world: &Self::World, population: &Population, agent: usize, step: usize)
    -> Turn;
    /// A decision from a model's JSON value (already valid against the turn's schema).
    fn parse(
        &self,
        world: &Self::World,
        agent: usize,
        value: &serde_json::Value,
    ) -> Result<Parsed<Self::Decision>, ParseError>;
    /// The decision taken when the model could not decide.
    fn no_change(&self, world: &Self::World, agent: usize) -> Self::Decision;
    /// The rule-based decision of the `scripted` policy.
    fn scripted(
        &self,
        world: &Self::World,
        population: &Population,
        agent: usize,
        rng: &mut ChaCha8Rng,
    ) -> Self::Decision;
    /// Applies every agent's decision at once (`None`: sat out) and advances the world. The
    /// groups then react, innermost level first ([`Scenario::react`]).
    fn resolve(
        &self,
        world: &mut Self::World,
        population: &Population,
        decisions: &[Option<Self::Decision>],
        rng: &mut ChaCha8Rng,
    );
    /// `agent`'s row of the state table after `step` (step 0: before anyone moves), or `None`
    /// for no row. Required, though a scenario may answer `None` for every agent (one that
    /// lays out its table in [`Records::state`]): a default of no rows let a study that
    /// forgot it run to the end with no state table, without a word.
    fn row(&self, world: &Self::World, agent: usize, step: usize) -> Option<Self::Row>;

    /// Checks a decision of the `scripted` policy, made for `agent` at `step` (0-based), before
    /// it is recorded; an error (what is wrong with it) stops the run, naming the agent and
    /// the step. A scenario whose decisions are typed needs no check (the default); one whose
    /// decisions are JSON (a Python class) holds them to the turn's schema, as a model's reply
    /// is held to it.
    fn check_scripted(
        &self,
        _world: &Self::World,
        _population: &Population,
        _agent: usize,
        _step: usize,
        _decision: &Self::Decision,
    ) -> Result<(), DecisionProblem> {
        Ok(())
    }
    /// A group's reaction to its members' results after [`Scenario::resolve`], called for
    /// every group of every level, innermost level first, so that a village sees its teams
    /// after they have settled (the listeners of the million-agent study). Nothing by default.
    fn react(&self, _world: &mut Self::World, _population: &Population, _group: GroupRef<'_>) {}
    /// Checks the experiment's population against what the scenario can use: its `[population]`
    /// table and `sizes`, every number of agents the run has (`agents`, each size of a sweep),
    /// so that "more agents than grid cells" is refused before a run starts rather than by a
    /// panic in `init`. A problem names its field: `agents` for a size, a field under
    /// `population.` for the table. Anything goes by default.
    fn check_population(
        &self,
        _population: &PopulationSpec,
        _sizes: &[usize],
    ) -> Result<(), ScenarioProblem> {
        Ok(())
    }
    /// The variables of `system.jinja`, shared by every agent of the cell at `step`, so that
    /// the engine's prefix cache computes them once per cell and step. By default the step.
    fn shared_context(&self, _world: &Self::World, step: usize) -> minijinja::Value {
        minijinja::context! { step => step }
    }
    /// Whether `agent` takes a turn in the world as it is (false: it sits the step out).
    /// Everyone, by default.
    fn acts(&self, _world: &Self::World, _agent: usize) -> bool {
        true
    }
    /// The role `agent` plays, one of [`Scenario::roles`]: its prompt template is
    /// `<role>.jinja`. The first role by default.
    fn role(&self, _world: &Self::World, _agent: usize) -> &'static str {
        Self::roles()[0]
    }

    /// The scenario's records beyond its rows: by default none ([`StateRows`]: the state
    /// table from [`Scenario::row`], nothing else). A scenario with records of its own
    /// implements [`Records`] and answers `self`.
    fn records(&self) -> &dyn Records<Self> {
        &StateRows
    }
    /// What a cell of the scenario holds in memory: by default nothing beyond what the runner
    /// holds for every agent. A scenario whose world grows implements [`Sizing`] and answers
    /// `Some(self)`.
    fn sizing(&self) -> Option<&dyn Sizing> {
        None
    }
}

/// A scenario's own records, beside the state table its rows make: the state table laid out
/// by itself, tables of its own, per-cell aggregates and a description of each cell. Every
/// item has a default, which writes nothing of its own; a scenario implements those it uses
/// and hands itself out through [`Scenario::records`]. Its tables and aggregate columns are
/// declared in its [`Descriptor`].
pub trait Records<S: Scenario>: Sync {
    /// The whole state table after `step`, for a scenario that lays out its own columns
    /// (keys included) instead of [`Scenario::row`]'s. `None` by default: rows are used.
    fn state(
        &self,
        _world: &S::World,
        _population: &Population,
        _cell: &CellInfo,
        _step: usize,
    ) -> Option<RecordBatch> {
        None
    }
    /// Rows of table `name` (one of [`Descriptor::tables`]) for the world after `step`.
    fn table(
        &self,
        _name: &str,
        _world: &S::World,
        _cell: &CellInfo,
        _step: usize,
    ) -> Option<RecordBatch> {
        None
    }
    /// One row of per-cell aggregates after `step` (step 0: before anyone moves, as for
    /// [`Scenario::row`]), with the columns of [`Descriptor::aggregates`] (the runner adds the
    /// cell's keys), kept whatever the decision log keeps; `None` for no row (the guessing
    /// game has none at step 0, before its first round). The base report shows each column's
    /// mean per step over the replicates, by arm, with its interval.
    fn aggregates(&self, _world: &S::World, _cell: &CellInfo, _step: usize) -> Option<RecordBatch> {
        None
    }
    /// What does not change during a run (e.g. the network), written once per cell to
    /// `cells.jsonl`. Nothing by default.
    fn describe(&self, _world: &S::World) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// The scenario's own columns of the state table: by default traced from
    /// [`Scenario::Row`] (see [`trace_row_fields`]). Asked once per step, not per cell.
    fn row_fields(&self) -> Result<Vec<arrow_schema::FieldRef>, TableError> {
        trace_row_fields::<S>()
    }
    /// The columns `fields` (from [`Records::row_fields`]) filled from the rows of the agents
    /// that have one: by default through serde.
    fn row_columns(
        &self,
        fields: &[arrow_schema::FieldRef],
        rows: &[S::Row],
    ) -> Result<RecordBatch, TableError> {
        serde_arrow::to_record_batch(fields, &rows)
            .map_err(|e| TableError(format!("a state row did not fit its traced columns: {e}")))
    }
}

/// The records of a scenario that has none of its own: its state table from its rows.
pub struct StateRows;

impl<S: Scenario> Records<S> for StateRows {}

/// What one cell of a scenario holds in memory, for `throng plan` and the check a run makes
/// against the machine's memory before it writes anything.
pub trait Sizing {
    /// What one cell of `agents` agents holds in memory at most over `steps` steps, beyond
    /// what the runner holds for every agent (its turn, decision and attributes): its world,
    /// and the rows one step's records build for it, by part. An estimate (see
    /// [`crate::sim::footprint::Footprint`]).
    fn memory(&self, agents: f64, steps: f64) -> Vec<crate::host::MemoryPart>;
}

/// The columns of `S`'s state rows, traced from its [`Scenario::Row`] type.
pub fn trace_row_fields<S: Scenario>() -> Result<Vec<arrow_schema::FieldRef>, TableError> {
    use serde_arrow::schema::{SchemaLike, TracingOptions};
    let options = TracingOptions::default()
        .allow_null_fields(true)
        .enums_without_data_as_strings(true);
    Vec::<arrow_schema::FieldRef>::from_type::<S::Row>(options).map_err(|e| {
        TableError(format!(
            "its state row type ({}) cannot be a table: {e}; give it fields of numbers, \
             booleans, text, or `Option`s of them",
            std::any::type_name::<S::Row>()
        ))
    })
}

/// Why a scenario's state rows cannot be a table: its row type, or rows that do not fit the
/// columns. The runner names the scenario.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TableError(pub String);

/// What is wrong with a scripted decision, for [`Scenario::check_scripted`]: the runner
/// names the agent, the step and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecisionProblem(pub String);
