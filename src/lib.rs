//! throng: LLM-driven agent-based simulations with the model inside the process.
//!
//! Two halves that meet only at the request/response types: [`engine`] turns requests into
//! tokens on one device with continuous batching, and the simulation layer turns agents into
//! requests and decisions into a changing world.

pub mod analysis;
pub mod assets;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod engine;
pub mod host;
pub mod model;
pub mod quality;
pub mod record;
pub mod scenarios;
pub mod seed;
pub mod serve;
pub mod sim;
