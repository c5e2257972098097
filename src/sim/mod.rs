//! The simulation framework: experiment configs, the scenario abstraction, policies, prompt
//! templates and the runner. It knows nothing of any particular scenario.

pub mod config;
pub mod policy;
pub mod prompt;
pub mod runner;
pub mod scenario;
