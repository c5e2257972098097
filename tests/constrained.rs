//! Constrained decoding: whatever the model would say, a reply that finishes with `stop`
//! parses and validates against its schema.

mod common;

use common::TinyLlama;
use serde_json::json;
use throng::engine::{EngineConfig, FinishReason, Message, Request, RequestError};

#[test]
fn two_hundred_constrained_replies_of_a_random_model_all_validate() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut engine = common::engine(dir.path().to_str().unwrap(), EngineConfig::default());
    common::constrained::two_hundred_replies_validate(&mut engine);
}

#[test]
fn running_out_of_tokens_gives_length_with_the_partial_text() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut engine = common::engine(dir.path().to_str().unwrap(), EngineConfig::default());
    let schema = json!({"type": "object", "properties": {"reason": {"type": "string", "minLength": 40}},
                        "required": ["reason"]});
    let r = engine.generate(vec![
        Request::chat(vec![Message::user("why?")])
            .with_schema(schema)
            .with_max_tokens(20),
    ]);
    let r = r[0].as_ref().unwrap();
    assert_eq!(r.finish_reason, FinishReason::Length);
    assert_eq!(r.generated_tokens, 20);
    assert!(
        r.value.is_none(),
        "no value is claimed for an unfinished reply"
    );
    assert!(r.text.starts_with("{\"reason\": \""), "{:?}", r.text);
}

#[test]
fn schemas_the_decoder_cannot_compile_fail_at_submit_and_the_rest_complete() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut engine = common::engine(dir.path().to_str().unwrap(), EngineConfig::default());
    let ok = || Request::chat(vec![Message::user("hi")]).with_max_tokens(30);
    let results = engine.generate(vec![
        ok().with_schema(json!({"type": "object", "properties": {"a": {"type": "frobnicate"}}})),
        ok().with_schema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        ok().with_schema(json!("not a schema")),
        ok().with_schema(
            json!({"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}),
        ),
        ok(),
    ]);
    for (i, r) in results[..3].iter().enumerate() {
        match r {
            Err(RequestError::InvalidSchema(message)) => {
                assert!(!message.to_string().is_empty(), "request {i}")
            }
            other => panic!("request {i}: expected InvalidSchema, got {other:?}"),
        }
    }
    assert!(
        results[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("frobnicate")
    );
    assert_eq!(
        results[3].as_ref().unwrap().finish_reason,
        FinishReason::Stop
    );
    assert!(results[4].is_ok());
}

#[test]
fn smollm2_fills_a_decision_schema() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let mut engine = common::engine(path.to_str().unwrap(), EngineConfig::default());
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "number", "minimum": 0, "maximum": 50, "multipleOf": 0.1}},
        "required": ["city", "population_millions"], "additionalProperties": false});
    let r = engine.generate(vec![
        Request::chat(vec![Message::user(
            "What is the capital of France and its population? Answer in JSON.",
        )])
        .with_schema(schema.clone())
        .with_max_tokens(60),
    ]);
    let r = r[0].as_ref().unwrap();
    assert_eq!(r.finish_reason, FinishReason::Stop);
    let value = r.value.as_ref().unwrap();
    assert!(jsonschema::validator_for(&schema).unwrap().is_valid(value));
    assert!(value["city"].as_str().unwrap().contains("Paris"), "{value}");
}
