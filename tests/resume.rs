//! A resume runs exactly what the run started with: its config and prompt templates as they
//! were (edits made while the run was paused are refused, naming what changed), the weight
//! format and the kind of device it started on; and the settings that change no bits (the
//! number of threads) may differ, with the same records.

mod common;

use common::TinyLlama;
use common::cli::{
    DECISIONS, RECORDS, Ran, assert_same_records, decisions_without_timings, output, repo, throng,
};
use std::path::{Path, PathBuf};

/// The guessing game, scripted, three rounds.
const GUESS: &str = "tests/fixtures/guess-resume.toml";

fn run(config: &Path, out: &Path, extra: &[&str]) -> Ran {
    output(
        throng()
            .args(["run", "--no-report"])
            .arg(config)
            .arg("--out")
            .arg(out)
            .args(extra),
    )
}

fn resume(out: &Path, extra: &[&str]) -> Ran {
    output(
        throng()
            .args(["run", "--no-report", "--resume"])
            .arg(out)
            .args(extra),
    )
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.contains(from),
        "{}: no `{from}` in\n{text}",
        path.display()
    );
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

// Guards against issue 17, item 1: a config edited while a run was paused (the game's ratio,
// the seed, the number of steps) was applied from the middle of the run on `--resume`,
// without a word, and the manifest kept showing the old settings.
#[test]
fn an_edited_config_is_refused_naming_every_change_until_it_is_undone() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = run(&repo().join(GUESS), &whole, &[]);
    assert!(ok, "{text}");
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&repo().join(GUESS), &out, &["--stop-after", "2"]);
    assert!(ok, "{text}");
    let config = out.join("config.toml");
    let before = std::fs::read(&config).unwrap();
    edit(&config, "seed = 9", "seed = 10");
    edit(&config, "steps = 3", "steps = 8");
    edit(
        &config,
        "name = \"guess\"",
        "name = \"guess\"\nratio = \"2/3\"\noffset = 1",
    );
    let paused = manifest(&out);
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(!ok, "the edited config was resumed:\n{text}");
    for change in [
        "`seed` was 9, now 10",
        "`steps` was 3, now 8",
        "`scenario.ratio` = \"2/3\" was added",
        "`scenario.offset` = 1 was added",
    ] {
        assert!(text.contains(change), "`{change}` not named:\n{text}");
    }
    assert!(
        text.contains("inputs/"),
        "says where the inputs as started are:\n{text}"
    );
    assert!(
        text.contains("--out"),
        "says how to start a new run:\n{text}"
    );
    assert_eq!(
        manifest(&out),
        paused,
        "a refused resume leaves the manifest as it was"
    );
    // Undone from the copy the folder keeps, the run resumes to the records of a run never
    // paused.
    std::fs::copy(out.join("inputs/config.toml"), &config).unwrap();
    assert_eq!(std::fs::read(&config).unwrap(), before);
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(ok, "{text}");
    assert_same_records(&whole, &out, &RECORDS, "resumed after the edit was undone");
}

// Guards against issue 17, item 1: a prompt template changed while a run was paused was
// used for the rest of the run. A run reads the copies its folder keeps: an edit of the
// original changes nothing, and an edit of a copy is refused.
#[test]
fn templates_are_the_run_folders_copies_and_an_edited_copy_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let templates = tmp.path().join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    for name in ["system.jinja", "player.jinja"] {
        std::fs::copy(
            repo().join("templates/guess").join(name),
            templates.join(name),
        )
        .unwrap();
    }
    let fixture = std::fs::read_to_string(repo().join(GUESS)).unwrap();
    let config = tmp.path().join("exp.toml");
    std::fs::write(
        &config,
        fixture.replace(
            "templates = \"../../templates/guess\"",
            "templates = \"templates\"",
        ),
    )
    .unwrap();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = run(&config, &whole, &[]);
    assert!(ok, "{text}");
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&config, &out, &["--stop-after", "1"]);
    assert!(ok, "{text}");
    for name in ["system.jinja", "player.jinja"] {
        assert_eq!(
            std::fs::read(out.join("inputs/templates").join(name)).unwrap(),
            std::fs::read(templates.join(name)).unwrap(),
            "{name} is kept in the run folder"
        );
    }
    // The original changes: the paused run does not see it.
    std::fs::write(templates.join("player.jinja"), "{{ undefined_thing }}").unwrap();
    let Ran { ok, text, .. } = resume(&out, &["--stop-after", "1"]);
    assert!(ok, "the original template reached the paused run:\n{text}");
    // The run's own copy changes: refused, naming it.
    let copy = out.join("inputs/templates/system.jinja");
    let kept = std::fs::read(&copy).unwrap();
    std::fs::write(&copy, [&kept[..], b"\nOne more rule."].concat()).unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("inputs/templates/system.jinja was edited"),
        "{text}"
    );
    std::fs::remove_file(&copy).unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("inputs/templates/system.jinja is missing"),
        "{text}"
    );
    std::fs::write(&copy, kept).unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(ok, "{text}");
    assert_same_records(&whole, &out, &RECORDS, "resumed from the kept templates");
}

