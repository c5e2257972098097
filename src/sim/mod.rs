//! The simulation framework: experiment configs, populations, the scenario abstraction,
//! policies, prompt templates and the runner. It knows nothing of any particular scenario.

pub mod column;
pub mod config;
pub mod draw;
pub mod experiment;
pub mod footprint;
pub mod groups;
pub mod limits;
pub mod policy;
pub mod population;
pub mod prompt;
pub mod runner;
pub mod scenario;
