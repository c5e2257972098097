//! `throng run --reuse`: a decision whose complete input an earlier run recorded is taken from
//! its store, and the records are those of a fresh run; any change to that input reuses
//! nothing, a store from another weight format is refused, and a damaged store is ignored
//! with a warning.

mod common;

use common::cli::{assert_same_records, output, throng};
use std::path::Path;

/// A small guessing game decided by SmolLM2: 8 agents, 2 replicates, 2 steps.
const CONFIG: &str = r#"
name = "reuse-guess"
seed = 5
replicates = 2
steps = 2
policy = "llm"
templates = "TEMPLATES"
agents = 8

[llm]
model = "smollm2-135m-instruct"
max_tokens = 24
temperature = 0.7

[scenario]
name = "guess"
ratio = "2/3"
prompt = "basic"
"#;

const RECORDS: &[&str] = &[
    "state.parquet",
    "aggregates.csv",
    "cells.jsonl",
    "prompts.jsonl",
];

fn config(dir: &Path, change: impl Fn(String) -> String) -> std::path::PathBuf {
    let templates = common::cli::repo().join("templates/guess");
    let text = CONFIG.replace("TEMPLATES", templates.to_str().unwrap());
    let path = dir.join(format!("c{}.toml", std::fs::read_dir(dir).unwrap().count()));
    std::fs::write(&path, change(text)).unwrap();
    path
}

fn run(config: &Path, out: &Path, extra: &[&str]) -> common::cli::Ran {
    let ran = output(
        throng()
            .arg("run")
            .arg(config)
            .arg("--out")
            .arg(out)
            .arg("--no-report")
            .args(extra),
    );
    assert!(ran.ok, "{}", ran.text);
    ran
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn reused(dir: &Path) -> u64 {
    manifest(dir)["reuse"]["reused"].as_u64().unwrap()
}

#[test]
fn the_same_inputs_reuse_every_decision_and_give_a_fresh_runs_records() {
    if common::smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), |t| t);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run(&cfg, &a, &[]);
    let ran = run(&cfg, &b, &["--reuse", a.to_str().unwrap()]);
    assert_eq!(reused(&b), 32, "{}", ran.text);
    assert!(
        ran.text.contains("reused 32 of 32 decisions"),
        "{}",
        ran.text
    );
    assert!(manifest(&b)["reuse"]["saved_seconds"].as_f64().unwrap() > 0.0);
    assert_same_records(&a, &b, RECORDS, "a run reusing every decision");
    // A run that reused them keeps them for the next.
    let c = tmp.path().join("c");
    run(&cfg, &c, &["--reuse", b.to_str().unwrap()]);
    assert_eq!(reused(&c), 32);
}

/// A change made to the config's text.
type Change = Box<dyn Fn(String) -> String>;

#[test]
fn a_change_of_sampling_template_or_seed_reuses_nothing() {
    if common::smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = config(tmp.path(), |t| t);
    let a = tmp.path().join("a");
    run(&base, &a, &[]);
    let changes: [(&str, Change); 4] = [
        (
            "temperature",
            Box::new(|t: String| t.replace("temperature = 0.7", "temperature = 0.8")),
        ),
        (
            "max_tokens",
            Box::new(|t: String| t.replace("max_tokens = 24", "max_tokens = 25")),
        ),
        (
            "seed",
            Box::new(|t: String| t.replace("seed = 5", "seed = 6")),
        ),
        (
            "prompt",
            Box::new(|t: String| t.replace("prompt = \"basic\"", "prompt = \"cot\"")),
        ),
    ];
    for (what, change) in changes {
        let cfg = config(tmp.path(), change);
        let fresh = tmp.path().join(format!("fresh-{what}"));
        let with = tmp.path().join(format!("with-{what}"));
        run(&cfg, &fresh, &[]);
        run(&cfg, &with, &["--reuse", a.to_str().unwrap()]);
        assert_eq!(reused(&with), 0, "{what}");
        assert_same_records(&fresh, &with, RECORDS, what);
    }
}

#[test]
fn a_store_of_another_weight_format_is_refused_and_a_damaged_one_ignored() {
    if common::smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), |t| t);
    let a = tmp.path().join("a");
    run(&cfg, &a, &[]);
    let refused = output(
        throng()
            .args([
                "run",
                cfg.to_str().unwrap(),
                "--weights",
                "f32",
                "--no-report",
                "--out",
            ])
            .arg(tmp.path().join("f32"))
            .arg("--reuse")
            .arg(&a),
    );
    assert!(!refused.ok, "{}", refused.text);
    assert!(
        refused.text.contains("gives other bits") && refused.text.contains("F32"),
        "{}",
        refused.text
    );

    // Truncated: the manifest's checksum no longer holds, and the store is left out.
    let store = a.join("decisions.redb");
    let bytes = std::fs::read(&store).unwrap();
    std::fs::write(&store, &bytes[..bytes.len() / 2]).unwrap();
    let b = tmp.path().join("b");
    let ran = run(&cfg, &b, &["--reuse", a.to_str().unwrap()]);
    assert!(
        ran.text.contains("warning: --reuse") && ran.text.contains("decisions.redb"),
        "{}",
        ran.text
    );
    assert!(
        manifest(&b)["reuse"].is_null(),
        "a damaged store is not read"
    );
    assert_same_records(&a, &b, RECORDS, "a run beside a damaged store");
}

