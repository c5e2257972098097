//! Command-line arguments that are not valid UTF-8, through the built `throng` binary: a path
//! may be any bytes the operating system allows, in every subcommand; a value that must be
//! text is refused by name, never with a panic.
#![cfg(unix)]

mod common;

use common::TinyLlama;
use common::cli::{Ran, output, repo, throng};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// `text` with a byte that is never valid UTF-8 in the middle of it.
fn not_utf8(text: &str) -> OsString {
    let mut bytes = text.as_bytes().to_vec();
    bytes.insert(bytes.len() / 2, 0xff);
    OsString::from_vec(bytes)
}

/// How an error shows the value `not_utf8(text)`.
fn shown(text: &str) -> String {
    format!("(`{}`)", not_utf8(text).as_bytes().escape_ascii())
}

/// A scripted guessing game whose templates are the repository's (an absolute path, so that
/// the config may live anywhere).
fn guess_config(path: &Path, policy: &str) {
    let templates = repo().join("templates/guess");
    std::fs::write(
        path,
        format!(
            "name = \"args\"\nsteps = 3\npolicy = \"{policy}\"\nagents = 6\ntemplates = \"{}\"\n\n\
             [llm]\nmax_tokens = 8\n\n[scenario]\nname = \"guess\"\n",
            templates.display()
        ),
    )
    .unwrap();
}

#[test]
// Guards against issue 17, item 9: a non-UTF-8 argument panicked `run` and `plan` (exit 101,
// `unwrap()` inside `std::env`), and clap's own refusal ("invalid UTF-8 was detected in one
// or more arguments") did not say which argument.
fn a_value_that_must_be_text_is_refused_by_name_in_every_subcommand() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("exp.toml");
    guess_config(&config, "scripted");
    let out = tmp.path().join("never");
    let run = |flag: &str| -> Vec<OsString> {
        vec![
            "run".into(),
            config.clone().into(),
            "--out".into(),
            out.clone().into(),
            flag.into(),
        ]
    };
    let cases: Vec<(Vec<OsString>, &str)> = vec![
        (vec!["generate".into(), "--prompt".into()], "prompt"),
        (
            vec![
                "generate".into(),
                "--prompt".into(),
                "hi".into(),
                "--system".into(),
            ],
            "system",
        ),
        (
            vec![
                "generate".into(),
                "--prompt".into(),
                "hi".into(),
                "--model".into(),
            ],
            "model",
        ),
        (run("--model"), "model"),
        (run("--device"), "device"),
        (run("--devices"), "devices"),
        (run("--agents"), "agents"),
        (run("--steps"), "steps"),
        (run("--kv-memory"), "kv-memory"),
        (
            vec![
                "plan".into(),
                config.clone().into(),
                "--device-profile".into(),
            ],
            "device-profile",
        ),
        (
            vec!["plan".into(), config.clone().into(), "--model".into()],
            "model",
        ),
        (vec!["bench".into(), "--device".into()], "device"),
        (vec!["bench".into(), "--agents".into()], "agents"),
        (vec!["models".into(), "--threads".into()], "threads"),
        (vec!["fetch".into(), "--threads".into()], "threads"),
        (
            vec!["report".into(), tmp.path().into(), "--threads".into()],
            "threads",
        ),
    ];
    for (args, flag) in cases {
        let mut cmd = throng();
        cmd.args(&args).arg(not_utf8("cuda:0"));
        let Ran { code, text, .. } = output(&mut cmd);
        let context = format!("{args:?}: {text}");
        assert_eq!(code, Some(2), "{context}");
        assert!(
            text.contains(&format!(
                "the value of --{flag} {} is not valid UTF-8",
                shown("cuda:0")
            )) && text.contains("takes text"),
            "{context}"
        );
    }
    // `--flag=value`, and a text value after a path that is not UTF-8 either: the text one
    // is named, not the path.
    let weird_config = tmp.path().join(not_utf8("exp.toml"));
    std::fs::copy(&config, &weird_config).unwrap();
    let mut model_eq = OsString::from("--model=");
    model_eq.push(not_utf8("smollm"));
    for args in [
        vec![
            OsString::from("run"),
            config.clone().into(),
            model_eq.clone(),
        ],
        vec![
            "run".into(),
            weird_config.clone().into(),
            "--out".into(),
            tmp.path().join(not_utf8("out")).into(),
            "--device".into(),
            not_utf8("cpu"),
        ],
    ] {
        let Ran { code, text, .. } = output(throng().args(&args));
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(
            text.contains(&format!("--model {}", shown("smollm")))
                || text.contains(&format!("--device {}", shown("cpu"))),
            "{args:?}: {text}"
        );
    }
    assert!(!out.exists(), "a refused run wrote its folder");
    assert!(!tmp.path().join(not_utf8("out")).exists());
}

