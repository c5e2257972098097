//! Constrained decoding with llguidance: a JSON schema becomes a grammar, compiled once per
//! distinct schema; each sequence carries its own matcher, which masks the logits before
//! every sample and says which tokens the grammar forces next.

mod grammars;
pub mod limits;

pub use grammars::Grammars;
pub use limits::Limit;
use llguidance::Matcher;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use toktrie::SimpleVob;

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
fn shown(value: &serde_json::Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// Compact, deterministic JSON (`{"a": 1, "b": true}`): one spelling per value, so replies
/// differ only where the model chose differently.
fn default_json_options() -> serde_json::Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// Names a schema by its content: equal schemas, however they were built, share one
/// compiled grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SchemaId(u128);

/// A JSON schema for constrained decoding, made ready once: the engine's default JSON
/// options filled in and its content fingerprinted. Cloning shares it, so that a million
/// requests with one schema neither copy nor serialise it again.
#[derive(Clone)]
pub struct Schema(Arc<SchemaInner>);

struct SchemaInner {
    value: serde_json::Value,
    id: SchemaId,
}

/// Feeds serialised JSON straight into the hash, without building the text.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Schema {
    pub fn new(mut value: serde_json::Value) -> Self {
        // Anything but an object is refused when a request uses it, where the error belongs
        // to that request.
        if value.is_object() && value.get("x-guidance").is_none() {
            value["x-guidance"] = default_json_options();
        }
        let mut hash = HashWriter(Sha256::new());
        serde_json::to_writer(&mut hash, &value).expect("invariant: a JSON value serialises");
        let digest = hash.0.finalize();
        let id = SchemaId(u128::from_le_bytes(
            digest[..16].try_into().expect("invariant: 32-byte digest"),
        ));
        Self(Arc::new(SchemaInner { value, id }))
    }

    /// The schema as the grammar sees it (with the default JSON options).
    pub fn value(&self) -> &serde_json::Value {
        &self.0.value
    }

    pub fn id(&self) -> SchemaId {
        self.0.id
    }
}

impl From<serde_json::Value> for Schema {
    fn from(value: serde_json::Value) -> Self {
        Self::new(value)
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Schema({})", self.0.value)
    }
}

/// One sequence's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    // Boxed: a matcher is large, and sequences move between queues by value.
    matcher: Box<Matcher>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Tokens allowed next (the end-of-turn ids once the value is complete, which is also
    /// where a schema with one valid reply is after its forced tokens).
    pub fn mask(&mut self) -> Result<SimpleVob, String> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())
    }

    /// Advances past `token`, which the mask allowed.
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Up to `room` of the tokens the grammar allows no alternative to (keys, punctuation),
    /// consumed: the caller appends them without sampling. Forced tokens past the reply's
    /// room would be cut from it anyway; a long `const` would otherwise be prefilled whole.
    pub fn forced(&mut self, room: usize) -> Vec<u32> {
        if room == 0 {
            return Vec::new();
        }
        let mut forced = self.matcher.compute_ff_tokens();
        forced.truncate(room);
        if forced.is_empty() || self.matcher.consume_tokens(&forced).is_err() {
            return Vec::new();
        }
        forced
    }

    /// Whether the grammar admits no further token: the value is complete.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

/// Sets the logits of tokens `mask` forbids to `-inf`.
pub(crate) fn apply_mask(logits: &mut [f32], mask: &SimpleVob) {
    for (word_index, &word) in mask.as_slice().iter().enumerate() {
        if word == u32::MAX {
            continue;
        }
        let start = word_index * 32;
        for bit in 0..32 {
            let i = start + bit;
            if i >= logits.len() {
                return;
            }
            if word & (1 << bit) == 0 {
                logits[i] = f32::NEG_INFINITY;
            }
        }
    }
}
