//! `throng api` under hostile and careless input (issue 41): whatever a request holds, the
//! server answers it (a 4xx naming the problem, or a valid reply) and lives on for the next
//! client; a store loses no reply. Each test is named after the failure it guards against.

mod common;

use common::api::*;
use serde_json::{Value, json};
use throng::api::ApiOptions;

/// A chat request whose reply is held to `schema`.
fn with_schema(schema: Value) -> Value {
    let mut body = chat("answer in JSON");
    body["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}});
    body
}

/// The server still answers an ordinary request.
fn alive(api: &Api) {
    let (status, body) = post(api, "/chat/completions", &chat("still there?"));
    assert_eq!(status, 200, "the server stopped answering: {body}");
}

fn object_requiring(names: usize) -> Value {
    let names: Vec<String> = (0..names).map(|i| format!("p{i}")).collect();
    json!({"type": "object", "required": names})
}

fn object_with_optional(properties: usize) -> Value {
    let properties: serde_json::Map<String, Value> = (0..properties)
        .map(|i| (format!("field_{i}"), json!({"type": "integer"})))
        .collect();
    json!({"type": "object", "properties": properties, "additionalProperties": false})
}

/// `$ref`s `d0 -> d1 -> ... -> d{n}`, the last an integer.
fn ref_chain(n: usize) -> Value {
    let mut defs: serde_json::Map<String, Value> = (0..n)
        .map(|i| {
            (
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            )
        })
        .collect();
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn refused_naming(api: &Api, body: &Value, param: &str, words: &[&str]) {
    let (status, reply) = post(api, "/chat/completions", body);
    assert_eq!(status, 400, "{reply}");
    let (message, given_param, _) = error_of(&reply);
    assert_eq!(given_param, Some(param), "{message}");
    for w in words {
        assert!(message.contains(w), "{w:?} not in {message}");
    }
    for internal in ["<state>", "Parser", "grm_prefix", "non-verbose"] {
        assert!(!message.contains(internal), "parser internals in {message}");
    }
    alive(api);
}

// Issue 41 A1: 7,000 required names, a chain of 1,000 `$ref`s and 8,000 optional properties
// overflowed the engine thread's stack inside the grammar compiler and aborted the process.
#[test]
fn a_schema_that_overflowed_the_engine_threads_stack_no_longer_kills_the_server() {
    let api = start(64);
    refused_naming(
        &api,
        &with_schema(object_requiring(7_000)),
        "response_format",
        &["properties of one object", "7000", "4096"],
    );
    refused_naming(
        &api,
        &with_schema(object_with_optional(8_000)),
        "response_format",
        &["properties of one object", "8000"],
    );
    let (status, reply) = post(&api, "/chat/completions", &with_schema(ref_chain(1_000)));
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        text.is_empty()
            || text
                .trim_start_matches('-')
                .starts_with(|c: char| c.is_ascii_digit()),
        "{text:?}"
    );
    // Within the limits, the deepest recursion the compiler makes.
    let (status, reply) = post(
        &api,
        "/chat/completions",
        &with_schema(object_requiring(4_096)),
    );
    assert_eq!(status, 200, "{reply}");
    // The same schemas as a tool's parameters are the tools' fault.
    let mut body = chat("call it");
    body["tools"] = json!([{"type": "function", "function": {
        "name": "fill", "parameters": object_requiring(7_000)}}]);
    body["tool_choice"] = json!("required");
    refused_naming(&api, &body, "tools", &["properties of one object"]);
    alive(&api);
}

// Issue 41 B4: an object of 500 optional properties passed llguidance's default grammar width
// (2,000 items in a row) and answered 500. A form that size is a real schema.
#[test]
fn a_form_of_500_or_4096_optional_fields_is_answered_within_its_schema() {
    let api = start(64);
    for n in [500, 4_096] {
        let schema = object_with_optional(n);
        let mut body = with_schema(schema.clone());
        body["max_tokens"] = json!(60);
        body["temperature"] = json!(0);
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 200, "{n}: {reply}");
        let choice = &reply["choices"][0];
        if choice["finish_reason"] == "stop" {
            let value: Value =
                serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
            assert!(
                jsonschema::validator_for(&schema).unwrap().is_valid(&value),
                "{value}"
            );
        }
    }
}

// Issue 41 B3, B4: a self-referential `$ref`, 5,000 `anyOf` alternatives and a 1 MB `const`
// answered 500 with the parser's internal state.
#[test]
fn schemas_past_the_decoders_limits_are_a_400_naming_the_limit_without_parser_internals() {
    let api = start(64);
    refused_naming(
        &api,
        &with_schema(json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})),
        "response_format",
        &["admits no value"],
    );
    let alternatives: Vec<Value> = (0..5_000)
        .map(|i| json!({"type": "object", "properties": {format!("k{i}"): {"type": "integer"}}}))
        .collect();
    refused_naming(
        &api,
        &with_schema(json!({"anyOf": alternatives})),
        "response_format",
        &["entries of one list of schemas", "5000", "/"],
    );
    refused_naming(
        &api,
        &with_schema(json!({"const": "a".repeat(1 << 20)})),
        "response_format",
        &["bytes of const and enum values"],
    );
    let mut deep = json!({"type": "integer"});
    for _ in 0..70 {
        deep = json!({"allOf": [deep]});
    }
    let (status, reply) = post(&api, "/chat/completions", &with_schema(deep));
    assert_eq!(status, 400, "{reply}");
    alive(&api);
}

// A `const` of 50,000 characters was forced whole and prefilled before the reply was cut at
// its 16 tokens (minutes on a CPU, the engine busy for every client meanwhile).
#[test]
fn a_long_const_is_forced_only_as_far_as_the_replys_room() {
    let api = start(64);
    let (status, reply) = post(
        &api,
        "/chat/completions",
        &with_schema(json!({"const": "a".repeat(50_000)})),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    assert_eq!(reply["usage"]["completion_tokens"], 16);
    let forced = stats(&api)["engines"][0]["status"]["forced_tokens"]
        .as_u64()
        .unwrap();
    assert!(forced <= 16, "{forced} tokens forced for a 16-token reply");
    // A schema with one valid reply is that reply, ended by the grammar.
    let (status, reply) = post(
        &api,
        "/chat/completions",
        &with_schema(json!({"const": "v"})),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["message"]["content"], "\"v\"");
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
}

// Issue 41 D10: once another process opened the store, the server stopped storing for the
// rest of its life (one warning, clients saw 200, 15 of 20 replies gone).
#[test]
fn a_storing_server_keeps_every_reply_while_a_reader_is_opened_and_closed_beside_it() {
    let model = common::tiny_model(&common::TinyLlama::default());
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let api = start_on(
        model.path(),
        ApiOptions {
            store: Some(store.clone()),
            ..options(64)
        },
    )
    .unwrap();
    for i in 0..20 {
        let (status, body) = post(&api, "/chat/completions", &chat(&format!("turn {i}")));
        assert_eq!(status, 200, "{body}");
        if i == 5 {
            // Another process's reader is refused at its start, saying why.
            let e = throng::record::store::Source::open(&store).err().unwrap();
            assert!(e.to_string().contains("in use by another process"), "{e}");
        }
    }
    drop(api);
    let source = throng::record::store::Source::open(&store).unwrap();
    assert_eq!(source.len, 20, "every reply stored");
}
