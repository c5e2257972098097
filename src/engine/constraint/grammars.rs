//! Schemas compiled into grammars, once per distinct schema and never on the engine's thread.
//!
//! llguidance's schema compiler recurses once per property of an object, per `$ref` it follows
//! and per level of nesting, so a schema a client chose sets how deep it goes: 7,000 required
//! names or a chain of 1,000 `$ref`s overflowed the engine thread's 2 MiB stack and aborted
//! the process. Every compile therefore runs on a thread of [`Grammars`]' own pool, whose
//! stack ([`COMPILE_STACK`]) holds the deepest schema [`limits`](super::limits) admits many
//! times over, after those limits are checked. A server compiles each request's schema on
//! that pool before the request reaches the engine, which then finds it compiled.

use super::error::{SchemaError, shown};
use super::frame::Otherwise;
use super::limits;
use super::schema::{Schema, SchemaId};
use super::state::Constraint;
use crate::engine::tokenizer::Tokenizer;
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

/// Distinct schemas kept compiled (or refused) at most.
const MAX_COMPILED: usize = 512;

/// The stack of a grammar compile. The deepest schema the limits admit needs about 10 MiB
/// (measured: a chain of [`limits::MAX_NODES`] `$ref`s); the rest is margin. Reserved, not
/// used: the memory a thread's stack takes is what it touched.
const COMPILE_STACK: usize = 256 << 20;

/// How many schemas compile at once, at most.
const COMPILE_THREADS: usize = 4;

/// The decoder's own limits. llguidance's defaults, but for the width of a grammar at one
/// point (`max_items_in_row`, 2,000 by default): an object's optional properties are each an
/// open alternative where the object starts, about four items each, and a form of
/// [`limits::MAX_PROPERTIES`] optional fields is a real schema. The Earley items a mask may
/// create grow with it, so that one mask's work stays bounded (about 20,000 items a
/// millisecond). No parser state in error messages: they go to clients.
fn parser_limits() -> ParserLimits {
    let row = 4 * limits::MAX_PROPERTIES + 2_000;
    ParserLimits {
        max_items_in_row: row,
        step_max_items: 50_000.max(4 * row),
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// Compiles schemas for one tokenizer and hands out constraints. Cloning shares the compiled
/// grammars: a server's threads and its engine use one set.
#[derive(Clone)]
pub struct Grammars(Arc<Shared>);

struct Shared {
    tokenizer: Tokenizer,
    vocab: usize,
    /// Built on the first schema: the token trie takes a moment, and most runs need none.
    factory: OnceLock<Result<ParserFactory, SchemaError>>,
    pool: OnceLock<Result<rayon::ThreadPool, SchemaError>>,
    /// A fresh matcher per schema, or why the schema was refused.
    compiled: Mutex<lru::LruCache<SchemaId, Result<Matcher, SchemaError>>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("compiled", &self.lock().len())
            .finish()
    }
}

impl Grammars {
    /// Grammars over `tokenizer`'s tokens (padded to the model's `vocab_size`), with the
    /// model's end-of-turn ids as the grammar's end.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Self {
        Self(Arc::new(Shared {
            tokenizer: tokenizer.clone(),
            vocab: vocab_size,
            factory: OnceLock::new(),
            pool: OnceLock::new(),
            compiled: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(MAX_COMPILED).expect("invariant: a positive constant"),
            )),
        }))
    }

    /// Compiles `schema` (on the compile pool) unless it is compiled already, so that a
    /// constraint for it comes at once; says why it cannot be used.
    pub fn prepare(&self, schema: &Schema) -> Result<(), SchemaError> {
        self.compiled(schema).map(drop)
    }

    /// A constraint for `schema`, compiled on first sight of that schema.
    pub fn constraint(&self, schema: &Schema) -> Result<Constraint, SchemaError> {
        self.compiled(schema).map(|matcher| Constraint {
            matcher: Box::new(matcher),
            schema: schema.clone(),
        })
    }

    fn compiled(&self, schema: &Schema) -> Result<Matcher, SchemaError> {
        if let Some(known) = self.lock().get(&schema.id()) {
            return known.clone();
        }
        let compiled = self.compile(schema);
        self.lock().put(schema.id(), compiled.clone());
        compiled
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, lru::LruCache<SchemaId, Result<Matcher, SchemaError>>> {
        self.0.compiled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compiles on the pool's deep stack; a panic in the compiler refuses the schema.
    fn compile(&self, schema: &Schema) -> Result<Matcher, SchemaError> {
        let pool = self
            .0
            .pool
            .get_or_init(compile_pool)
            .as_ref()
            .map_err(Clone::clone)?;
        let shared = &self.0;
        pool.install(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let factory = shared
                    .factory
                    .get_or_init(|| factory(&shared.tokenizer, shared.vocab))
                    .as_ref()
                    .map_err(Clone::clone)?;
                compile(factory, schema)
            }))
            .unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("no message");
                Err(SchemaError::Grammar(format!(
                    "the grammar compiler failed on this schema ({why})"
                )))
            })
        })
    }
}

