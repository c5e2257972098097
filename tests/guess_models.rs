//! Several models in one run: a policy group (or an arm) names its own model, every model is
//! loaded once, each agent's requests go to its model's engine, and the records say which
//! model made each decision. Two tiny random models (different seeds) stand in for two
//! model families.

mod common;

use common::TinyLlama;
use common::cli::{RECORDS, Ran, assert_same_records, output, repo, throng};
use std::path::{Path, PathBuf};

/// The guessing game on the LLM policy: half the agents (policy group 0) ask `group_model`
/// at their own temperature, the rest `[llm] model`; `default_policy` and `group_policy`
/// turn either half over to the scripted rules.
fn config(
    dir: &Path,
    file: &str,
    steps: usize,
    default: (&str, &str),
    group: (&str, &str),
) -> PathBuf {
    let (default_policy, default_model) = default;
    let (group_policy, group_model) = group;
    let group_llm = match group_policy {
        "llm" => format!("llm = {{ model = {group_model:?}, temperature = 0.7 }}\n"),
        _ => String::new(),
    };
    let path = dir.join(file);
    std::fs::write(
        &path,
        format!(
            r#"name = "models"
seed = 11
replicates = 1
steps = {steps}
policy = "{default_policy}"
templates = {:?}
agents = 12

[llm]
model = {default_model:?}
max_tokens = 24
temperature = 1.0

[scenario]
name = "guess"

[[policy_groups]]
policy = "{group_policy}"
share = 0.5
{group_llm}"#,
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    path
}

/// `throng run CONFIG --out OUT` with the tests' KV memory and f32 weights.
fn run_command(config: &Path, out: &Path) -> std::process::Command {
    let mut cmd = throng();
    cmd.args([
        "run",
        "--no-report",
        "--kv-memory",
        "16MiB",
        "--weights",
        "f32",
    ])
    .arg(config)
    .arg("--out")
    .arg(out);
    cmd
}

fn run(config: &Path, out: &Path, extra: &[&str]) -> Ran {
    output(run_command(config, out).args(extra))
}

/// The decisions of `dir` for which `keep` holds, without what measures the process (the
/// latency) or says which policy or model made them (the runs compared differ in that only).
fn decisions(dir: &Path, keep: impl Fn(&serde_json::Value) -> bool) -> Vec<String> {
    std::fs::read_to_string(dir.join("decisions.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|v| keep(v))
        .map(|mut v| {
            let record = v.as_object_mut().unwrap();
            for field in ["latency_ms", "policy", "model"] {
                record.remove(field);
            }
            v.to_string()
        })
        .collect()
}

/// Two tiny random models (different seeds) in their folders, with the folders' names.
struct TwoModels {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    a: String,
    b: String,
}

fn two_models() -> TwoModels {
    let a = common::tiny_model(&TinyLlama::default());
    let b = common::tiny_model(&TinyLlama {
        seed: 99,
        ..TinyLlama::default()
    });
    TwoModels {
        a: a.path().display().to_string(),
        b: b.path().display().to_string(),
        _dirs: (a, b),
    }
}

/// A run of `steps` steps in which half the agents ask model A and the policy group B.
fn both(tmp: &Path, models: &TwoModels, steps: usize) -> PathBuf {
    config(
        tmp,
        "both.toml",
        steps,
        ("llm", &models.a),
        ("llm", &models.b),
    )
}

// Guards against one model's agents being decided by the other's engine, or differently for
// sharing the run with another model (a batch of mixed models, a KV cache split wrongly,
// sampling settings crossed between groups): each group's decisions in a two-model run must
// equal, line for line, that group's decisions in a run where it alone asks the model.
#[test]
fn each_groups_decisions_equal_its_model_run_alone() {
    let models = two_models();
    let (a_name, b_name) = (models.a.clone(), models.b.clone());
    let tmp = tempfile::tempdir().unwrap();
    let both = both(tmp.path(), &models, 1);
    let only_a = config(tmp.path(), "a.toml", 1, ("llm", &a_name), ("scripted", ""));
    let only_b = config(
        tmp.path(),
        "b.toml",
        1,
        ("scripted", &b_name),
        ("llm", &b_name),
    );
    let mut outs = Vec::new();
    for (cfg, name) in [(&both, "both"), (&only_a, "a"), (&only_b, "b")] {
        let out = tmp.path().join(name);
        let Ran { ok, text, .. } = run(cfg, &out, &[]);
        assert!(ok, "{name}: {text}");
        outs.push(out);
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(outs[0].join("manifest.json")).unwrap())
            .unwrap();
    let listed: Vec<&str> = manifest["models"]
        .as_array()
        .expect("a two-model run lists its models")
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [a_name.as_str(), b_name.as_str()]);
    assert_eq!(manifest["models"][0]["agents"], 6);
    let by_model = |name: &str| {
        let name = name.to_string();
        decisions(&outs[0], move |v| v["model"] == name.as_str())
    };
    let by_llm = |dir: &Path| decisions(dir, |v| v["policy"] == "llm");
    let (from_a, from_b) = (by_model(&a_name), by_model(&b_name));
    assert_eq!(from_a.len(), 6, "half the agents ask model A");
    assert_eq!(from_b.len(), 6, "the policy group asks model B");
    assert_eq!(
        from_a,
        by_llm(&outs[1]),
        "model A's group differs from A alone"
    );
    assert_eq!(
        from_b,
        by_llm(&outs[2]),
        "model B's group differs from B alone"
    );
    assert_ne!(
        from_a, from_b,
        "two different models made the same decisions"
    );
    // The report compares the models: round 1's mean guess by model, with CIs.
    let Ran { ok, text, .. } = output(throng().arg("report").arg(&outs[0]));
    assert!(ok, "{text}");
    let html = std::fs::read_to_string(outs[0].join("report.html")).unwrap();
    let round_one = html.split("Round 1 by group").nth(1).unwrap_or_default();
    for model in [&a_name, &b_name] {
        assert!(
            round_one.contains(&format!("<td>model</td><td>{model}</td>")),
            "round 1 by model lacks {model}: {html}"
        );
    }
    assert!(html.contains("fig_by_model"), "no figure by model");
    // And every round by model, with a CI over games.
    let rounds = html
        .split("Rounds by model")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_default();
    for model in [&a_name, &b_name] {
        assert!(
            rounds.contains(&format!("<td>{model}</td>")),
            "the rounds by model lack {model}: {html}"
        );
    }
    // The state table says each agent's model too.
    let csv = std::fs::read_to_string(outs[0].join("state.csv")).unwrap();
    assert!(
        csv.lines().next().unwrap().split(',').any(|c| c == "model"),
        "{csv}"
    );
}

// Guards against a two-model run whose resume is not exact: a run killed mid-way (after a
// step's records, before its checkpoint) and resumed must hold the records of an
// uninterrupted run, each model's decisions included.
#[test]
fn a_two_model_run_resumes_exactly() {
    let models = two_models();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = both(tmp.path(), &models, 3);
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = run(&cfg, &whole, &[]);
    assert!(ok, "{text}");
    let out = tmp.path().join("killed");
    let killed = output(run_command(&cfg, &out).env("THRONG_CRASH_AT", "2:records"));
    assert!(
        !killed.ok,
        "the crash point was not reached: {}",
        killed.text
    );
    let Ran { ok, text, .. } = output(
        throng()
            .args(["run", "--no-report", "--kv-memory", "16MiB", "--resume"])
            .arg(&out),
    );
    assert!(ok, "{text}");
    assert_same_records(&whole, &out, &RECORDS, "two models, killed and resumed");
}

// Guards against a typo in a group's model surfacing late (after the folder is written, or
// as a loader error without a place): it must be refused before the run, naming the config's
// file and line and how to list the presets.
#[test]
fn a_group_naming_an_unknown_model_is_refused_at_its_line() {
    let models = two_models();
    let a_name = models.a.clone();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "typo.toml",
        1,
        ("llm", &a_name),
        ("llm", "lama-3-8b-instruct"),
    );
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&cfg, &out, &[]);
    assert!(!ok, "{text}");
    let line = std::fs::read_to_string(&cfg)
        .unwrap()
        .lines()
        .position(|l| l.contains("lama-3-8b-instruct"))
        .unwrap()
        + 1;
    assert!(text.contains(&format!("typo.toml:{line}:")), "{text}");
    assert!(
        text.contains("unknown model `lama-3-8b-instruct`") && text.contains("throng models"),
        "{text}"
    );
    assert!(
        !out.join("config.toml").exists(),
        "refused before the run folder"
    );
}

// Guards `--split models`: each rank loads only its own model and decides only for that
// model's agents, and the records are those of one process holding both models.
#[cfg(feature = "mpi")]
#[test]
fn split_by_models_gives_the_records_of_one_process() {
    let Some(mpirun) = common::mpi::mpirun() else {
        return;
    };
    let models = two_models();
    let (a_name, b_name) = (models.a.clone(), models.b.clone());
    let tmp = tempfile::tempdir().unwrap();
    let cfg = both(tmp.path(), &models, 2);
    let alone = tmp.path().join("alone");
    let Ran { ok, text, .. } = run(&cfg, &alone, &[]);
    assert!(ok, "{text}");
    let ranked = tmp.path().join("ranked");
    let args = [
        "run",
        "--no-report",
        "--kv-memory",
        "16MiB",
        "--weights",
        "f32",
        "--split",
        "models",
        cfg.to_str().unwrap(),
        "--out",
        ranked.to_str().unwrap(),
    ];
    let Ran { ok, text, .. } = output(&mut common::mpi::mpi(&mpirun, 2, &args));
    assert!(ok, "{text}");
    // Rank 0 loaded model A only: what only B's rank knows (its weights) is not listed.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ranked.join("manifest.json")).unwrap())
            .unwrap();
    let models = &manifest["models"];
    assert_eq!(
        (models[0]["name"].as_str(), models[1]["name"].as_str()),
        (Some(a_name.as_str()), Some(b_name.as_str()))
    );
    assert!(
        models[0]["weights"].is_string() && models[1]["weights"].is_null(),
        "{manifest}"
    );
    assert_same_records(&alone, &ranked, &RECORDS, "two models split over two ranks");
    // Three ranks for two models of six agents each: model A gets ranks 0 and 1, B rank 2.
    let three = tmp.path().join("three");
    let mut args = args.to_vec();
    let last = args.len() - 1;
    args[last] = three.to_str().unwrap();
    let Ran { ok, text, .. } = output(&mut common::mpi::mpi(&mpirun, 3, &args));
    assert!(ok, "{text}");
    assert_same_records(
        &alone,
        &three,
        &RECORDS,
        "two models split over three ranks",
    );
}
