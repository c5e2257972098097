//! Constrained decoding: whatever the model would say, a reply that finishes with `stop`
//! parses and validates against its schema.

mod common;

use serde_json::{Value, json};
use throng::engine::{EngineConfig, FinishReason, Message, Request, RequestError, SamplingParams};
use throng::testing::TinyLlama;

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {
            "production_change": {"type": "number", "minimum": -50, "maximum": 50, "multipleOf": 0.5},
            "energy_price_change": {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.01}},
            "required": ["production_change", "energy_price_change"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "guess": {"type": "integer", "minimum": 0, "maximum": 100}},
            "required": ["guess"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "upgrade_capacity": {"type": "boolean"},
            "persona": {"enum": ["environmentally conscious", "greedy", "depressed"]}},
            "required": ["upgrade_capacity", "persona"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "reason": {"type": "string", "minLength": 3, "maxLength": 24},
            "mix": {"type": "integer", "minimum": 0, "maximum": 10}},
            "required": ["reason", "mix"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "plan": {"type": "object", "properties": {
                "price": {"type": "number", "minimum": 0, "maximum": 0.25, "multipleOf": 0.001},
                "buy": {"type": "integer", "minimum": 0, "maximum": 2000}},
                "required": ["price", "buy"], "additionalProperties": false},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
            "required": ["plan", "tags"], "additionalProperties": false}),
    ]
}

#[test]
fn two_hundred_constrained_replies_of_a_random_model_all_validate() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut engine = common::engine(dir.path().to_str().unwrap(), EngineConfig::default());
    let schemas = schemas();
    let requests: Vec<Request> = (0..200)
        .map(|i| {
            // Half greedy, half sampled with their own seeds, so that the grammar meets many
            // different choices. Numbers carry `multipleOf`: JSON allows endless decimals,
            // and a random model writes them (a `length` finish, never a bad value).
            let sampling = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 1.0,
                    seed: i as u64,
                    ..SamplingParams::default()
                }
            };
            Request::chat(vec![Message::user(format!("agent {i}: decide"))])
                .with_schema(schemas[i % schemas.len()].clone())
                .with_sampling(sampling)
                .with_max_tokens(400)
        })
        .collect();
    let results = engine.generate(requests);
    let validators: Vec<_> = schemas
        .iter()
        .map(|s| jsonschema::validator_for(s).unwrap())
        .collect();
    for (i, result) in results.iter().enumerate() {
        let response = result
            .as_ref()
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(
            response.finish_reason,
            FinishReason::Stop,
            "request {i}: {:?}",
            response.text
        );
        let parsed: Value = serde_json::from_str(&response.text).unwrap();
        assert_eq!(response.value.as_ref(), Some(&parsed));
        let errors: Vec<String> = validators[i % schemas.len()]
            .iter_errors(&parsed)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "request {i}: {} violates its schema: {errors:?}",
            response.text
        );
    }
    let totals = engine.totals();
    assert!(
        totals.forced_tokens > 0,
        "keys and punctuation are fast-forwarded"
    );
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
                assert!(!message.is_empty(), "request {i}")
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
