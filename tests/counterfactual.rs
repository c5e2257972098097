//! Counterfactual runs: a config that names a base run (`[counterfactual] base`) and arms that
//! change knobs, from the start or from a step (`from_step`), reuses every decision whose
//! complete input the base recorded and gives the records of a fresh run, even when killed
//! anywhere and resumed; its report sets each arm beside the base, step by step.

mod common;

use common::TinyLlama;
use common::cli::{RECORDS, Ran, assert_same_records, output, repo, throng};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

const MARKET: &str = r#"
name = "cf-market"
seed = 3
replicates = 2
steps = 4
policy = "llm"
templates = "TEMPLATES/energy_market"
agents = 4

[llm]
max_tokens = 40
temperature = 0.9

[scenario]
name = "energy_market"
rules = "fixed"
regulated = true
consumer_price_cap = 250.0
starting_resources = 10000.0
"#;

const GUESS: &str = r#"
name = "cf-guess"
seed = 4
replicates = 2
steps = 3
policy = "llm"
templates = "TEMPLATES/guess"
agents = 6

[llm]
max_tokens = 16
temperature = 0.9

[scenario]
name = "guess"
ratio = "2/3"

[population]
draw = "quota"

[population.attributes.education]
shares = { "high school" = 50, "bachelor's degree" = 30, "doctorate" = 20 }
"#;

/// A tiny random Llama whose context holds a market's prompts (its tokenizer is bytewise).
fn tiny() -> tempfile::TempDir {
    common::tiny_model(&TinyLlama {
        max_position_embeddings: 8192,
        ..TinyLlama::default()
    })
}

