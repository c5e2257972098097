//! How large a schema the decoder takes: limits chosen on purpose and checked before the
//! grammar compiler sees a schema, so that what a schema costs to compile (the compiler's
//! stack and time) and to follow (the width of one mask) is bounded by throng, not by the
//! schema's author. Past a limit, the error names it, the place and what to do.
//!
//! The walk is iterative: a schema built in code (a Python dict, `serde_json::json!`) can be
//! nested deeper than any parser would have let through.

use serde_json::Value;

/// Properties of one object (its `properties` and `required` names together).
pub const MAX_PROPERTIES: usize = 4_096;
/// Subschemas in all, `$defs` included.
pub const MAX_NODES: usize = 20_000;
/// Subschemas inside subschemas.
pub const MAX_DEPTH: usize = 64;
/// Entries of one `anyOf`, `allOf`, `oneOf` or `prefixItems`.
pub const MAX_ALTERNATIVES: usize = 1_024;
/// Values of one `enum`.
pub const MAX_ENUM: usize = 4_096;
/// The JSON text of every `const` and `enum` value together, in bytes.
pub const MAX_LITERAL_BYTES: usize = 256 << 10;
/// One `pattern` or `patternProperties` key, in bytes.
pub const MAX_PATTERN_BYTES: usize = 4 << 10;

/// A schema past one of the limits above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the schema is too large for throng's decoder: {what} {found} at {at}, the most it takes is \
     {most}; {fix}"
)]
pub struct Limit {
    /// What was counted (`properties of one object`).
    pub what: &'static str,
    pub found: usize,
    pub most: usize,
    /// A JSON pointer to where (`/` is the root).
    pub at: String,
    pub fix: &'static str,
}

/// Keywords whose value is a schema.
const SCHEMA_VALUED: &[&str] = &[
    "additionalProperties",
    "items",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];
/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAYS: &[&str] = &["anyOf", "allOf", "oneOf", "prefixItems"];
/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Refuses the first limit `schema` passes.
pub fn check(schema: &Value) -> Result<(), Limit> {
    let mut walk = Walk {
        nodes: 0,
        literal_bytes: 0,
        stack: vec![(schema, String::new(), 0)],
    };
    while let Some((value, at, depth)) = walk.stack.pop() {
        if let Value::Object(object) = value {
            walk.visit(object, &at, depth)?;
        }
    }
    Ok(())
}

/// A walk over a schema's subschemas, with what it has counted so far.
struct Walk<'a> {
    nodes: usize,
    literal_bytes: usize,
    /// Subschemas still to visit: each with its pointer and depth.
    stack: Vec<(&'a Value, String, usize)>,
}

/// A limit passed at `at`.
fn over(what: &'static str, found: usize, most: usize, at: &str, fix: &'static str) -> Limit {
    Limit {
        what,
        found,
        most,
        at: if at.is_empty() { "/".into() } else { at.into() },
        fix,
    }
}

impl<'a> Walk<'a> {
    /// Checks one subschema, and queues the subschemas it holds.
    fn visit(
        &mut self,
        object: &'a serde_json::Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), Limit> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            let fix = "split the schema, or ask for fewer fields per reply";
            return Err(over("subschemas", self.nodes, MAX_NODES, at, fix));
        }
        if depth > MAX_DEPTH {
            return Err(over(
                "levels of nesting",
                depth,
                MAX_DEPTH,
                at,
                "flatten the schema",
            ));
        }
        let names = property_names(object);
        if names > MAX_PROPERTIES {
            let fix =
                "split the object into several requests, or group its fields into nested objects";
            return Err(over(
                "properties of one object",
                names,
                MAX_PROPERTIES,
                at,
                fix,
            ));
        }
        for (keyword, sub) in object {
            self.literals(keyword, sub, at)?;
            self.queue(keyword, sub, at, depth)?;
        }
        Ok(())
    }

    /// Counts the literal values and pattern lengths of one keyword.
    fn literals(&mut self, keyword: &str, sub: &Value, at: &str) -> Result<(), Limit> {
        match keyword {
            "enum" => {
                let n = sub.as_array().map_or(0, Vec::len);
                if n > MAX_ENUM {
                    let fix = "use a string with a pattern, or split the choice in two";
                    return Err(over("enum values", n, MAX_ENUM, at, fix));
                }
                self.literal_bytes += json_len(sub);
            }
            "const" => self.literal_bytes += json_len(sub),
            "pattern" => pattern(sub.as_str().map_or(0, str::len), at)?,
            _ => {}
        }
        if self.literal_bytes > MAX_LITERAL_BYTES {
            let fix = "a reply cannot be that long: shorten the values";
            let what = "bytes of const and enum values";
            return Err(over(what, self.literal_bytes, MAX_LITERAL_BYTES, at, fix));
        }
        Ok(())
    }

    /// Queues the subschemas one keyword holds.
    fn queue(
        &mut self,
        keyword: &str,
        sub: &'a Value,
        at: &str,
        depth: usize,
    ) -> Result<(), Limit> {
        let here = format!("{at}/{}", escape(keyword));
        if SCHEMA_VALUED.contains(&keyword) {
            self.stack.push((sub, here, depth + 1));
        } else if SCHEMA_ARRAYS.contains(&keyword) {
            let subs = sub.as_array().map_or(&[][..], Vec::as_slice);
            if subs.len() > MAX_ALTERNATIVES {
                let fix = "group the alternatives (an `enum` for constants, nested `anyOf`s)";
                let what = "entries of one list of schemas";
                return Err(over(what, subs.len(), MAX_ALTERNATIVES, &here, fix));
            }
            let items = subs.iter().enumerate();
            self.stack
                .extend(items.map(|(i, s)| (s, format!("{here}/{i}"), depth + 1)));
        } else if SCHEMA_MAPS.contains(&keyword) {
            for (name, s) in sub.as_object().into_iter().flatten() {
                if keyword == "patternProperties" {
                    pattern(name.len(), &here)?;
                }
                self.stack
                    .push((s, format!("{here}/{}", escape(name)), depth + 1));
            }
        }
        Ok(())
    }
}

/// Refuses a pattern of `len` bytes past [`MAX_PATTERN_BYTES`].
fn pattern(len: usize, at: &str) -> Result<(), Limit> {
    if len > MAX_PATTERN_BYTES {
        let fix = "write a shorter pattern";
        return Err(over("bytes of pattern", len, MAX_PATTERN_BYTES, at, fix));
    }
    Ok(())
}

/// The names an object schema lists: its `properties` and its `required` names, each once.
fn property_names(object: &serde_json::Map<String, Value>) -> usize {
    let properties = object.get("properties").and_then(Value::as_object);
    let listed = properties.map_or(0, serde_json::Map::len);
    let required_only = object
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| properties.is_none_or(|p| !p.contains_key(*name)))
        .count();
    listed + required_only
}

fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A JSON pointer's token for `name` (RFC 6901).
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}
