use serde_json::json;
use throng::engine::{Engine, EngineConfig, Message, Request};
use throng::model::{LoadOptions, loader};
include!("/tmp/rules_only.rs");
fn main() {
    let path =
        throng::assets::ensure_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
            .unwrap();
    let loaded = loader::load(path.to_str().unwrap(), &LoadOptions::default()).unwrap();
    let mut engine = Engine::new(
        loaded,
        EngineConfig {
            kv_memory: Some(2 << 30),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let schema = json!({"type": "object", "properties": {
        "production_change": {"type": "integer", "minimum": -50, "maximum": 50},
        "energy_price_change": {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.1},
        "upgrade_capacity": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 40}},
        "required": ["production_change", "energy_price_change", "upgrade_capacity", "reason"], "additionalProperties": false});
    for step in 0..2 {
        let reqs: Vec<Request> = (0..64)
            .map(|a| {
                Request::chat(vec![
                    Message::system(RULES),
                    Message::user(format!(
                        "Step {step}. You are company {a}. Resources {}, price {}.",
                        1000 + a * 37,
                        50 + a % 7
                    )),
                ])
                .with_schema(schema.clone())
                .with_max_tokens(80)
            })
            .collect();
        let t = std::time::Instant::now();
        let r = engine.generate(reqs);
        let steps = engine.take_step_metrics();
        let fwd: f64 = steps.iter().map(|s| s.forward.as_secs_f64()).sum();
        eprintln!(
            "step {step}: {:?}, {} engine steps, forward {fwd:.2}s, ok {}",
            t.elapsed(),
            steps.len(),
            r.iter().filter(|x| x.is_ok()).count()
        );
        for s in steps.iter().take(3) {
            eprintln!("  {:?}", s);
        }
    }
}
