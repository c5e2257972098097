//! How agents decide: `llm` (the engine, every agent of every cell of a step in one
//! continuous batch) or `scripted` (the scenario's rules of thumb), behind one trait, and
//! which agents use which when a config mixes them; and the personas a model writes for
//! them (`persona`).

mod assign;
mod decide;
mod decided;
mod error;
mod llm;
mod persona;
mod scripted;
mod turn;

pub use assign::{Assigned, assign, policies_of, routes};
pub use decide::{Policy, PolicyTimes};
pub use decided::{Decided, LlmTrace, count};
pub use error::PolicyError;
pub use llm::{Llm, PromptSizes, template_name};
pub use scripted::Scripted;
pub use turn::{AgentTurn, CellView, Transcript};
