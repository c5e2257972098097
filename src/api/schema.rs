//! What a request's `response_format` and tools' `parameters` may say: the JSON Schema keywords
//! throng's constrained decoder enforces, and nothing else. llguidance refuses some keywords it
//! lacks but silently ignores any it does not know (a misspelt `maxLenght`, `nullable`, a
//! vendor's `x-` key), and an `x-guidance` object can turn its refusals into warnings; a
//! keyword ignored is a promise broken, so every schema is walked first and anything outside
//! the enforced set is refused, naming the keyword, where it is, and what to do instead.

use serde_json::Value;

/// Keywords the decoder enforces.
const ENFORCED: &[&str] = &[
    "type",
    "enum",
    "const",
    "anyOf",
    "allOf",
    "$ref",
    "$defs",
    "definitions",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "minProperties",
    "maxProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// Keywords that only describe, and so constrain nothing.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "$schema",
    "$id",
    "$anchor",
    "readOnly",
    "writeOnly",
    "deprecated",
    "contentMediaType",
    "contentEncoding",
];

/// Keywords whose value is a schema.
const SCHEMA_VALUED: &[&str] = &["additionalProperties", "items", "additionalItems"];
/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAYS: &[&str] = &["anyOf", "allOf", "prefixItems"];
/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];

/// A schema keyword the decoder cannot enforce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{keyword:?} at {pointer} cannot be enforced by throng's constrained decoder: {fix}")]
pub struct Unenforceable {
    pub keyword: String,
    /// A JSON pointer into the schema (`""` is its root, written `/`).
    pub pointer: String,
    pub fix: String,
}

/// Refuses the first keyword of `schema` the decoder does not enforce.
pub fn check(schema: &Value) -> Result<(), Unenforceable> {
    walk(schema, &mut String::new())
}

fn walk(schema: &Value, pointer: &mut String) -> Result<(), Unenforceable> {
    let object = match schema {
        // `true` and `false` are schemas too.
        Value::Bool(_) => return Ok(()),
        Value::Object(object) => object,
        _ => {
            return Err(Unenforceable {
                keyword: String::new(),
                pointer: shown(pointer),
                fix: "a schema is an object (or true or false); give one".into(),
            });
        }
    };
    for (keyword, value) in object {
        if !ENFORCED.contains(&keyword.as_str()) && !ANNOTATIONS.contains(&keyword.as_str()) {
            return Err(Unenforceable {
                keyword: keyword.clone(),
                pointer: shown(pointer),
                fix: fix(keyword),
            });
        }
        // JSON Schema: "The value of multipleOf MUST be a number, strictly greater than 0."
        if keyword == "multipleOf" && !value.as_f64().is_some_and(|m| m > 0.0) {
            return Err(Unenforceable {
                keyword: keyword.clone(),
                pointer: shown(pointer),
                fix: format!("multipleOf is a number above 0, not {value}"),
            });
        }
        let len = pointer.len();
        pointer.push('/');
        pointer.push_str(&escape(keyword));
        if SCHEMA_VALUED.contains(&keyword.as_str()) {
            if matches!(value, Value::Object(_) | Value::Bool(_)) {
                walk(value, pointer)?;
            } else if keyword == "items" {
                // Draft 4 to 2019's array form of `items` is `prefixItems` today.
                return Err(Unenforceable {
                    keyword: keyword.clone(),
                    pointer: shown(&pointer[..len]),
                    fix: "an array of schemas under \"items\" is the old form of \
                          \"prefixItems\": write that instead"
                        .into(),
                });
            }
        } else if SCHEMA_ARRAYS.contains(&keyword.as_str()) {
            for (i, sub) in value.as_array().into_iter().flatten().enumerate() {
                let at = pointer.len();
                pointer.push_str(&format!("/{i}"));
                walk(sub, pointer)?;
                pointer.truncate(at);
            }
        } else if SCHEMA_MAPS.contains(&keyword.as_str()) {
            for (name, sub) in value.as_object().into_iter().flatten() {
                let at = pointer.len();
                pointer.push('/');
                pointer.push_str(&escape(name));
                walk(sub, pointer)?;
                pointer.truncate(at);
            }
        }
        pointer.truncate(len);
    }
    Ok(())
}

