//! Templates that never finish rendering, through the built `throng` binary: every template a
//! user writes or brings (a scenario's prompts, the persona meta-prompt, a model's chat
//! template) renders under a work limit, and one that exceeds it fails at once, named with
//! its line, instead of running for hours.

mod common;

use common::TinyLlama;
use common::cli::{Ran, output_within, repo, throng_with_cache};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a command may run: one still rendering after a minute is killed, and the test
/// fails.
const LIMIT: Duration = Duration::from_secs(60);

/// The nested loops of the issue: ten billion iterations.
const NESTED: &str =
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}\n";

/// The guessing game's templates, copied into `dir` with `extra` on line `line` of `name`
/// (1-based; the lines after it move down).
fn templates_with(dir: &Path, name: &str, line: usize, extra: &str) {
    std::fs::create_dir_all(dir).unwrap();
    for file in ["system.jinja", "player.jinja", "persona.jinja"] {
        let mut text = std::fs::read_to_string(repo().join("templates/guess").join(file)).unwrap();
        if file == name {
            let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
            lines.insert(line - 1, extra);
            text = lines.concat();
        }
        std::fs::write(dir.join(file), text).unwrap();
    }
}

fn config(dir: &Path, templates: &Path, personas: bool) -> PathBuf {
    let path = dir.join("exp.toml");
    let population = match personas {
        true => {
            "\n[population.attributes.education]\nshares = { school = 50, university = 50 }\n\n[population.personas]\nmax_tokens = 8\n"
        }
        false => "",
    };
    std::fs::write(
        &path,
        format!(
            "name = \"loops\"\nsteps = 2\npolicy = \"llm\"\nagents = 4\ntemplates = {:?}\n\n\
             [llm]\nmax_tokens = 8\n\n[scenario]\nname = \"guess\"\n{population}",
            templates.display().to_string()
        ),
    )
    .unwrap();
    path
}

#[test]
// Guards against issue 17, item 10: nested template loops
// (`range(99999)` inside `range(99999)` in player.jinja) ran for 90 s with no output, and
// would have run for hours. Every prompt template now fails fast, with its file, its line
// and what went wrong; so does a template that builds a string of ten gigabytes.
fn a_prompt_template_that_does_too_much_work_fails_with_its_name_and_line() {
    let model = common::tiny_model(&TinyLlama::default());
    for (name, line, extra, personas) in [
        ("player.jinja", 5, NESTED, false),
        ("system.jinja", 9, NESTED, false),
        ("persona.jinja", 3, NESTED, true),
        ("player.jinja", 9, "{{ 'x' * 10000000000 }}\n", false),
        (
            // The line after the template's opening comment.
            "system.jinja",
            8,
            "{% set s = namespace(n=0) %}{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% set s.n = s.n + k %}{% endfor %}{% endfor %}{% endfor %}{{ s.n }}\n",
            false,
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let templates = tmp.path().join("templates");
        templates_with(&templates, name, line, extra);
        let config = config(tmp.path(), &templates, personas);
        let out = tmp.path().join("out");
        let Ran {
            code, text, took, ..
        } = output_within(
            throng_with_cache(tmp.path())
                .arg("run")
                .arg(&config)
                .args(["--no-report", "--model"])
                .arg(model.path())
                .arg("--out")
                .arg(&out),
            LIMIT,
        );
        let case = format!("{name} line {line} `{}`: {text}", extra.trim());
        assert_eq!(code, Some(1), "{case}");
        assert!(took < Duration::from_secs(60), "took {took:?}: {case}");
        let stem = name.trim_end_matches(".jinja");
        assert!(
            text.contains(&templates.join(name).display().to_string())
                && text.contains(&format!(
                    "{stem}, line {line}: the template did too much work"
                )),
            "{case}"
        );
        let manifest: throng::record::Manifest =
            throng::record::read_json(&out.join("manifest.json")).unwrap();
        assert_eq!(manifest.status, throng::record::Status::Failed, "{case}");
    }
}

#[test]
// Guards against issue 17, item 10, for the model's own chat template (its
// tokenizer_config.json comes with the model, from wherever the user got it): a runaway loop
// in it fails at the first request instead of hanging every one.
fn a_chat_template_that_does_too_much_work_fails_at_once() {
    let model = common::tiny_model(&TinyLlama::default());
    let config = model.path().join("tokenizer_config.json");
    let mut tokenizer_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    tokenizer_config["chat_template"] = format!(
        "{{{{ bos_token }}}}\n{NESTED}{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}"
    )
    .into();
    std::fs::write(&config, tokenizer_config.to_string()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let Ran {
        code, text, took, ..
    } = output_within(
        throng_with_cache(tmp.path())
            .args(["generate", "--prompt", "hi", "--max-tokens", "4", "--model"])
            .arg(model.path()),
        LIMIT,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(took < Duration::from_secs(60), "took {took:?}: {text}");
    assert!(
        text.contains("chat template") && text.contains("line 2: the template did too much work"),
        "{text}"
    );
}
