//! throng: LLM-driven agent-based simulations with the model inside the process.
//!
//! Two halves that meet only at the request/response types: [`engine`] turns requests into
//! tokens on one device with continuous batching, and the simulation layer turns agents into
//! requests and decisions into a changing world.

pub mod analysis;
pub mod api;
pub mod assets;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod engine;
pub mod generate;
pub mod host;
pub mod model;
pub mod plan;
pub mod prelude;
pub mod quality;
pub mod record;
pub mod reuse;
pub mod run;
pub mod scenarios;
pub mod seed;
pub mod serve;
pub mod sim;

// The crates a study names in its scenario's types (its knobs are a `toml::Table`, its RNG a
// `rand_chacha::ChaCha8Rng`, its prompt variables `minijinja` values, its aggregates an Arrow
// `RecordBatch`), so that a study depends on throng alone (and serde, for its derives) and
// always gets the versions throng was built with.
pub use {arrow_array, arrow_schema, minijinja, rand, rand_chacha, serde_json, toml};
