//! LLM-written personas: written once per agent through the engine, cached on disk under a
//! hash of (profile, template, model, seed), and reused by a later run of the same population.
//! (A file of its own: it points THRONG_CACHE at a temporary folder for the whole process.)

mod common;

use common::TinyLlama;
use std::path::PathBuf;
use throng::sim::experiment::Overrides;
use throng::sim::runner::{Ended, SimOptions};

#[test]
fn personas_are_written_once_and_reused() {
    let cache = tempfile::tempdir().unwrap();
    // SAFETY: this test binary holds a single test; nothing else reads the environment.
    unsafe { std::env::set_var("THRONG_CACHE", cache.path()) };
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let templates = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("templates/guess");
    let config = tmp.path().join("exp.toml");
    std::fs::write(
        &config,
        format!(
            r#"templates = {:?}
name = "personas"
seed = 4
steps = 1
policy = "llm"
agents = 12

[llm]
max_tokens = 24

[scenario]
name = "guess"

[population.attributes.education]
shares = {{ school = 50, university = 50 }}

[population.personas]
max_tokens = 20
"#,
            templates.display().to_string()
        ),
    )
    .unwrap();
    let run = |name: &str| {
        let out = tmp.path().join(name);
        let engine = common::engine(
            model.path().to_str().unwrap(),
            throng::engine::EngineConfig::default(),
        );
        let (ended, _) = common::run_experiment(
            &config,
            // The CLI's default model names the persona cache, as in `throng run`.
            &Overrides {
                default_model: Some(throng::model::DEFAULT_MODEL.into()),
                ..Overrides::default()
            },
            &out,
            SimOptions::default(),
            Some(engine),
        );
        assert_eq!(ended, Ended::Finished);
        std::fs::read_to_string(out.join("decisions.jsonl")).unwrap()
    };
    let first = run("first");
    let files: Vec<PathBuf> = std::fs::read_dir(cache.path().join("personas"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one cache file for (template, model)");
    let cached = std::fs::read_to_string(&files[0]).unwrap();
    assert_eq!(cached.lines().count(), 12, "a persona per agent");
    // The second run asks the model for no persona: the cache is unchanged, and the prompts
    // (their hashes) are the same as the first run's.
    let second = run("second");
    assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), cached);
    let hashes = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt_hash"].to_string()
            })
            .collect()
    };
    assert_eq!(hashes(&first), hashes(&second));
}