fn text(template: &str) -> String {
    template.replace("TEMPLATES", repo().join("templates").to_str().unwrap())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `throng run CONFIG` on `model` into `out`, without a report.
fn command(model: &Path, config: &Path, out: &Path) -> std::process::Command {
    let mut cmd = throng();
    cmd.arg("run")
        .arg(config)
        .arg("--out")
        .arg(out)
        .arg("--model")
        .arg(model)
        .args(["--kv-memory", "64MiB", "--no-report"]);
    cmd
}

fn run(model: &Path, config: &Path, out: &Path, env: Option<&str>) -> Ran {
    let mut cmd = command(model, config, out);
    if let Some(at) = env {
        cmd.env("THRONG_CRASH_AT", at);
    }
    output(&mut cmd)
}

/// As [`run`], reusing the decisions of the run in `from`.
fn run_reusing(model: &Path, config: &Path, out: &Path, from: &Path) -> Ran {
    output(command(model, config, out).arg("--reuse").arg(from))
}

fn resume(out: &Path) -> Ran {
    output(throng().args(["run", "--no-report", "--resume"]).arg(out))
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn decisions(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("decisions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a change must reuse of the base's decisions.
#[derive(Debug, Clone, Copy)]
enum Reused {
    /// Every decision: nothing changed.
    All,
    /// None: the change reaches every prompt (or the sampling, or the seed).
    Nothing,
    /// Some, not all: the change touches some agents only.
    Some,
    /// At least every decision before this step (the change takes effect there).
    Before(usize),
}

/// A knob change, as the text of the config beside the base's.
fn change(rng: &mut impl Rng, market: bool, steps: usize) -> (String, String, Reused) {
    let base = text(if market { MARKET } else { GUESS });
    let (what, changed, reused) = if market {
        match rng.random_range(0..3) {
            0 => {
                let k = rng.random_range(2..=steps);
                (
                    format!("the cap from step {k}"),
                    format!(
                        "{base}\n[[arms]]\nname = \"cap\"\nfrom_step = {k}\nscenario = {{ consumer_price_cap = 90.0 }}\n"
                    ),
                    Reused::Before(k),
                )
            }
            1 => (
                "the temperature".into(),
                base.replace("temperature = 0.9", "temperature = 0.6"),
                Reused::Nothing,
            ),
            _ => ("nothing".into(), base.clone(), Reused::All),
        }
    } else {
        match rng.random_range(0..4) {
            0 => (
                "the hint".into(),
                base.replace("ratio = \"2/3\"", "ratio = \"2/3\"\nhint = true"),
                Reused::Nothing,
            ),
            1 => (
                "one population share".into(),
                base.replace("\"high school\" = 50", "\"high school\" = 34")
                    .replace("\"bachelor's degree\" = 30", "\"bachelor's degree\" = 46"),
                Reused::Some,
            ),
            2 => (
                "the seed".into(),
                base.replace("seed = 4", "seed = 44"),
                Reused::Nothing,
            ),
            _ => ("nothing".into(), base.clone(), Reused::All),
        }
    };
    let _ = what;
    (base, changed, reused)
}

// The issue's property: whatever knob changes and wherever the run is killed, a run that
// reuses an earlier run's decisions has a fresh run's records, and reuses what it must.
#[test]
fn a_counterfactual_killed_anywhere_has_a_fresh_runs_records() {
    let seed: u64 = std::env::var("THRONG_PROPERTY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(23);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let model = tiny();
    let tmp = tempfile::tempdir().unwrap();
    for case in 0..6 {
        let market = case % 2 == 0;
        let steps = if market { 4 } else { 3 };
        let (base_text, changed_text, expect) = change(&mut rng, market, steps);
        let dir = tmp.path().join(format!("case{case}"));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("base");
        let ran = run(model.path(), &write(&dir, "base", &base_text), &base, None);
        assert!(ran.ok, "{}", ran.text);
        let fresh = dir.join("fresh");
        let ran = run(
            model.path(),
            &write(&dir, "fresh", &changed_text),
            &fresh,
            None,
        );
        assert!(ran.ok, "{}", ran.text);
        let cf_text = format!(
            "{changed_text}\n[counterfactual]\nbase = \"{}\"\n",
            base.display()
        );
        let cf_config = write(&dir, "cf", &cf_text);
        let cf = dir.join("cf");
        let crash_step = rng.random_range(1..=steps);
        let point = ["decided", "state", "records", "checkpoint"][rng.random_range(0..4)];
        let what =
            format!("seed {seed}, case {case} ({expect:?}), killed at step {crash_step}:{point}");
        let ran = run(
            model.path(),
            &cf_config,
            &cf,
            Some(&format!("{crash_step}:{point}")),
        );
        assert!(!ran.ok, "{what}: the run was not killed:\n{}", ran.text);
        let ran = resume(&cf);
        assert!(ran.ok, "{what}: {}", ran.text);
        assert_same_records(&fresh, &cf, &RECORDS, &what);
        let total = decisions(&fresh).len() as u64;
        let reused = manifest(&cf)["reuse"]["reused"].as_u64().unwrap();
        match expect {
            Reused::All => assert_eq!(reused, total, "{what}"),
            Reused::Nothing => assert_eq!(reused, 0, "{what}"),
            Reused::Some => assert!(0 < reused && reused < total, "{what}: {reused} of {total}"),
            Reused::Before(k) => {
                let before = decisions(&base)
                    .iter()
                    .filter(|d| d["step"].as_u64().unwrap() < k as u64)
                    .count() as u64;
                assert!(
                    before <= reused && reused <= total,
                    "{what}: reused {reused}, the {before} decisions before step {k} at least"
                );
            }
        }
    }
}

// The report of a counterfactual: each arm beside the base's, step by step, and the step from
// which it diverges. Steps before the change are the base's, so every difference there is 0.
#[test]
fn the_report_sets_each_arm_beside_the_base_and_says_where_they_diverge() {
    let model = tiny();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let ran = run(
        model.path(),
        &write(tmp.path(), "base", &text(GUESS)),
        &base,
        None,
    );
    assert!(ran.ok, "{}", ran.text);
    let cf_text = format!(
        "{}\n[[arms]]\nname = \"same\"\n\n[[arms]]\nname = \"half-from-3\"\nfrom_step = 3\nscenario = {{ ratio = \"1/2\" }}\n\n[counterfactual]\nbase = \"{}\"\n",
        text(GUESS),
        base.display()
    );
    let out = tmp.path().join("cf");
    let ran = output(
        throng()
            .arg("run")
            .arg(write(tmp.path(), "cf", &cf_text))
            .arg("--out")
            .arg(&out)
            .arg("--model")
            .arg(model.path())
            .args(["--kv-memory", "64MiB"]),
    );
    assert!(ran.ok, "{}", ran.text);
    assert!(
        ran.text.contains("against base") && ran.text.contains("arm `same` does not diverge"),
        "{}",
        ran.text
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let cf = &summary["counterfactual"];
    assert_eq!(cf["base_arm"], "base");
    let arm = |name: &str| {
        cf["arms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["arm"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(arm("same")["from_step"], serde_json::Value::Null);
    assert_eq!(arm("same")["steps_compared"], 3, "steps 1 to 3");
    // The ratio reaches the players' prompts and the target (an aggregate) from step 3 on.
    assert_eq!(arm("half-from-3")["from_step"], 3, "{}", ran.text);
    let differences = cf["differences"].as_array().unwrap();
    assert!(!differences.is_empty());
    for d in differences {
        let step = d["step"].as_u64().unwrap();
        if d["arm"] == "same" || step < 3 {
            assert_eq!(d["difference"], 0.0, "{d}");
        }
        assert_eq!(d["replicates"], 2, "{d}");
    }
    let csv = std::fs::read_to_string(out.join("counterfactual.csv")).unwrap();
    assert!(
        csv.starts_with(
            "arm,population,step,column,replicates,base,mean,difference,ci_low,ci_high"
        )
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.contains("Against the base run") && html.contains("diverges from the base at step 3")
    );
    assert!(out.join("figures/difference_guess.svg").exists());
    // Every decision of the base before step 3 was reused, by both arms.
    let before = decisions(&base)
        .iter()
        .filter(|d| d["step"].as_u64().unwrap() < 3)
        .count() as u64;
    assert!(manifest(&out)["reuse"]["reused"].as_u64().unwrap() >= 2 * before);
}

fn refused(config_text: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let config = write(tmp.path(), "c", config_text);
    let ran = output(
        throng()
            .arg("run")
            .arg(&config)
            .args(["--policy", "scripted", "--no-report", "--out"])
            .arg(tmp.path().join("out")),
    );
    assert!(!ran.ok, "accepted:\n{}", ran.text);
    assert!(!tmp.path().join("out/state.parquet").exists());
    ran.text
}

#[test]
fn a_base_that_is_missing_unfinished_or_of_another_scenario_is_refused_with_the_way_on() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nowhere");
    let text_of = |base: &Path, extra: &str| {
        format!(
            "{}\n[counterfactual]\nbase = \"{}\"\n{extra}",
            text(MARKET),
            base.display()
        )
    };
    let said = refused(&text_of(&missing, ""));
    assert!(
        said.contains("field `counterfactual.base`") && said.contains("is not a run folder"),
        "{said}"
    );
    // A paused run of the market, and a finished guessing game.
    let paused = tmp.path().join("paused");
    let ran = output(
        throng()
            .arg("run")
            .arg(write(tmp.path(), "m", &text(MARKET)))
            .args([
                "--policy",
                "scripted",
                "--no-report",
                "--stop-after",
                "1",
                "--out",
            ])
            .arg(&paused),
    );
    assert!(ran.ok, "{}", ran.text);
    let said = refused(&text_of(&paused, ""));
    assert!(
        said.contains("has not finished") && said.contains("throng run --resume"),
        "{said}"
    );
    let guess = tmp.path().join("guess");
    let ran = output(
        throng()
            .arg("run")
            .arg(write(tmp.path(), "g", &text(GUESS)))
            .args(["--policy", "scripted", "--no-report", "--out"])
            .arg(&guess),
    );
    assert!(ran.ok, "{}", ran.text);
    let said = refused(&text_of(&guess, ""));
    assert!(said.contains("guess scenario"), "{said}");
    let said = refused(&format!(
        "{}\n[counterfactual]\nbase = \"{}\"\narm = \"control\"\n",
        text(GUESS),
        guess.display()
    ));
    assert!(
        said.contains("field `counterfactual.arm`") && said.contains("its arms are `base`"),
        "{said}"
    );
}

// Guards against issue 30, item 20: a base with no population size in common was compared
// ("does not diverge from the base in the 0 steps both ran"), a shorter base was compared over
// its steps without a word, and `base = ""` was refused without its line.
#[test]
fn a_base_with_nothing_or_less_in_common_is_refused_or_said_plainly() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let short = text(GUESS).replace("steps = 3", "steps = 2");
    let ran = output(
        throng()
            .arg("run")
            .arg(write(tmp.path(), "b", &short))
            .args(["--policy", "scripted", "--no-report", "--out"])
            .arg(&base),
    );
    assert!(ran.ok, "{}", ran.text);
    let with_base =
        |config: &str, base: &str| format!("{config}\n[counterfactual]\nbase = \"{base}\"\n");
    let empty = with_base(&text(GUESS), "");
    let line = 1 + empty.lines().position(|l| l == "base = \"\"").unwrap();
    let said = refused(&empty);
    assert!(
        said.contains(&format!("c.toml:{line}:"))
            && said.contains("field `counterfactual.base` is empty")
            && said.contains("runs/"),
        "{said}"
    );
    let other_size = with_base(
        &text(GUESS).replace("agents = 6", "agents = 8"),
        base.to_str().unwrap(),
    );
    let said = refused(&other_size);
    assert!(
        said.contains("field `counterfactual.base`")
            && said.contains("no size in common")
            && said.contains("agents = 6"),
        "{said}"
    );
    // A base of fewer steps: the run says so as it starts, and its report says what was not
    // compared.
    let longer = with_base(
        &text(GUESS).replace("steps = 3", "steps = 4"),
        base.to_str().unwrap(),
    );
    let out = tmp.path().join("cf");
    let ran = output(
        throng()
            .arg("run")
            .arg(write(tmp.path(), "cf", &longer))
            .args(["--policy", "scripted", "--out"])
            .arg(&out),
    );
    assert!(ran.ok, "{}", ran.text);
    assert!(
        ran.text
            .contains("it ran 2 steps and this run 4: steps 3 to 4 are not compared"),
        "{}",
        ran.text
    );
    assert!(
        ran.text
            .contains("Not compared, as the base did not run them: this run's steps"),
        "{}",
        ran.text
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let not_compared = summary["counterfactual"]["not_compared"].to_string();
    assert!(not_compared.contains("steps 3, 4"), "{not_compared}");
}

#[test]
fn a_knob_that_shapes_the_first_worlds_cannot_change_from_a_step() {
    let said = refused(&format!(
        "{}\n[[arms]]\nname = \"richer\"\nfrom_step = 2\nscenario = {{ starting_resources = 50000.0 }}\n",
        text(MARKET)
    ));
    assert!(
        said.contains("arm `richer`")
            && said.contains("`starting_resources`")
            && said.contains("shapes the worlds at the start"),
        "{said}"
    );
    for (from, why) in [
        ("1", "leave `from_step` out"),
        ("0", "steps count from 1"),
        ("9", "after the run's last step (4)"),
    ] {
        let said = refused(&format!(
            "{}\n[[arms]]\nname = \"cap\"\nfrom_step = {from}\nscenario = {{ consumer_price_cap = 9.0 }}\n",
            text(MARKET)
        ));
        assert!(
            said.contains("field `arms.from_step`") && said.contains(why),
            "from_step = {from}: {said}"
        );
    }
}

/// The guessing game under a copy of its templates, as `edit` leaves them.
fn guess_with_templates(dir: &Path, edit: impl Fn(String) -> String) -> String {
    let templates = dir.join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    for entry in std::fs::read_dir(repo().join("templates/guess")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(templates.join(path.file_name().unwrap()), edit(text)).unwrap();
    }
    GUESS.replace(
        "templates = \"TEMPLATES/guess\"",
        &format!("templates = \"{}\"", templates.display()),
    )
}

// A change that reaches the schema alone (the prompt's text the same, token for token) or the
// model alone reuses nothing: both are part of a decision's input.
#[test]
fn a_change_of_schema_alone_or_of_model_alone_reuses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny();
    // The shipped system prompt names the reasoning's length; without it, only the schema's
    // `maxLength` says it.
    let cot = guess_with_templates(tmp.path(), |t| {
        t.replace(" (at most {{ reasoning_chars }} characters)", "")
    })
    .replace(
        "ratio = \"2/3\"",
        "ratio = \"2/3\"\nprompt = \"cot\"\nreasoning_chars = 40",
    )
    .replace("max_tokens = 16", "max_tokens = 24");
    let base = tmp.path().join("base");
    let ran = run(model.path(), &write(tmp.path(), "base", &cot), &base, None);
    assert!(ran.ok, "{}", ran.text);
    let longer = tmp.path().join("longer");
    let longer_config = write(
        tmp.path(),
        "longer",
        &cot.replace("reasoning_chars = 40", "reasoning_chars = 60"),
    );
    let ran = run_reusing(model.path(), &longer_config, &longer, &base);
    assert!(ran.ok, "{}", ran.text);
    let prompts = |dir: &Path| -> Vec<serde_json::Value> {
        decisions(dir)
            .iter()
            .map(|d| d["prompt_hash"].clone())
            .collect()
    };
    assert_eq!(prompts(&base), prompts(&longer), "the prompts are the same");
    assert_eq!(manifest(&longer)["reuse"]["reused"], 0, "{}", ran.text);
    // Another model (other random weights of the same shape).
    let other = common::tiny_model(&TinyLlama {
        max_position_embeddings: 8192,
        seed: 8,
        ..TinyLlama::default()
    });
    let elsewhere = tmp.path().join("other-model");
    let same = write(tmp.path(), "same", &cot);
    let ran = run_reusing(other.path(), &same, &elsewhere, &base);
    assert!(ran.ok, "{}", ran.text);
    assert!(ran.text.contains("made by other weights"), "{}", ran.text);
    assert_eq!(manifest(&elsewhere)["reuse"]["reused"], 0);
}
