//! Constrained decoding with llguidance: a JSON schema becomes a grammar, compiled once per
//! distinct schema ([`Grammars`], within [`limits`]); each sequence carries its own matcher
//! ([`Constraint`]), which masks the logits before every sample and says which tokens the
//! grammar forces next.

mod error;
pub mod frame;
mod grammars;
pub mod limits;
mod schema;
mod state;

pub use error::{GrammarError, SchemaError};
pub use frame::{Frame, Mark, Otherwise, ReplyError, Split};
pub use grammars::Grammars;
pub use limits::Limit;
pub use schema::{Schema, SchemaId};
pub use state::Constraint;
pub(crate) use state::apply_mask;
