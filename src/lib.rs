//! throng: LLM-driven agent-based simulations with the model inside the process.
//!
//! Two halves that meet only at the request/response types: [`engine`] turns requests into
//! tokens on one device with continuous batching, and the simulation layer turns agents into
//! requests and decisions into a changing world.

pub mod analysis;
pub mod api;
pub mod assets;
pub mod bench;
pub mod causes;
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

/// The book (`docs/src/`) and the README, under `cargo test --doc`: every Rust block in them
/// compiles, and runs unless marked `no_run`. `tests/docs.rs` holds that every chapter is here
/// and that every block names its language (an unnamed one would be taken for Rust).
#[cfg(doctest)]
mod book {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/src/api.md")]
    struct Api;
    #[doc = include_str!("../docs/src/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../docs/src/bench.md")]
    struct Bench;
    #[doc = include_str!("../docs/src/clusters.md")]
    struct Clusters;
    #[doc = include_str!("../docs/src/energy-market-rules.md")]
    struct EnergyMarketRules;
    #[doc = include_str!("../docs/src/energy-report.md")]
    struct EnergyReport;
    #[doc = include_str!("../docs/src/engine.md")]
    struct Engine;
    #[doc = include_str!("../docs/src/experiments.md")]
    struct Experiments;
    #[doc = include_str!("../docs/src/gpu.md")]
    struct Gpu;
    #[doc = include_str!("../docs/src/guessing-game.md")]
    struct GuessingGame;
    #[doc = include_str!("../docs/src/models.md")]
    struct Models;
    #[doc = include_str!("../docs/src/plan.md")]
    struct Plan;
    #[doc = include_str!("../docs/src/python.md")]
    struct Python;
    #[doc = include_str!("../docs/src/reuse.md")]
    struct Reuse;
    #[doc = include_str!("../docs/src/run-folder.md")]
    struct RunFolder;
    #[doc = include_str!("../docs/src/serve.md")]
    struct Serve;
    #[doc = include_str!("../docs/src/setup.md")]
    struct Setup;
    #[doc = include_str!("../docs/src/tests.md")]
    struct Tests;
    #[doc = include_str!("../docs/src/your-own-study.md")]
    struct YourOwnStudy;
}