/// The scripted energy market of Experiment 2, 3 steps of 1 replicate.
fn scripted_market(out: &Path, steps: &str, replicates: &str) {
    let ran = output(throng().args([
        "run",
        "experiments/exp2-regulated.toml",
        "--policy",
        "scripted",
        "--steps",
        steps,
        "--replicates",
        replicates,
        "--no-report",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(ran.ok, "{}", ran.text);
}

fn extend(dir: &Path, flag: &str, value: &str) -> common::cli::Ran {
    let ran = output(throng().args([
        "run",
        "--resume",
        dir.to_str().unwrap(),
        flag,
        value,
        "--no-report",
    ]));
    assert!(ran.ok, "{}", ran.text);
    ran
}

const MARKET_RECORDS: &[&str] = &[
    "state.parquet",
    "trades.parquet",
    "decisions.jsonl",
    "cells.jsonl",
    "state.csv",
];

#[test]
fn a_finished_run_extended_by_steps_or_replicates_equals_one_made_so_from_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (short, long, wide) = (
        tmp.path().join("short"),
        tmp.path().join("long"),
        tmp.path().join("wide"),
    );
    scripted_market(&short, "3", "1");
    scripted_market(&long, "5", "1");
    scripted_market(&wide, "5", "3");
    extend(&short, "--steps", "5");
    assert_same_records(&long, &short, MARKET_RECORDS, "extended by steps");
    assert_eq!(manifest(&short)["steps"], 5);
    assert!(!tmp.path().join("short.before-extension").exists());
    extend(&short, "--replicates", "3");
    assert_same_records(&wide, &short, MARKET_RECORDS, "extended by replicates");
}

#[test]
fn extending_refuses_fewer_steps_and_an_unfinished_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    scripted_market(&dir, "3", "1");
    let fewer = output(throng().args(["run", "--resume", dir.to_str().unwrap(), "--steps", "2"]));
    assert!(
        !fewer.ok && fewer.text.contains("make a new run for fewer"),
        "{}",
        fewer.text
    );
    let same = output(throng().args(["run", "--resume", dir.to_str().unwrap(), "--steps", "3"]));
    assert!(
        !same.ok && same.text.contains("nothing to extend"),
        "{}",
        same.text
    );
    assert!(
        dir.join("manifest.json").exists(),
        "a refused extension leaves the run in place"
    );
}

#[test]
fn an_extended_llm_run_asks_the_model_only_for_the_new_steps() {
    if common::smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), |t| t);
    let three = config(tmp.path(), |t| t.replace("steps = 2", "steps = 3"));
    let (short, long) = (tmp.path().join("short"), tmp.path().join("long"));
    run(&cfg, &short, &[]);
    run(&three, &long, &[]);
    extend(&short, "--steps", "3");
    assert_eq!(reused(&short), 32, "the two steps it had");
    assert_same_records(&long, &short, RECORDS, "an LLM run extended by a step");
}

#[test]
fn a_population_change_that_touches_some_agents_reuses_the_others_decisions() {
    if common::smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let with_education = |shares: &'static str| {
        move |t: String| {
            t.replace("agents = 8", "agents = 12")
                .replace("replicates = 2", "replicates = 1")
                + "\n[population]\ndraw = \"quota\"\n\n[population.attributes.education]\n"
                + shares
        }
    };
    let before = config(
        tmp.path(),
        with_education(
            "shares = { \"high school\" = 50, \"bachelor's degree\" = 30, \"doctorate\" = 20 }\n",
        ),
    );
    let after = config(
        tmp.path(),
        with_education(
            "shares = { \"high school\" = 42, \"bachelor's degree\" = 38, \"doctorate\" = 20 }\n",
        ),
    );
    let (a, fresh, with) = (
        tmp.path().join("a"),
        tmp.path().join("fresh"),
        tmp.path().join("with"),
    );
    run(&before, &a, &[]);
    run(&after, &fresh, &[]);
    run(&after, &with, &["--reuse", a.to_str().unwrap()]);
    let n = reused(&with);
    assert!(
        0 < n && n < 24,
        "a quota changed for some agents reused {n} of 24"
    );
    assert_same_records(&fresh, &with, RECORDS, "a population change");
}
