//! Bad input gets an error that names the problem and the fix, never a panic.

mod common;

use common::TinyLlama;
use throng::engine::{EngineConfig, Message, Request, RequestError};
use throng::model::{ModelError, loader};

fn load_err(spec: &str) -> String {
    match loader::load(spec, &common::f32_options()) {
        Ok(_) => panic!("loading {spec} should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_truncated_gguf_is_reported_as_truncated() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, keep) in [
        ("cut-in-tensors.gguf", bytes.len() / 2),
        ("cut-in-header.gguf", 200),
    ] {
        let cut = dir.path().join(name);
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        let err = load_err(cut.to_str().unwrap());
        assert!(err.contains("truncated") && err.contains(name), "{err}");
    }
}

#[test]
fn a_safetensors_folder_missing_a_tensor_names_it() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut weights = TinyLlama::default().weights().unwrap();
    weights.remove("model.layers.1.mlp.down_proj.weight");
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path().to_str().unwrap());
    assert!(
        err.contains("model.layers.1.mlp.down_proj.weight") && err.contains("re-download"),
        "{err}"
    );
}

#[test]
fn a_config_of_another_architecture_is_refused_by_name() {
    let dir = common::tiny_model(&TinyLlama::default());
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("LlamaForCausalLM", "GPTNeoXForCausalLM");
    std::fs::write(&path, text).unwrap();
    match loader::load(dir.path().to_str().unwrap(), &common::f32_options()) {
        Err(ModelError::UnsupportedArchitecture { message, .. }) => {
            assert!(
                message.contains("GPTNeoXForCausalLM") && message.contains("Llama"),
                "{message}"
            )
        }
        other => panic!("expected an architecture error, got {other:?}"),
    }
}

#[test]
fn a_malformed_config_names_its_line() {
    let dir = common::tiny_model(&TinyLlama::default());
    std::fs::write(
        dir.path().join("config.json"),
        "{\n  \"hidden_size\": 64,\n  \"vocab_size\": oops\n}",
    )
    .unwrap();
    let err = load_err(dir.path().to_str().unwrap());
    assert!(
        err.contains("config.json") && err.contains("line 3"),
        "{err}"
    );
}

#[test]
fn an_unknown_model_name_lists_the_presets() {
    let err = load_err("llama-7-gigantic");
    assert!(err.contains("unknown model `llama-7-gigantic`"), "{err}");
    assert!(
        err.contains("llama-3.2-3b-instruct") && err.contains("throng models"),
        "{err}"
    );
}

#[test]
fn a_prompt_longer_than_the_context_fails_alone() {
    let spec = TinyLlama {
        max_position_embeddings: 64,
        ..TinyLlama::default()
    };
    let dir = common::tiny_model(&spec);
    let mut engine = common::engine(dir.path().to_str().unwrap(), EngineConfig::default());
    let results = engine.generate(vec![
        Request::chat(vec![Message::user("x".repeat(200))]).with_max_tokens(4),
        Request::chat(vec![Message::user("hi")]).with_max_tokens(4),
        Request::chat(vec![]).with_max_tokens(4),
    ]);
    match &results[0] {
        Err(e @ RequestError::PromptTooLong { limit: 64, .. }) => {
            assert!(e.to_string().contains("shorten"), "{e}")
        }
        other => panic!("expected PromptTooLong, got {other:?}"),
    }
    assert_eq!(results[1].as_ref().unwrap().generated_tokens, 4);
    assert_eq!(results[2], Err(RequestError::EmptyMessages));
}
