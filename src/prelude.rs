//! What a study's scenario names, in one import: `use throng::prelude::*;` brings the
//! [`Scenario`] trait, its optional parts ([`Records`], [`Sizing`]) and the types its items take and return, the population and its groups,
//! and the traits and types of the crates a scenario uses through throng (its RNG, its JSON).
//! The crates themselves stay at the crate's root (`throng::minijinja`, `throng::toml`, ...).
#![warn(missing_docs)]

pub use crate::host::MemoryPart;
pub use crate::scenarios::Registry;
pub use crate::sim::config::ScenarioProblem;
pub use crate::sim::groups::GroupRef;
pub use crate::sim::population::{Column, Population, PopulationSpec};
pub use crate::sim::scenario::{
    CellInfo, DecisionProblem, Descriptor, ParseError, Parsed, Records, Scenario, Sizing,
    StateRows, TableError, Turn,
};
pub use arrow_array::RecordBatch;
pub use rand::{Rng, SeedableRng};
pub use rand_chacha::ChaCha8Rng;
pub use serde_json::{Value, json};
