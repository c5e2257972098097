//! Shared test fixtures: the downloaded real assets and tiny random models.
#![allow(dead_code)]

pub mod constrained;
pub mod ragged;

use std::path::PathBuf;
use throng::engine::{Engine, EngineConfig};
use throng::model::{LoadOptions, WeightFormat, loader};
use throng::testing::TinyLlama;

/// An asset from the cache, downloading it if needed. Offline, the test is skipped with a
/// loud message, unless THRONG_REQUIRE_ASSETS=1 (as in CI), where it fails.
pub fn asset(name: &str, file: &str) -> Option<PathBuf> {
    match throng::assets::ensure_file(name, file) {
        Ok(path) => Some(path),
        Err(e) if std::env::var("THRONG_REQUIRE_ASSETS").is_ok_and(|v| v == "1") => {
            panic!("asset {name} is required (THRONG_REQUIRE_ASSETS=1): {e}")
        }
        Err(e) => {
            eprintln!(
                "\n{0}\nSKIPPED: asset {name} unavailable, probably offline: {e}\n{0}\n",
                "!".repeat(78)
            );
            None
        }
    }
}

pub fn smollm2() -> Option<PathBuf> {
    asset("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
}

pub fn llama3_tokenizer_dir() -> Option<PathBuf> {
    asset("llama3-tokenizer", "tokenizer.json").map(|p| p.parent().unwrap().to_path_buf())
}

/// A tiny random Llama written to a fresh temporary folder.
pub fn tiny_model(spec: &TinyLlama) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    spec.write(dir.path()).unwrap();
    dir
}

pub fn f32_options() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::F32,
        ..LoadOptions::default()
    }
}

/// An engine over the model at `spec` with a small KV cache.
pub fn engine(spec: &str, cfg: EngineConfig) -> Engine {
    let loaded = loader::load(spec, &f32_options()).unwrap();
    Engine::new(
        loaded,
        EngineConfig {
            kv_memory: cfg.kv_memory.or(Some(64 << 20)),
            ..cfg
        },
    )
    .unwrap()
}