// Guards against issue 30, item 21: an edited copy of a template (`inputs/templates/...`) was
// reported with the advice to undo it from "the templates as it started in inputs/", which is
// the very copy that was edited. The advice names the template it was copied from.
#[test]
fn an_edited_template_copy_is_undone_from_the_template_it_was_copied_from() {
    let tmp = tempfile::tempdir().unwrap();
    let templates = tmp.path().join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    // Templates of this study's own (not the repository's, which would also match).
    for name in ["system.jinja", "player.jinja"] {
        let text = std::fs::read_to_string(repo().join("templates/guess").join(name)).unwrap();
        std::fs::write(templates.join(name), text + "{# this study #}\n").unwrap();
    }
    let fixture = std::fs::read_to_string(repo().join(GUESS)).unwrap();
    let config = tmp.path().join("exp.toml");
    std::fs::write(
        &config,
        fixture.replace(
            "templates = \"../../templates/guess\"",
            "templates = \"templates\"",
        ),
    )
    .unwrap();
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&config, &out, &["--stop-after", "1"]);
    assert!(ok, "{text}");
    let copy = out.join("inputs/templates/player.jinja");
    let kept = std::fs::read(&copy).unwrap();
    std::fs::write(&copy, [&kept[..], b"\nAnswer fast."].concat()).unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(!ok, "{text}");
    let original = templates.join("player.jinja");
    assert!(
        text.contains(&format!("{} was edited", copy.display()))
            && text.contains(&format!(
                "{} is the template as it started: copy it to {}",
                original.display(),
                copy.display()
            ))
            && !text.contains("as it started are in"),
        "{text}"
    );
    // Once the original changed too, the run's copy was the last one as it started.
    std::fs::write(&original, "{{ changed }}").unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("the run's own copy of a template") && text.contains("put back"),
        "{text}"
    );
    // The advice works.
    std::fs::write(&copy, &kept).unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(ok, "{text}");
}

