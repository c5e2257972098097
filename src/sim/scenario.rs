//! What a simulation is, to the runner: a world per cell, agents that take turns, decisions
//! that change the world all at once, and the state tables that record it. The runner knows
//! nothing of any particular scenario.

use super::config::ScenarioProblem;
use super::population::{Population, PopulationSpec};
use arrow_array::RecordBatch;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Where a cell sits in an experiment: one arm, one population size, one replicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CellInfo {
    pub arm: String,
    pub population: usize,
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
    pub decision: D,
    /// What was clamped, in words (`cost_to_consumer 300 -> 250 (cap)`).
    pub clamps: Vec<String>,
}

pub trait Scenario: Sized + Send + Sync {
    /// Everything that changes during a cell's run, kept in checkpoints.
    type World: Serialize + DeserializeOwned + Send + Sync;
    /// One agent's move: small, since a step may hold a million of them. Its serde form is
    /// also how it travels between ranks (self-describing, so `untagged` enums work).
    type Decision: Serialize + DeserializeOwned + Clone + Send + Sync;

    /// Its name in configs (`[scenario] name = ...`), and its templates folder's.
    const NAME: &'static str;

    /// Roles agents play; each has a prompt template `<role>.jinja`.
    fn roles() -> &'static [&'static str];
    /// One arm's settings, from its `[scenario]` table (the base table with the arm's
    /// overrides), validated: the one place a scenario's config is read.
    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem>;
    /// Checks the experiment's population against what the scenario can use; a problem names
    /// its field under `population.`.
    fn check_population(&self, population: &PopulationSpec) -> Result<(), ScenarioProblem>;
    /// The variables of `system.jinja`, shared by every agent of the cell at `step`, so that
    /// the engine's prefix cache computes them once per cell and step.
    fn shared_context(&self, world: &Self::World, step: usize) -> minijinja::Value;
    /// A cell's world at step 0, for the drawn `population`.
    fn init(&self, population: &Population, rng: &mut ChaCha8Rng) -> Self::World;
    fn num_agents(&self, world: &Self::World) -> usize;
    /// Whether `agent` takes a turn in the world as it is (false: it sits the step out).
    fn acts(&self, world: &Self::World, agent: usize) -> bool;
    /// The role `agent` plays: its prompt template is `<role>.jinja`.
    fn role(&self, world: &Self::World, agent: usize) -> &'static str;
    /// What `agent` sees at `step`, for its own part of the prompt.
    fn turn(&self, world: &Self::World, population: &Population, agent: usize, step: usize)
    -> Turn;
    /// A decision from a model's JSON value.
    fn parse(
        &self,
        world: &Self::World,
        agent: usize,
        value: &serde_json::Value,
    ) -> Result<Parsed<Self::Decision>, String>;
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
    /// Applies every agent's decision at once (`None`: sat out) and advances the world.
    fn resolve(
        &self,
        world: &mut Self::World,
        decisions: &[Option<Self::Decision>],
        rng: &mut ChaCha8Rng,
    );
    /// The state table's rows for the world after `step`: one per agent (none is fine).
    fn state(
        &self,
        world: &Self::World,
        population: &Population,
        cell: &CellInfo,
        step: usize,
    ) -> RecordBatch;
    /// Names of the scenario's own Parquet tables, beside `state` (long-format data such as
    /// who traded with whom), each written as `<name>.parquet`.
    fn tables() -> &'static [&'static str] {
        &[]
    }
    /// Rows of table `name` (one of [`Scenario::tables`]) for the world after `step`.
    fn table(
        &self,
        _name: &str,
        _world: &Self::World,
        _cell: &CellInfo,
        _step: usize,
    ) -> Option<RecordBatch> {
        None
    }
    /// The columns of the scenario's per-cell aggregates (`aggregates.csv`), or `None` when it
    /// has none: the file is then not written at all. Declared up front, so that the file
    /// has its header from the start, before any step has finished.
    fn aggregates_schema() -> Option<arrow_schema::SchemaRef> {
        None
    }
    /// One row of per-cell aggregates after `step`, with the columns of
    /// [`Scenario::aggregates_schema`], kept whatever the decision log keeps.
    fn aggregates(
        &self,
        _world: &Self::World,
        _cell: &CellInfo,
        _step: usize,
    ) -> Option<RecordBatch> {
        None
    }
    /// What does not change during a run (e.g. the network), written once per cell.
    fn describe(&self, world: &Self::World) -> serde_json::Value;
    /// What one cell of `agents` agents holds in memory at most over `steps` steps, beyond
    /// what the runner holds for every agent (its turn, decision and attributes): its world,
    /// and the rows one step's records build for it, by part. An estimate (see
    /// [`crate::sim::plan::Footprint`]), which `throng run` checks against the machine's
    /// memory before it writes anything.
    fn memory(&self, agents: f64, steps: f64) -> Vec<crate::sim::plan::MemoryPart>;
}
