//! A JSON schema made ready for constrained decoding: the engine's JSON options filled in and
//! its content fingerprinted.

use super::frame::{Frame, Otherwise, ReplyError};
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
    /// The text around the value in a reply, where it has any.
    frame: Option<Frame>,
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
    pub fn new(value: serde_json::Value) -> Self {
        Self::build(value, None)
    }

    /// A schema whose value is written inside `frame` (a call in a model's own tool syntax).
    pub fn framed(value: serde_json::Value, mut frame: Frame) -> Self {
        if let Otherwise::Json(other) = &mut frame.otherwise {
            with_default_options(other);
        }
        Self::build(value, Some(frame))
    }

    fn build(mut value: serde_json::Value, frame: Option<Frame>) -> Self {
        with_default_options(&mut value);
        let mut hash = HashWriter(Sha256::new());
        serde_json::to_writer(&mut hash, &value).expect("invariant: a JSON value serialises");
        if let Some(frame) = &frame {
            serde_json::to_writer(&mut hash, frame).expect("invariant: a frame serialises");
        }
        let digest = hash.0.finalize();
        let id = SchemaId(u128::from_le_bytes(
            digest[..16].try_into().expect("invariant: 32-byte digest"),
        ));
        Self(Arc::new(SchemaInner { value, frame, id }))
    }

    /// The schema as the grammar sees it (with the default JSON options).
    pub fn value(&self) -> &serde_json::Value {
        &self.0.value
    }

    /// The text around the value, if any.
    pub fn frame(&self) -> Option<&Frame> {
        self.0.frame.as_ref()
    }

    /// The value of a whole reply held to this schema (`None` for words beside a frame).
    pub fn reply_value(&self, text: &str) -> Result<Option<serde_json::Value>, ReplyError> {
        match self.frame() {
            None => serde_json::from_str(text)
                .map(Some)
                .map_err(ReplyError::Json),
            Some(frame) => frame.value_of(text),
        }
    }

    pub fn id(&self) -> SchemaId {
        self.0.id
    }
}

/// Anything but an object is refused when a request uses it, where the error belongs to
/// that request.
fn with_default_options(value: &mut serde_json::Value) {
    if value.is_object() && value.get("x-guidance").is_none() {
        value["x-guidance"] = default_json_options();
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