/// A config for the LLM policy on the tiny random model: every decision samples, so a
/// different weight format or any other change of bits shows in the records.
fn llm_config(dir: &Path) -> PathBuf {
    let path = dir.join("llm.toml");
    std::fs::write(
        &path,
        format!(
            r#"name = "resume-llm"
seed = 3
replicates = 1
steps = 3
policy = "llm"
templates = {:?}
agents = 12

[llm]
max_tokens = 24
temperature = 1.0

[scenario]
name = "guess"
"#,
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    path
}

fn llm_args(model: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--model".to_string(),
        model.display().to_string(),
        "--kv-memory".into(),
        "16MiB".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

// Guards against issue 17, item 2: `--resume --weights f32` on an int8 run exited 0 with
// records that differ from an uninterrupted run, and overwrote the manifest's weight format;
// and a resume without --weights loaded `auto`, whatever the run started with.
#[test]
fn a_resume_keeps_the_weight_format_and_device_kind_it_started_with() {
    let model = common::tiny_model(&TinyLlama::default());
    let tmp = tempfile::tempdir().unwrap();
    let config = llm_config(tmp.path());
    for weights in ["f32", "int8"] {
        let args = llm_args(model.path(), &["--weights", weights]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let whole = tmp.path().join(format!("whole-{weights}"));
        let Ran { ok, text, .. } = run(&config, &whole, &args);
        assert!(ok, "{text}");
        let out = tmp.path().join(format!("run-{weights}"));
        let Ran { ok, text, .. } =
            run(&config, &out, &[&args[..], &["--stop-after", "1"]].concat());
        assert!(ok, "{text}");
        assert_eq!(manifest(&out)["weight_format"], weights);
        let other = if weights == "f32" { "int8" } else { "f32" };
        for refused in [
            &["--weights", other][..],
            &["--weights", weights],
            &["--device", "cuda:0"],
            &["--out", "elsewhere"],
        ] {
            let Ran { ok, text, .. } = resume(&out, refused);
            assert!(!ok, "{refused:?} was accepted:\n{text}");
            assert!(text.contains("--resume"), "{refused:?}: {text}");
        }
        assert_eq!(manifest(&out)["weight_format"], weights, "left as it was");
        // Without --weights, the resume loads the format the run started with, not `auto`.
        let Ran { ok, text, .. } = resume(&out, &[]);
        assert!(ok, "{text}");
        assert_eq!(manifest(&out)["weight_format"], weights);
        assert_same_records(&whole, &out, &RECORDS, &format!("{weights}, resumed"));
    }
}

// The book's Run folder chapter (docs/src/run-folder.md) says a resume may change the number
// of threads because no kernel's result depends on it; this holds it to that, for every CPU
// format `auto` chooses.
#[test]
fn a_resume_on_another_number_of_threads_gives_the_same_records() {
    let model = common::tiny_model(&TinyLlama::default());
    let tmp = tempfile::tempdir().unwrap();
    let config = llm_config(tmp.path());
    for weights in ["f32", "int8", "bf16"] {
        let args = llm_args(model.path(), &["--weights", weights]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let whole = tmp.path().join(format!("whole-{weights}"));
        let Ran { ok, text, .. } = output(
            throng()
                .args(["--threads", "2", "run", "--no-report"])
                .arg(&config)
                .arg("--out")
                .arg(&whole)
                .args(&args),
        );
        assert!(ok, "{text}");
        let out = tmp.path().join(format!("run-{weights}"));
        let Ran { ok, text, .. } = output(
            throng()
                .args(["--threads", "1", "run", "--no-report"])
                .arg(&config)
                .arg("--out")
                .arg(&out)
                .args(&args)
                .args(["--stop-after", "1"]),
        );
        assert!(ok, "{text}");
        let Ran { ok, text, .. } = output(
            throng()
                .args(["--threads", "2", "run", "--no-report", "--resume"])
                .arg(&out),
        );
        assert!(ok, "{text}");
        assert_same_records(
            &whole,
            &out,
            &RECORDS,
            &format!("{weights}, 1 thread then 2"),
        );
    }
}

// Guards against issue 30, item 1: a run with `--kv-format f32`, paused and resumed without
// the flag, went on with the default KV cache (f16 on the CPU) and its resumed steps differed
// from the uninterrupted run's, without a word; `--kv-format` and `--tokenizer` were not
// recorded at all, so neither a resume nor the live view's Resume could take them again.
#[test]
fn a_resume_keeps_the_kv_format_and_tokenizer_it_started_with() {
    let model = common::tiny_model(&TinyLlama::default());
    let tmp = tempfile::tempdir().unwrap();
    let config = llm_config(tmp.path());
    // The model's own tokenizer, named as a file of its own: recorded as given.
    let tokenizer = tmp.path().join("tokenizer.json");
    std::fs::copy(model.path().join("tokenizer.json"), &tokenizer).unwrap();
    let tokenizer = tokenizer.display().to_string();
    let args = llm_args(
        model.path(),
        &["--kv-format", "f32", "--tokenizer", &tokenizer],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = run(&config, &whole, &args);
    assert!(ok, "{text}");
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&config, &out, &[&args[..], &["--stop-after", "1"]].concat());
    assert!(ok, "{text}");
    let engine = &manifest(&out)["engine"];
    assert_eq!(engine["kv_format"], "f32", "{engine}");
    assert_eq!(engine["tokenizer"], tokenizer.as_str(), "{engine}");
    let models = engine["models"].as_object().unwrap();
    assert_eq!(models.len(), 1, "{engine}");
    let loaded = models.values().next().unwrap();
    assert_eq!(loaded["kv"], "F32", "{engine}");
    assert_eq!(
        loaded["weights"].as_str().unwrap().len(),
        64,
        "a sha256: {engine}"
    );
    for refused in [
        &["--kv-format", "f16"][..],
        &["--tokenizer", "/elsewhere/tokenizer.json"],
    ] {
        let Ran { ok, text, .. } = resume(&out, refused);
        assert!(!ok, "{refused:?} was accepted:\n{text}");
        assert!(
            text.contains(&format!("drop {}", refused[0])),
            "{refused:?}: {text}"
        );
    }
    // Neither flag given: the resume takes both from the manifest, as the live view's
    // Resume (a plain `throng run --resume`) does.
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(ok, "{text}");
    assert_eq!(manifest(&out)["engine"], manifest(&whole)["engine"]);
    assert_same_records(&whole, &out, &RECORDS, "f32 KV, resumed without the flag");
}

// Guards against issue 30, item 1: `--resume` did not check that the model it loads is the
// one the run started with; weights replaced in place (or a relative --model found from
// another folder) resumed silently, with the rest of the run computed by another model.
#[test]
fn a_resume_refuses_a_model_whose_files_changed_since_the_run_started() {
    let model = common::tiny_model(&TinyLlama::default());
    let other = common::tiny_model(&TinyLlama {
        seed: 99,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = llm_config(tmp.path());
    let args = llm_args(model.path(), &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&config, &out, &[&args[..], &["--stop-after", "1"]].concat());
    assert!(ok, "{text}");
    let before = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    std::fs::copy(
        other.path().join("model.safetensors"),
        model.path().join("model.safetensors"),
    )
    .unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(!ok, "a replaced model was resumed:\n{text}");
    assert!(
        text.contains("is not the one the run started with") && text.contains("sha256"),
        "{text}"
    );
    assert!(
        text.contains(&model.path().display().to_string()),
        "names where: {text}"
    );
    let after = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&before).unwrap()["steps_done"],
        serde_json::from_str::<serde_json::Value>(&after).unwrap()["steps_done"],
        "the run is left as it was"
    );
    // The weights put back, it resumes.
    std::fs::copy(
        common::tiny_model(&TinyLlama::default())
            .path()
            .join("model.safetensors"),
        model.path().join("model.safetensors"),
    )
    .unwrap();
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(ok, "{text}");
}

// Guards against issue 39, items 14 and 15: the book said resumed records are byte-identical,
// where an LLM run's decisions.jsonl differs in what measures the process (`latency_ms`,
// `cached_tokens`); and the resumed process's engine line counted the whole run's requests
// (24 where it decided 12).
#[test]
fn a_resumed_llm_run_differs_only_in_what_measures_the_process_and_counts_its_own_requests() {
    let model = common::tiny_model(&TinyLlama::default());
    let tmp = tempfile::tempdir().unwrap();
    let config = llm_config(tmp.path());
    let args = llm_args(model.path(), &["--weights", "f32"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = run(&config, &whole, &args);
    assert!(ok, "{text}");
    assert!(
        text.contains("throng: 36 requests"),
        "3 steps of 12: {text}"
    );
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&config, &out, &[&args[..], &["--stop-after", "1"]].concat());
    assert!(ok, "{text}");
    let Ran { ok, text, .. } = resume(&out, &[]);
    assert!(ok, "{text}");
    assert!(
        text.contains("throng: 24 requests"),
        "the resumed process decided the last 2 steps: {text}"
    );
    assert_same_records(&whole, &out, &RECORDS, "resumed");
    assert_eq!(
        decisions_without_timings(&whole),
        decisions_without_timings(&out),
        "{DECISIONS} without latency_ms and cached_tokens"
    );
}
