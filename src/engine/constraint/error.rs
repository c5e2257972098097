//! Why a schema cannot constrain a reply, in words a client may read.

use super::limits::{self, Limit};

/// Why a grammar could not go on while a reply was decoded (llguidance's parser, in its
/// words): the reply fails, the engine goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// Why a schema cannot constrain a reply. Every case is the schema's (a client's) doing, but
/// for [`SchemaError::Setup`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("a JSON schema must be an object, got {0}")]
    NotAnObject(String),
    #[error(transparent)]
    Limit(#[from] Limit),
    #[error(
        "the schema admits no value (a `$ref` that leads only back to itself, or constraints \
         no value meets): give one that some JSON value satisfies"
    )]
    Empty,
    /// The grammar compiler's refusal, in its words without its internal state.
    #[error("{0}")]
    Grammar(String),
    #[error("the grammar engine cannot be set up for this model's tokenizer: {0}")]
    Setup(String),
}

impl SchemaError {
    /// llguidance's message for a refused grammar, as a client may read it: the parser's
    /// state and grammar dump cut off, its limits named in throng's terms.
    pub(crate) fn from_grammar(message: &str) -> Self {
        let message = message
            .split("\n<non-verbose/>")
            .next()
            .and_then(|m| m.split("\n<state>").next())
            .unwrap_or(message)
            .trim();
        if message.contains("NoExtension") {
            return SchemaError::Empty;
        }
        if let Some(width) = row_width(message) {
            return SchemaError::Grammar(format!(
                "the schema is too wide for the decoder: at one point of the reply {width} \
                 alternatives are open at once, more than it follows (about {} optional \
                 properties of one object, or `anyOf` alternatives, at most): make fewer of them \
                 optional, or split the schema",
                limits::MAX_PROPERTIES
            ));
        }
        let short: String = message.chars().take(400).collect();
        SchemaError::Grammar(format!("the decoder cannot compile this schema: {short}"))
    }
}

/// The item count in llguidance's "Current row has N items; max is M" message.
fn row_width(message: &str) -> Option<usize> {
    let rest = message.split("Current row has ").nth(1)?;
    rest.split(' ').next()?.parse().ok()
}

/// A value as an error message shows it: at most 80 characters of its JSON.
pub(super) fn shown(value: &serde_json::Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}
