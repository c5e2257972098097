//! The guessing game end to end: what agents are told across rounds, a mixed-policy run, and
//! ten thousand LLM agents on a tiny random model with bounded memory.

mod common;

use common::TinyLlama;
use std::path::{Path, PathBuf};
use std::process::Command;
use throng::scenarios::guess::{GuessGame, config::GuessConfig};
use throng::sim::experiment::Overrides;
use throng::sim::population::Population;
use throng::sim::prompt::PromptBook;
use throng::sim::runner::{Ended, SimOptions};
use throng::sim::scenario::Scenario;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn write_config(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    std::fs::write(
        &path,
        format!(
            "templates = {:?}\n{body}",
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    path
}

/// A game after two rounds shows, in round 3's prompts, both rounds' mean, target and
/// winning number, and the agent's own two guesses.
#[test]
fn later_rounds_show_the_earlier_rounds() {
    let game = GuessGame::new(GuessConfig::default());
    let population = Population::plain(3);
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
    let mut world = game.init(&population, &mut rng);
    let decision = |x: u16| Some(throng::scenarios::guess::Decision(Some(x)));
    // Round 1: 20, 40, 60 -> mean 40, target 26.67, winner 20.
    game.resolve(
        &mut world,
        &population,
        &[decision(2000), decision(4000), decision(6000)],
        &mut rng,
    );
    // Round 2: 10, 20, 30 -> mean 20, target 13.33, winner 10.
    game.resolve(
        &mut world,
        &population,
        &[decision(1000), decision(2000), decision(3000)],
        &mut rng,
    );
    let book =
        PromptBook::load(&repo().join("templates/guess"), "guess", &["player"], &[]).unwrap();
    let system = book
        .render("system", &game.shared_context(&world, 2))
        .unwrap();
    for expected in [
        "round 1: average 40, target 26.67, winning number 20 (1 winner)",
        "round 2: average 20, target 13.33, winning number 10 (1 winner)",
        "This is round 3.",
        "2/3 of the average",
    ] {
        assert!(
            system.contains(expected),
            "missing {expected:?} in:\n{system}"
        );
    }
    let turn = game.turn(&world, &population, 1, 2);
    let user = book.render("player", &turn.context).unwrap();
    assert!(
        user.contains("round 1: 40, round 2: 20"),
        "agent 1 guessed 40 then 20:\n{user}"
    );
    let winner = book
        .render("player", &game.turn(&world, &population, 0, 2).context)
        .unwrap();
    assert!(
        winner.contains("round 1: 20 (you won), round 2: 10 (you won)"),
        "{winner}"
    );
}

/// A config that gives 1% of the agents the model and the rest the rules labels every
/// decision with the policy that made it.
#[test]
fn a_mixed_policy_run_labels_each_decision() {
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        r#"name = "mixed"
seed = 5
steps = 2
policy = "scripted"
agents = 400

[llm]
max_tokens = 32

[scenario]
name = "guess"

[population.attributes.education]
shares = { school = 50, university = 50 }

[[policy_groups]]
policy = "llm"
share = 0.02
where = { education = "university" }
"#,
    );
    let out = tmp.path().join("run");
    let engine = common::engine(
        model.path().to_str().unwrap(),
        throng::engine::EngineConfig::default(),
    );
    let (ended, manifest) = common::run_experiment(
        &config,
        &Overrides::default(),
        &out,
        SimOptions::default(),
        Some(engine),
    );
    assert_eq!(ended, Ended::Finished);
    assert_eq!(manifest.policy, "mixed");
    let text = std::fs::read_to_string(out.join("decisions.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 400 * 2);
    // 2% of the 200 university agents, every round.
    let llm: Vec<&serde_json::Value> = records.iter().filter(|r| r["policy"] == "llm").collect();
    assert_eq!(llm.len(), 4 * 2);
    assert_eq!(
        records.iter().filter(|r| r["policy"] == "scripted").count(),
        396 * 2
    );
    for r in &llm {
        assert!(
            r["text"].is_string() && r["prompt_tokens"].as_u64().unwrap() > 0,
            "{r}"
        );
    }
    // The same agents use the model in both rounds.
    let agents = |step: u64| -> Vec<u64> {
        llm.iter()
            .filter(|r| r["step"] == step)
            .map(|r| r["agent"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(agents(1), agents(2));
}

/// Runs the built binary on the 10k-agent config with `agents`, returning the run folder.
fn run_binary(model: &Path, config: &Path, agents: usize, out: &Path) -> throng::record::Manifest {
    let status = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args(["run"])
        .arg(config)
        .args(["--agents", &agents.to_string(), "--model"])
        .arg(model)
        .args([
            "--weights",
            "f32",
            // Small enough that 5,000 agents fill it: the pool's pages are touched only as
            // blocks are first written, so a pool that the smaller run leaves partly untouched
            // would make memory seem to grow with the agents.
            "--kv-memory",
            "16MiB",
            "--max-seqs",
            "512",
        ])
        .args(["--max-batch-tokens", "4096", "--no-report", "--out"])
        .arg(out)
        .status()
        .unwrap();
    assert!(status.success());
    throng::record::read_json(&out.join("manifest.json")).unwrap()
}

/// Ten thousand agents over two rounds on a tiny random model: every reply is a valid guess,
/// every record is there, and memory does not grow with the number of agents (prompts are
/// made a wave at a time, records written as they go).
#[test]
fn ten_thousand_llm_agents_decide_within_bounded_memory() {
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        r#"name = "ten-thousand"
seed = 8
steps = 2
policy = "llm"
agents = 10000

[llm]
max_tokens = 32
temperature = 1.0
wave = 1024

[scenario]
name = "guess"

[population.attributes.education]
shares = { school = 60, university = 40 }
"#,
    );
    let half = run_binary(model.path(), &config, 5_000, &tmp.path().join("half"));
    let out = tmp.path().join("full");
    let full = run_binary(model.path(), &config, 10_000, &out);
    assert_eq!(full.counters.decisions, 20_000);
    assert_eq!(full.counters.fallbacks, 0, "every reply parsed as a guess");
    let schema = throng::scenarios::guess::schema(&GuessConfig::default());
    let validator = jsonschema::validator_for(&schema).unwrap();
    let text = std::fs::read_to_string(out.join("decisions.jsonl")).unwrap();
    let mut lines = 0;
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(validator.is_valid(&r["value"]), "{r}");
        lines += 1;
    }
    assert_eq!(lines, 20_000);
    let batches = throng::record::read_state(&out).unwrap();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 20_000, "a state row per agent per round");
    let aggregates = std::fs::read_to_string(out.join("aggregates.csv")).unwrap();
    assert_eq!(aggregates.lines().count(), 1 + 2);
    let (a, b) = (half.peak_rss_bytes.unwrap(), full.peak_rss_bytes.unwrap());
    assert!(
        (b as f64) < a as f64 * 1.25,
        "peak memory grew from {a} bytes (5,000 agents) to {b} (10,000)"
    );
}

// Guards against issue 42, item 1: `[[arms]] policy = "scripted"` was refused, so an LLM arm
// and its scripted baseline took two runs and a hand-made comparison without intervals or
// tests. One run now holds both, counts only the LLM arm's decisions as model requests, and
// its report sets the arms side by side with intervals, Welch's test and Holm's correction.
#[test]
fn an_llm_arm_and_its_scripted_baseline_are_one_run_and_one_comparison() {
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        r#"name = "llm-vs-rule"
seed = 3
steps = 2
replicates = 3
agents = 12

[llm]
max_tokens = 16

[scenario]
name = "guess"

[population.attributes.education]
shares = { school = 50, university = 50 }

[[arms]]
name = "llm"

[[arms]]
name = "rule"
policy = "scripted"

[[arms]]
name = "some"
policy = "scripted"
[[arms.policy_groups]]
policy = "llm"
where = { education = "university" }
"#,
    );
    let out = tmp.path().join("run");
    let ran = Command::new(env!("CARGO_BIN_EXE_throng"))
        .arg("run")
        .arg(&config)
        .arg("--model")
        .arg(model.path())
        .args(["--weights", "f32", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(ran.status.success(), "{said}");
    let manifest: throng::record::Manifest =
        throng::record::read_json(&out.join("manifest.json")).unwrap();
    assert_eq!(manifest.policy, "mixed");
    let records: Vec<serde_json::Value> = std::fs::read_to_string(out.join("decisions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let policies = |arm: &str| -> Vec<&str> {
        records
            .iter()
            .filter(|r| r["arm"] == arm)
            .map(|r| r["policy"].as_str().unwrap())
            .collect()
    };
    // 12 agents x 3 replicates x 2 steps in each arm.
    assert_eq!(policies("llm").len(), 72);
    assert!(policies("llm").iter().all(|&p| p == "llm"));
    assert!(policies("rule").iter().all(|&p| p == "scripted"));
    let some = policies("some");
    let asked = some.iter().filter(|&&p| p == "llm").count();
    assert!(asked > 0 && asked < some.len(), "university agents only");
    // The agents of the third arm that ask the model are those of its group, whatever the
    // replicate's draw: the education attribute says which.
    for r in records.iter().filter(|r| r["arm"] == "some") {
        let llm = r["policy"] == "llm";
        assert_eq!(r["text"].is_string(), llm, "{r}");
    }
    // The engine line counts the model's requests: the LLM arm's and the group's, not the
    // scripted decisions.
    let requests = 72 + asked;
    assert!(
        said.contains(&format!("throng: {requests} requests in")),
        "{requests} model requests: {said}"
    );
    // One report: every arm beside the first, with a test where the replicates vary.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let tests = summary["arm_tests"].as_array().unwrap();
    let guess: Vec<&serde_json::Value> = tests
        .iter()
        .filter(|t| t["column"] == "guess" && t["by"] == "all")
        .collect();
    assert_eq!(guess.len(), 2, "{tests:?}");
    for t in &guess {
        assert_eq!(t["reference"], "llm");
        assert_eq!(t["step"], 2);
        assert_eq!(t["arm_replicates"], 3);
        assert!(t["welch"].is_object() || t["why_not"].is_string(), "{t}");
    }
    let tested: Vec<f64> = tests.iter().filter_map(|t| t["holm_p"].as_f64()).collect();
    assert!(!tested.is_empty(), "{tests:?}");
    assert!(tested.iter().all(|p| (0.0..=1.0).contains(p)));
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(page.contains("<h2>Arms compared</h2>") && page.contains("Holm"));
    // The means with their intervals, per arm, as between any arms.
    assert!(
        summary["means"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["arm"] == "rule" && m["column"] == "guess" && m["ci_low"].is_number())
    );
}