#[test]
// Guards against issue 17, item 9: paths that are not UTF-8 must work wherever a path is
// taken: a config, `--out`, `--resume`, a run folder to report, `--requests`, `--tokenizer`,
// `--schema`, `--json`, a model folder is text (it is recorded in config.toml).
fn paths_that_are_not_utf8_work_in_every_subcommand() {
    let tmp = tempfile::tempdir().unwrap();
    // run, --resume, report: a config and a run folder with such names.
    let config = tmp.path().join(not_utf8("guess.toml"));
    guess_config(&config, "scripted");
    let out = tmp.path().join(not_utf8("run folder"));
    let Ran { code, text, .. } = output(
        throng()
            .arg("run")
            .arg(&config)
            .args(["--no-report", "--stop-after", "1", "--out"])
            .arg(&out),
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("resume with"), "{text}");
    let Ran { code, text, .. } =
        output(throng().args(["run", "--no-report", "--resume"]).arg(&out));
    assert_eq!(code, Some(0), "{text}");
    let manifest: throng::record::Manifest =
        throng::record::read_json(&out.join("manifest.json")).unwrap();
    assert_eq!(manifest.status, throng::record::Status::Finished);
    assert_eq!(manifest.steps_done, 3);
    let Ran { code, text, .. } = output(throng().arg("report").arg(&out));
    assert_eq!(code, Some(0), "{text}");
    assert!(out.join("report.html").is_file(), "{text}");

    // plan: a config with such a name, sized with a tiny model.
    let model = common::tiny_model(&TinyLlama::default());
    let llm_config = tmp.path().join(not_utf8("llm.toml"));
    guess_config(&llm_config, "llm");
    let Ran { code, text, .. } = output(
        throng()
            .arg("plan")
            .arg(&llm_config)
            .args(["--sample", "2", "--model"])
            .arg(model.path()),
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("population 6"), "{text}");

    // generate: a requests file, a tokenizer and a schema with such names.
    let requests = tmp.path().join(not_utf8("requests.jsonl"));
    std::fs::write(
        &requests,
        "{\"prompt\": \"ab\", \"max_tokens\": 3}\n{\"prompt\": \"cd\", \"max_tokens\": 3}\n",
    )
    .unwrap();
    let tokenizer = tmp.path().join(not_utf8("tokenizer.json"));
    std::fs::copy(model.path().join("tokenizer.json"), &tokenizer).unwrap();
    let Ran { code, text, .. } = output(
        throng()
            .args(["generate", "--model"])
            .arg(model.path())
            .arg("--requests")
            .arg(&requests)
            .arg("--tokenizer")
            .arg(&tokenizer),
    );
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.matches("\"index\"").count(), 2, "{text}");
    let schema = tmp.path().join(not_utf8("schema.json"));
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}"#,
    )
    .unwrap();
    let Ran { code, text, .. } = output(
        throng()
            .args([
                "generate",
                "--prompt",
                "hi",
                "--max-tokens",
                "12",
                "--model",
            ])
            .arg(model.path())
            .arg("--schema")
            .arg(&schema),
    );
    assert_eq!(code, Some(0), "{text}");
    // A missing file with such a name is named, as any missing file.
    let missing = tmp.path().join(not_utf8("missing.jsonl"));
    let Ran { code, text, .. } = output(
        throng()
            .args(["generate", "--model"])
            .arg(model.path())
            .arg("--requests")
            .arg(&missing),
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("opening") && text.contains("g.jsonl") && text.contains("No such file"),
        "{text}"
    );

    // bench: its JSON written to such a path.
    let json = tmp.path().join(not_utf8("bench.json"));
    let Ran { code, text, .. } = output(
        throng()
            .args([
                "bench", "--agents", "4", "--steps", "1", "--reply", "2", "--json",
            ])
            .arg(&json),
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(json.is_file(), "{text}");
}

#[test]
// Guards against issue 17, item 9: the templates folder of a config in a folder whose path
// is not UTF-8 cannot be written into the run's config.toml (TOML is text), which `--resume`
// reads; the run is refused before its folder exists rather than resumed from a wrong path.
fn a_templates_folder_whose_path_is_not_utf8_is_refused_before_the_folder_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let odd = tmp.path().join(not_utf8("configs"));
    std::fs::create_dir(&odd).unwrap();
    let templates = odd.join("templates");
    std::fs::create_dir(&templates).unwrap();
    for name in ["system.jinja", "player.jinja"] {
        std::fs::copy(
            repo().join("templates/guess").join(name),
            templates.join(name),
        )
        .unwrap();
    }
    let config = odd.join("exp.toml");
    std::fs::write(
        &config,
        "name = \"odd\"\nsteps = 2\npolicy = \"scripted\"\nagents = 4\ntemplates = \"templates\"\n\n[scenario]\nname = \"guess\"\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    let Ran { code, text, .. } = output(throng().arg("run").arg(&config).arg("--out").arg(&out));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("templates folder") && text.contains("not valid UTF-8"),
        "{text}"
    );
    assert!(!out.exists(), "{text}");
}

#[test]
// Guards the replacement of `std::env::args()` (which panicked on a non-UTF-8 argument): an
// explicit `--model` still overrides the config's model, and its absence leaves the config's.
fn an_explicit_model_is_still_told_from_the_default() {
    let tmp = tempfile::tempdir().unwrap();
    let (own, given) = (
        common::tiny_model(&TinyLlama::default()),
        common::tiny_model(&TinyLlama::default()),
    );
    let config = tmp.path().join("exp.toml");
    guess_config(&config, "llm");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "max_tokens = 8",
        &format!("max_tokens = 8\nmodel = \"{}\"", own.path().display()),
    );
    std::fs::write(&config, text).unwrap();
    for (model, out) in [(None, "default"), (Some(given.path()), "given")] {
        let out = tmp.path().join(out);
        let mut cmd = throng();
        cmd.arg("run")
            .arg(&config)
            .args(["--no-report", "--steps", "1", "--out"])
            .arg(&out);
        if let Some(model) = model {
            cmd.arg("--model").arg(model);
        }
        let Ran { code, text, .. } = output(&mut cmd);
        assert_eq!(code, Some(0), "{text}");
        let used = model.unwrap_or(own.path());
        let resolved = std::fs::read_to_string(out.join("config.toml")).unwrap();
        assert!(
            resolved.contains(&format!("model = \"{}\"", used.display())),
            "{resolved}"
        );
    }
}
