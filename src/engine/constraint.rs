//! Constrained decoding with llguidance: a JSON schema becomes a grammar, compiled once per
//! distinct schema; each sequence carries its own matcher, which masks the logits before
//! every sample and says which tokens the grammar forces next.

use super::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use toktrie::SimpleVob;

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

/// Distinct schemas kept compiled at most.
const MAX_COMPILED: usize = 512;

/// Compiles schemas for one tokenizer and hands out matchers.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    /// A fresh matcher to clone per schema.
    compiled: HashMap<SchemaId, Matcher>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("compiled", &self.compiled.len())
            .finish()
    }
}

impl Grammars {
    /// Builds the token trie of `tokenizer` (padded to the model's `vocab_size`) with the
    /// model's end-of-turn ids as the grammar's end.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self, String> {
        // toktrie_hf_tokenizers is built on an older `tokenizers` than the engine; the JSON
        // form of the tokenizer is what both versions share.
        let json = tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| format!("cannot serialise the tokenizer: {e}"))?;
        let mut bytes = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
            .map_err(|e| format!("cannot build a token trie from the tokenizer: {e}"))?;
        let eos: Vec<u32> = tokenizer
            .eos_ids()
            .iter()
            .copied()
            .filter(|&id| (id as usize) < vocab_size)
            .collect();
        if !eos.is_empty() {
            bytes.set_eos_tokens(&eos);
        }
        let env = bytes
            .into_tok_env(Some(vocab_size))
            .map_err(|e| format!("cannot build a token trie from the tokenizer: {e}"))?;
        let mut factory = ParserFactory::new(
            &env,
            Default::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| format!("cannot set up the grammar engine: {e}"))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            compiled: HashMap::new(),
        })
    }

    /// A matcher for `schema`, compiled on first sight of that schema.
    pub fn constraint(&mut self, schema: &Schema) -> Result<Constraint, String> {
        if !schema.value().is_object() {
            return Err(format!(
                "a JSON schema must be an object, got {}",
                schema.value()
            ));
        }
        let key = schema.id();
        if let Some(m) = self.compiled.get(&key) {
            return Ok(Constraint {
                matcher: Box::new(m.clone()),
            });
        }
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_json_schema(schema.value().clone()))
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        // Schemas that change every step (a cap that follows demand) would grow the cache
        // without bound; compiling again is cheap next to a step.
        if self.compiled.len() >= MAX_COMPILED {
            self.compiled.clear();
        }
        self.compiled.insert(key, matcher.clone());
        Ok(Constraint {
            matcher: Box::new(matcher),
        })
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
    /// Tokens allowed next (the end-of-turn ids once the value is complete).
    pub fn mask(&mut self) -> Result<SimpleVob, String> {
        self.matcher.compute_mask().map_err(|e| e.to_string())
    }

    /// Advances past `token`, which the mask allowed.
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Tokens the grammar allows no alternative to (keys, punctuation), consumed: the caller
    /// appends them without sampling.
    pub fn forced(&mut self) -> Vec<u32> {
        self.matcher.consume_ff_tokens()
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