fn compile_pool() -> Result<rayon::ThreadPool, SchemaError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(COMPILE_THREADS)
        .stack_size(COMPILE_STACK)
        .thread_name(|i| format!("throng-grammar-{i}"))
        .build()
        .map_err(|e| SchemaError::Setup(format!("cannot start the grammar compile threads: {e}")))
}

/// The token trie of `tokenizer` and llguidance's parser factory over it.
fn factory(tokenizer: &Tokenizer, vocab_size: usize) -> Result<ParserFactory, SchemaError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| SchemaError::Setup(format!("{what}: {e}"));
    // toktrie_hf_tokenizers is built on an older `tokenizers` than the engine; the JSON
    // form of the tokenizer is what both versions share.
    let json = tokenizer
        .inner()
        .to_string(false)
        .map_err(|e| setup("cannot serialise the tokenizer", &e))?;
    let mut bytes = toktrie_hf_tokenizers::ByteTokenizer::from_json_bytes(json.as_bytes())
        .map_err(|e| setup("cannot build a token trie from the tokenizer", &e))?;
    // Bytes the grammar forces are text (a property or tool name such as `<|im_end|>`): the
    // template's control tokens must not be matched in them, or the forced token would be
    // the control token, whose bytes the trie marks as special, and the bytes not match.
    bytes.hf_tokenizer.set_encode_special_tokens(true);
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
        .map_err(|e| setup("cannot build a token trie from the tokenizer", &e))?;
    let mut factory = ParserFactory::new(
        &env,
        Default::default(),
        &llguidance::earley::SlicedBiasComputer::general_slices(),
    )
    .map_err(|e| setup("cannot set up the grammar engine", &e))?;
    factory.quiet();
    *factory.limits_mut() = parser_limits();
    Ok(factory)
}

/// `schema`'s grammar, checked against the limits first and its first mask computed (on a
/// copy), so that a schema that admits no value, or whose start is wider than the decoder
/// takes, is refused when it arrives rather than at its first step.
fn compile(factory: &ParserFactory, schema: &Schema) -> Result<Matcher, SchemaError> {
    let value = schema.value();
    if !value.is_object() {
        return Err(SchemaError::NotAnObject(shown(value)));
    }
    limits::check(value)?;
    let grammar = match schema.frame() {
        None => TopLevelGrammar::from_json_schema(value.clone()),
        Some(frame) => {
            if let Otherwise::Json(other) = &frame.otherwise {
                if !other.is_object() {
                    return Err(SchemaError::NotAnObject(shown(other)));
                }
                limits::check(other)?;
            }
            TopLevelGrammar::from_lark(frame.lark(value))
        }
    };
    let parser = factory
        .create_parser(grammar)
        .map_err(|e| SchemaError::from_grammar(&e.to_string()))?;
    let matcher = Matcher::new(Ok(parser));
    if let Some(e) = matcher.get_error() {
        return Err(SchemaError::from_grammar(&e));
    }
    let mut first = matcher.deep_clone();
    match first.compute_mask() {
        Ok(mask) if mask.is_zero() => Err(SchemaError::Empty),
        Ok(_) => Ok(matcher),
        Err(e) => Err(SchemaError::from_grammar(&e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::constraint::frame::{Frame, Mark, Otherwise};
    use crate::engine::tokenizer::Tokenizer;

    fn grammars() -> (Grammars, Tokenizer) {
        let json = crate::model::synthetic::byte_tokenizer_json().to_string();
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let tokenizer = Tokenizer::new(inner, vec![257]);
        let vocab = tokenizer.vocab_size();
        (Grammars::new(&tokenizer, vocab), tokenizer)
    }

    #[test]
    fn words_beside_a_framed_call_may_be_any_text_but_the_calls_opening() {
        let (grammars, tokenizer) = grammars();
        let frame = Frame {
            open: vec![Mark::Text("<tool_call>".into()), Mark::Text("\n".into())],
            close: vec![Mark::Text("\n".into()), Mark::Text("</tool_call>".into())],
            otherwise: Otherwise::Words,
        };
        let schema = Schema::framed(serde_json::json!({"type": "object"}), frame);
        let mut c = grammars.constraint(&schema).unwrap();
        // Every byte that begins a UTF-8 character (180 of the 256), and the end.
        let allowed = c.mask().unwrap().num_set();
        assert!(allowed >= 180, "{allowed} tokens allowed at the start");
        for t in tokenizer.encode("Hi <tool_call>", false).unwrap() {
            c.accept(t).unwrap();
        }
        assert!(c.mask().unwrap().num_set() >= 180);
        // But a reply that begins as a call goes on as one: after `{`, a key or `}`.
        let mut c = grammars.constraint(&schema).unwrap();
        for t in tokenizer.encode("<tool_call>\n{", false).unwrap() {
            c.accept(t).unwrap();
        }
        assert_eq!(c.mask().unwrap().num_set(), 2);
        // Words may not begin with the opening, spaces before it or not.
        let mut c = grammars.constraint(&schema).unwrap();
        for t in tokenizer.encode(" <tool_call>", false).unwrap() {
            c.accept(t).unwrap();
        }
        let mask = c.mask().unwrap();
        assert!(!mask.is_allowed(tokenizer.encode("\n", false).unwrap()[0]));
        assert!(mask.is_allowed(tokenizer.encode("x", false).unwrap()[0]));
    }
}
