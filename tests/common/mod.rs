//! Shared test fixtures: the downloaded real assets and tiny random models (`tiny`), the CUDA
//! device or a skip (`cuda`); `cli` runs the built binary.
#![allow(dead_code)]

pub mod api;
pub mod book;
pub mod cli;
pub mod constrained;
pub mod cuda;
pub mod mpi;
pub mod ragged;
pub mod regression;
pub mod skip;
pub mod sources;
pub mod tiny;

pub use skip::loud_skip;
pub use tiny::TinyLlama;

use std::path::PathBuf;
use throng::engine::{Engine, EngineConfig};
use throng::model::{LoadOptions, WeightFormat, loader};

/// An asset from the cache, downloading it if needed. Offline, the test is skipped with a
/// loud message, unless THRONG_REQUIRE_ASSETS=1 (as in CI), where it fails.
pub fn asset(name: &str, file: &str) -> Option<PathBuf> {
    match throng::assets::ensure_file(name, file) {
        Ok(path) => Some(path),
        Err(e) if std::env::var("THRONG_REQUIRE_ASSETS").is_ok_and(|v| v == "1") => {
            panic!("asset {name} is required (THRONG_REQUIRE_ASSETS=1): {e}")
        }
        Err(e) => {
            loud_skip(&format!("asset {name} unavailable, probably offline: {e}"));
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

/// A tiny random Llama written to a fresh temporary folder, with the same weights as a GGUF
/// file of Q4_1 matrices beside them ([`TINY_GGUF`]), for the formats that keep a GGUF file's
/// blocks.
pub fn tiny_model(spec: &TinyLlama) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    spec.write(dir.path()).unwrap();
    spec.write_gguf_as(
        &dir.path().join(TINY_GGUF),
        false,
        candle_core::quantized::GgmlDType::Q4_1,
    )
    .unwrap();
    dir
}

/// The GGUF copy of a tiny model in its folder.
pub const TINY_GGUF: &str = "tiny-q4_1.gguf";

/// What loads the model at `spec` as `weights`: the spec itself, or, for a tiny model's
/// folder under a format that keeps a GGUF file's blocks, its GGUF copy with the folder's
/// tokenizer.
pub fn load_options(spec: &str, weights: WeightFormat) -> (String, LoadOptions) {
    let dir = std::path::Path::new(spec);
    let keeps_blocks = matches!(weights, WeightFormat::Gguf | WeightFormat::Gguf8);
    if keeps_blocks && dir.join(TINY_GGUF).is_file() {
        let opts = LoadOptions {
            weights,
            tokenizer: Some(dir.join("tokenizer.json")),
            ..LoadOptions::default()
        };
        return (dir.join(TINY_GGUF).to_str().unwrap().to_string(), opts);
    }
    let opts = LoadOptions {
        weights,
        ..LoadOptions::default()
    };
    (spec.to_string(), opts)
}

pub fn f32_options() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::F32,
        ..LoadOptions::default()
    }
}

/// Every format `--weights auto` can choose on a CPU: where the CPU has a SIMD integer
/// kernel, gguf for a GGUF file (a tiny model's folder is loaded from its GGUF copy for it,
/// [`load_options`]) and int8 for any other, else f32, or bf16 for a model too large for f32.
pub const AUTO_CPU_FORMATS: [WeightFormat; 4] = [
    WeightFormat::Gguf,
    WeightFormat::Int8,
    WeightFormat::F32,
    WeightFormat::Bf16,
];

/// The formats engine guarantees (batch invariance, prefix caching, preemption) are checked
/// under: `auto`'s choices and gguf8, gguf with 8-bit activations.
pub const CPU_FORMATS: [WeightFormat; 5] = [
    WeightFormat::Gguf,
    WeightFormat::Gguf8,
    WeightFormat::Int8,
    WeightFormat::F32,
    WeightFormat::Bf16,
];

/// An engine over the model at `spec` with f32 weights and a small KV cache.
pub fn engine(spec: &str, cfg: EngineConfig) -> Engine {
    engine_with(spec, cfg, WeightFormat::F32)
}

/// An engine over the model at `spec` with `weights` and a small KV cache.
pub fn engine_with(spec: &str, cfg: EngineConfig, weights: WeightFormat) -> Engine {
    let (spec, opts) = load_options(spec, weights);
    let loaded = loader::load(&spec, &opts).unwrap();
    Engine::new(
        loaded,
        EngineConfig {
            kv_memory: cfg.kv_memory.or(Some(64 << 20)),
            ..cfg
        },
    )
    .unwrap()
}

/// Runs (or resumes) the experiment at `config` into `out` as `throng run` does, with the
/// scripted policy unless an engine is given. Returns how it ended and the manifest.
pub fn run_experiment(
    config: &std::path::Path,
    overrides: &throng::sim::experiment::Overrides,
    out: &std::path::Path,
    options: throng::sim::runner::SimOptions,
    engine: Option<Engine>,
) -> (throng::sim::runner::Ended, throng::record::Manifest) {
    use throng::record::{self, Manifest};
    let mut loaded = throng::scenarios::Registry::builtin()
        .load(config, overrides)
        .unwrap();
    let mut manifest = if options.resume {
        loaded.resume_from(out).unwrap();
        record::read_json(&out.join(record::MANIFEST)).unwrap()
    } else {
        std::fs::create_dir_all(out).unwrap();
        let exp = loaded.experiment();
        Manifest {
            name: exp.config.name.clone(),
            scenario: exp.scenario.clone(),
            policy: exp.policy_label(),
            arms: exp.arms.iter().map(|a| a.name.clone()).collect(),
            populations: exp.config.agents.0.clone(),
            replicates: exp.config.replicates.0,
            steps: exp.config.steps.0,
            ..Manifest::default()
        }
    };
    let exp = loaded.experiment();
    let mut llm = engine.map(|e| {
        throng::sim::policy::Llm::new(
            e,
            throng::scenarios::Registry::builtin().prompts(exp).unwrap(),
            exp.config.history,
            exp.config.llm.wave,
        )
    });
    let ended = loaded
        .run(llm.as_mut(), out, &mut manifest, &options, &mut |_| {})
        .unwrap();
    if ended == throng::sim::runner::Ended::Finished {
        manifest.status = record::Status::Finished;
    }
    record::write_json_atomic(&out.join(record::MANIFEST), &manifest).unwrap();
    (ended, manifest)
}
