//! What a simulation is, to the runner: a world per cell, agents that take turns, decisions
//! that change the world all at once. The runner knows nothing of any particular scenario.

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
    pub context: serde_json::Value,
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

pub trait Scenario: Send + Sync {
    /// Everything that changes during a cell's run, agents included.
    type World: Serialize + DeserializeOwned + Clone + Send + Sync;
    /// One agent's move.
    type Decision: Serialize + Clone + Send + Sync;
    /// One row of the per-step state table, one per agent.
    type Row: Serialize + DeserializeOwned;

    /// The name of its templates folder and of its report.
    fn name(&self) -> &'static str;
    /// Roles agents play; each has a prompt template `<role>.jinja`.
    fn roles(&self) -> &'static [&'static str];
    /// Variables shared by every prompt of a cell (the `system.jinja` template's).
    fn rules_context(&self) -> serde_json::Value;
    /// A cell's world at step 0.
    fn init(&self, population: usize, rng: &mut ChaCha8Rng) -> Self::World;
    fn num_agents(&self, world: &Self::World) -> usize;
    /// Whether `agent` takes a turn in the world as it is (false: it sits the step out).
    fn acts(&self, world: &Self::World, agent: usize) -> bool;
    /// The role `agent` plays: its prompt template is `<role>.jinja`.
    fn role(&self, world: &Self::World, agent: usize) -> &'static str;
    /// What `agent` sees at `step`, for its prompt.
    fn turn(&self, world: &Self::World, agent: usize, step: usize) -> Turn;
    /// A decision from a model's JSON value.
    fn parse(
        &self,
        world: &Self::World,
        agent: usize,
        value: &serde_json::Value,
    ) -> Result<Parsed<Self::Decision>, String>;
    /// The decision that changes nothing (used when the model could not decide).
    fn no_change(&self, world: &Self::World, agent: usize) -> Self::Decision;
    /// The rule-based decision of the `scripted` policy.
    fn scripted(&self, world: &Self::World, agent: usize, rng: &mut ChaCha8Rng) -> Self::Decision;
    /// Applies every agent's decision at once (`None`: sat out) and advances the world.
    fn resolve(
        &self,
        world: &mut Self::World,
        decisions: &[Option<Self::Decision>],
        rng: &mut ChaCha8Rng,
    );
    /// The state table rows of the world after `step`.
    fn rows(&self, world: &Self::World, cell: &CellInfo, step: usize) -> Vec<Self::Row>;
    /// What does not change during a run (e.g. the network), written once per cell.
    fn describe(&self, world: &Self::World) -> serde_json::Value;
}
