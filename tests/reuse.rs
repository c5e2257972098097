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
                // Never what `auto` picks on a CPU for this model (int8 where the CPU has
                // VNNI, f32 elsewhere).
                "--weights",
                "bf16",
                "--no-report",
                "--out",
            ])
            .arg(tmp.path().join("bf16"))
            .arg("--reuse")
            .arg(&a),
    );
    assert!(!refused.ok, "{}", refused.text);
    assert!(
        refused.text.contains("gives other bits") && refused.text.contains("BF16"),
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

// Guards against issue 30, item 1: the request key left out the KV cache's format, so
// `--reuse` of a run made with `--kv-format f32` said "reused 16 of 16" in a default (f16 KV)
// run, whose records then differed from a fresh default run's.
#[test]
fn a_store_of_another_kv_format_is_refused_rather_than_reused() {
    if common::smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), |t| t);
    let f32_kv = tmp.path().join("f32-kv");
    run(&cfg, &f32_kv, &["--kv-format", "f32"]);
    let out = tmp.path().join("default-kv");
    let refused = output(
        throng()
            .args(["run", cfg.to_str().unwrap(), "--no-report", "--out"])
            .arg(&out)
            .arg("--reuse")
            .arg(&f32_kv),
    );
    assert!(!refused.ok, "{}", refused.text);
    assert!(
        refused.text.contains("KV cache") && refused.text.contains("--kv-format"),
        "{}",
        refused.text
    );
    // The same KV format reuses every decision.
    let same = tmp.path().join("same");
    run(
        &cfg,
        &same,
        &["--kv-format", "f32", "--reuse", f32_kv.to_str().unwrap()],
    );
    assert_eq!(reused(&same), 32);
    assert_same_records(&f32_kv, &same, RECORDS, "reused from the same KV format");
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

// Guards against issue 30, item 16: an extension refused by the config's range or memory
// checks (`--resume DIR --steps 1000001`) left the run moved to `DIR.before-extension`, and
// nothing said how to get it back; and an extension stopped and resumed to its end left the
// run as it was beside it for good.
#[test]
fn a_refused_extension_leaves_the_run_in_place_and_a_finished_one_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    scripted_market(&dir, "3", "1");
    let before = std::fs::read(dir.join("state.parquet")).unwrap();
    let aside = tmp.path().join("r.before-extension");
    for (flag, value) in [("--steps", "1000001"), ("--replicates", "100000000")] {
        let refused = output(
            throng()
                .args(["run", "--no-report", "--resume"])
                .arg(&dir)
                .args([flag, value]),
        );
        assert!(!refused.ok, "{flag} {value}: {}", refused.text);
        assert!(refused.text.contains(flag), "{}", refused.text);
        assert!(!aside.exists(), "{flag} {value}: the run was moved aside");
        assert_eq!(std::fs::read(dir.join("state.parquet")).unwrap(), before);
    }
    // Stopped after a step of the extension, then resumed to its end.
    let stopped = output(
        throng()
            .args(["run", "--no-report", "--resume"])
            .arg(&dir)
            .args(["--steps", "5", "--stop-after", "1"]),
    );
    assert!(stopped.ok, "{}", stopped.text);
    assert!(
        aside.is_dir(),
        "the run as it was waits while the extension is paused"
    );
    let resumed = output(throng().args(["run", "--no-report", "--resume"]).arg(&dir));
    assert!(resumed.ok, "{}", resumed.text);
    assert!(!aside.exists(), "{}", resumed.text);
    let whole = tmp.path().join("whole");
    scripted_market(&whole, "5", "1");
    assert_same_records(
        &whole,
        &dir,
        &["state.parquet", "aggregates.csv"],
        "extended",
    );
}

// Guards against issue 30, item 19: `--reuse` of a missing path, a file or a folder that is
// not a run only warned and ran at full cost.
#[test]
fn reuse_of_what_is_not_a_run_with_a_store_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let scripted = tmp.path().join("scripted");
    scripted_market(&scripted, "1", "1");
    let file = tmp.path().join("file.txt");
    std::fs::write(&file, "x").unwrap();
    let folder = tmp.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    let config = common::cli::repo().join("experiments/exp2-regulated.toml");
    for (source, why) in [
        (tmp.path().join("missing"), "there is nothing there"),
        (file, "is a file"),
        (folder, "not a run folder"),
        (scripted, "no decision store"),
    ] {
        let out = tmp.path().join("out");
        let ran = output(
            throng()
                .args(["run", "--no-report", "--policy", "scripted", "--steps", "1"])
                .arg(&config)
                .arg("--out")
                .arg(&out)
                .arg("--reuse")
                .arg(&source),
        );
        assert!(!ran.ok, "{}: {}", source.display(), ran.text);
        assert!(ran.text.contains(why), "{}: {}", source.display(), ran.text);
        assert!(!out.exists(), "{}: a folder was written", source.display());
    }
}

// Guards against issue 30, item 17: checks made after the run folder was written (settings
// the engine refuses, a store of another format) left an "interrupted" folder behind, which
// blocked the same command once the cause was fixed.
#[test]
fn a_run_refused_at_its_start_leaves_no_folder_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&common::TinyLlama::default());
    let config = tmp.path().join("tiny.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"tiny\"\nsteps = 1\nagents = 4\npolicy = \"llm\"\ntemplates = {:?}\n\
             [llm]\nmax_tokens = 16\n[scenario]\nname = \"guess\"\n",
            common::cli::repo()
                .join("templates/guess")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    for bad in [&["--max-seqs", "0"][..], &["--max-batch-tokens", "0"]] {
        let out = tmp.path().join("out");
        let ran = output(
            throng()
                .args(["run", "--no-report", "--model"])
                .arg(model.path())
                .arg(&config)
                .arg("--out")
                .arg(&out)
                .args(bad),
        );
        assert!(!ran.ok, "{bad:?}: {}", ran.text);
        assert!(ran.text.contains(bad[0]), "{bad:?}: {}", ran.text);
        assert!(!out.exists(), "{bad:?}: a folder was written");
    }
    // A store the run cannot reuse (another weight format) is found once the model is
    // loaded, after the folder was taken: the folder is given up, and the same --out works.
    // The tiny model in `weights`, into `out`, reusing `reuse`'s store if given.
    let run_tiny = |weights: &str, out: &Path, reuse: Option<&Path>| {
        let mut cmd = throng();
        cmd.args(["run", "--no-report", "--weights", weights, "--model"])
            .arg(model.path())
            .arg(&config)
            .arg("--out")
            .arg(out);
        if let Some(source) = reuse {
            cmd.arg("--reuse").arg(source);
        }
        output(&mut cmd)
    };
    let a = tmp.path().join("a");
    let ran = run_tiny("f32", &a, None);
    assert!(ran.ok, "{}", ran.text);
    let out = tmp.path().join("out");
    let refused = run_tiny("bf16", &out, Some(&a));
    assert!(!refused.ok, "{}", refused.text);
    assert!(!out.exists(), "{}", refused.text);
    let again = run_tiny("f32", &out, Some(&a));
    assert!(again.ok, "{}", again.text);
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
