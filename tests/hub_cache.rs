//! A Hugging Face repo id resolves through hf-hub's cache layout, offline: the code path that
//! serves `meta-llama/Llama-3.2-3B-Instruct` on a user's machine. (Its own test binary,
//! because it sets HF_HOME for the process.)

mod common;

use common::TinyLlama;
use throng::engine::{EngineConfig, Message, Request};
use throng::model::{ModelSource, loader};

#[test]
fn a_repo_id_loads_from_the_hugging_face_cache_offline() {
    let home = tempfile::tempdir().unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = home.path().join("hub").join("models--test-org--tiny-llama");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), commit).unwrap();
    TinyLlama::default()
        .write(&repo.join("snapshots").join(commit))
        .unwrap();
    // SAFETY: this test binary has a single test, so no other thread reads the environment.
    unsafe {
        std::env::set_var("HF_HOME", home.path());
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }
    assert_eq!(
        ModelSource::resolve("test-org/tiny-llama").unwrap(),
        ModelSource::Hub {
            repo: "test-org/tiny-llama".into(),
            revision: "main".into()
        }
    );
    assert!(loader::hub_snapshot_cached("test-org/tiny-llama", "main"));
    let mut engine = common::engine("test-org/tiny-llama", EngineConfig::default());
    let reply = engine.generate(vec![
        Request::chat(vec![Message::user("hello")]).with_max_tokens(5),
    ]);
    assert_eq!(reply[0].as_ref().unwrap().generated_tokens, 5);

    // A repo that is not cached fails offline with a message that says how to get it.
    let err = loader::load("test-org/missing-model", &common::f32_options())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("test-org/missing-model") && err.contains("huggingface-cli download"),
        "{err}"
    );
}