/// What to do instead of `keyword`.
fn fix(keyword: &str) -> String {
    match keyword {
        "oneOf" => "write \"anyOf\" (the decoder cannot hold a reply to exactly one \
                    alternative; alternatives that do not overlap make them the same)"
            .into(),
        "not" | "if" | "then" | "else" | "dependentRequired" | "dependentSchemas"
        | "dependencies" => "remove it and check the reply after it arrives, or write the \
                             allowed shapes out with \"anyOf\""
            .into(),
        "uniqueItems" | "contains" | "minContains" | "maxContains" => {
            "remove it and check the reply after it arrives, or use \"enum\" items with \
             \"maxItems\""
                .into()
        }
        "nullable" => {
            "write \"type\": [\"...\", \"null\"] or \"anyOf\" with {\"type\": \"null\"}".into()
        }
        "x-guidance" => "remove it: throng sets the decoder's options itself".into(),
        _ => "remove it (a keyword the decoder does not know would be ignored, so it is \
              refused; check the spelling)"
            .into(),
    }
}

/// A JSON pointer's token for `name` (RFC 6901).
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn shown(pointer: &str) -> String {
    if pointer.is_empty() {
        "/".into()
    } else {
        pointer.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(schema: Value) -> (String, String) {
        let e = check(&schema).unwrap_err();
        (e.keyword, e.pointer)
    }

    #[test]
    fn every_enforced_keyword_passes() {
        let schema = json!({
            "type": "object",
            "title": "decision",
            "$defs": {"price": {"type": "number", "minimum": 0, "exclusiveMaximum": 10.5}},
            "properties": {
                "price": {"$ref": "#/$defs/price"},
                "mix": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
                "pair": {"type": "array", "prefixItems": [{"type": "integer", "multipleOf": 2}]},
                "reason": {"type": "string", "maxLength": 80, "pattern": "^[a-z ]*$"},
                "either": {"anyOf": [{"const": 1}, {"type": "null"}]},
                "meta": {"type": "object", "additionalProperties": false, "patternProperties": {"^x": true}}
            },
            "required": ["price"],
            "additionalProperties": false
        });
        check(&schema).unwrap();
    }

    #[test]
    fn a_keyword_the_decoder_cannot_enforce_is_named_with_its_place() {
        let schema = json!({"type": "object", "properties": {
            "tags": {"type": "array", "uniqueItems": true}
        }});
        assert_eq!(
            refused(schema),
            ("uniqueItems".into(), "/properties/tags".into())
        );
        assert_eq!(
            refused(json!({"oneOf": [{"type": "integer"}]})),
            ("oneOf".into(), "/".into())
        );
        assert_eq!(
            refused(json!({"anyOf": [{"type": "string"}, {"not": {"const": ""}}]})),
            ("not".into(), "/anyOf/1".into())
        );
    }

    #[test]
    fn a_misspelt_or_vendor_keyword_is_refused_rather_than_ignored() {
        let schema = json!({"properties": {"a/b": {"type": "string", "maxLenght": 3}}});
        assert_eq!(
            refused(schema),
            ("maxLenght".into(), "/properties/a~1b".into())
        );
        assert_eq!(
            refused(json!({"type": "string", "nullable": true})).0,
            "nullable"
        );
        assert_eq!(
            refused(json!({"x-guidance": {"lenient": true}})).0,
            "x-guidance"
        );
    }

    #[test]
    fn property_names_are_not_keywords() {
        check(&json!({"properties": {"not": {"type": "string"}, "oneOf": true}})).unwrap();
    }

    #[test]
    fn the_old_array_form_of_items_is_refused_with_its_new_name() {
        let e = check(&json!({"items": [{"type": "string"}]})).unwrap_err();
        assert!(e.fix.contains("prefixItems"), "{e}");
    }
}
