//! The 200-request constrained check, shared by tests/constrained.rs (on the CPU) and
//! tests/cuda.rs (on a GPU): whatever a random model would say, every reply finishes with
//! `stop`, parses, and validates against its schema.

use serde_json::{Value, json};
use throng::engine::{Engine, FinishReason, Message, Request, SamplingParams};

pub fn schemas() -> Vec<Value> {
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

/// Runs 200 constrained requests over five schemas, half greedy and half sampled, through
/// `engine` and checks every reply.
pub fn two_hundred_replies_validate(engine: &mut Engine) {
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
