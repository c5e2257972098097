//! A JSON schema made ready for constrained decoding: the engine's JSON options filled in and
//! its content fingerprinted.

use sha2::{Digest, Sha256};
use std::sync::Arc;

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
