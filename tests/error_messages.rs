//! Errors say where the problem is and what to do: the config line of a duplicate or a
//! nonsensical setting, the variable a template lacks, the unit shares are written in, the
//! cause of a bad model file in a line or two, and a model path that does not exist.

mod common;

use common::TinyLlama;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use throng::sim::experiment::Overrides;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const HEADER: &str = "name = \"errors\"\nsteps = 1\nagents = 4\npolicy = \"scripted\"\n";

/// A guessing-game config: `HEADER`, its templates, then `body`.
fn write(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    std::fs::write(
        &path,
        format!(
            "{HEADER}templates = {:?}\n{body}",
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    path
}

/// The error of loading `body`, and the 1-based line of the config that holds `needle`.
fn error_at(body: &str, needle: &str) -> (String, Option<usize>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), body);
    let text = std::fs::read_to_string(&path).unwrap();
    let line = 1 + text
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in {text}"));
    let err = throng::scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .expect_err(body);
    (err.to_string(), err.line(), line)
}

const SCENARIO: &str = "\n[scenario]\nname = \"guess\"\n";

// Guards against issue 17, item 18: duplicate arm names, duplicate sweep values and
// `records.decisions = { sample = 0 }` were reported at `1:1` instead of their line.
#[test]
fn config_mistakes_are_reported_at_their_own_line() {
    // The second arm of a name, with the line of the first.
    let body = format!(
        "{SCENARIO}\n[[arms]]\nname = \"a\"\n\n[[arms]]\nname = \"b\"\n\n[[arms]]\nname = \"a\"\nscenario = {{ hint = true }}\n"
    );
    let (err, line, _) = error_at(&body, "name = \"a\"");
    let lines: Vec<usize> = format!("{HEADER}templates = x\n{body}")
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("name = \"a\""))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(line, Some(lines[1]), "{err}");
    assert!(
        err.contains("two arms are named `a`")
            && err.contains(&format!("the first at line {}", lines[0]))
            && err.contains("field `arms.name`"),
        "{err}"
    );
    // A value listed twice in a sweep, of a scenario knob or a sampling setting; `0.5` and
    // "0.5" would make two arms of the same name too.
    for (sweep, key, twice) in [
        (
            "scenario = { ratio = [\"1/2\", \"2/3\", \"1/2\"] }",
            "ratio",
            "1/2",
        ),
        ("scenario = { hint = [true, true] }", "hint", "true"),
        (
            "llm = { temperature = [0.5, 0.7, 0.5] }",
            "temperature",
            "0.5",
        ),
        ("scenario = { offset = [0.5, \"0.5\"] }", "offset", "0.5"),
    ] {
        let body = format!("{SCENARIO}\n[sweep]\n{sweep}\n");
        let (err, line, expected) = error_at(&body, key);
        assert_eq!(line, Some(expected), "{err}");
        assert!(
            err.contains(&format!(".{key}`: `{twice}` is listed twice")),
            "{err}"
        );
    }
    // A sample of no agents, in a [records] table and as a dotted key.
    let body = format!("{SCENARIO}\n[records]\ncsv = \"never\"\ndecisions = {{ sample = 0 }}\n");
    let (err, line, expected) = error_at(&body, "sample = 0");
    assert_eq!(line, Some(expected), "{err}");
    assert!(
        err.contains("`decisions`") && err.contains("a sample of 0 agents logs nothing"),
        "{err}"
    );
    let body = format!("records.decisions = {{ sample = 0 }}\n{SCENARIO}");
    let (err, line, expected) = error_at(&body, "sample = 0");
    assert_eq!(line, Some(expected), "{err}");
    assert!(err.contains("a sample of 0 agents"), "{err}");
    // Larger samples are fine.
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        &format!("{SCENARIO}\n[records]\ndecisions = {{ sample = 3 }}\n"),
    );
    throng::scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .unwrap();
}

// Guards against issue 17, item 18: shares written as fractions that sum to 0.9 were reported
// as "sum to 0.9%".
#[test]
fn shares_are_reported_in_the_unit_they_are_written_in() {
    let body = format!(
        "{SCENARIO}\n[population.attributes.education]\nshares = {{ school = 0.5, university = 0.4 }}\n"
    );
    let (err, line, expected) = error_at(&body, "shares");
    assert_eq!(line, Some(expected), "{err}");
    assert!(
        err.contains("shares sum to 0.9: as fractions they must sum to 1") && !err.contains('%'),
        "{err}"
    );
    let body = format!(
        "{SCENARIO}\n[population.attributes.education]\nshares = {{ school = 50, university = 40 }}\n"
    );
    let (err, _, _) = error_at(&body, "shares");
    assert!(
        err.contains("shares sum to 90%: they must sum to 100%"),
        "{err}"
    );
    let body = format!(
        "{SCENARIO}\n[population.attributes.a]\nshares = {{ x = 1, y = 1 }}\n\n[population.attributes.b]\nshares = {{ x = 1, y = 1 }}\n\n[[population.joint]]\nattributes = [\"a\", \"b\"]\nrows = [{{ a = \"x\", b = \"x\", share = 0.3 }}, {{ a = \"y\", b = \"y\", share = 0.3 }}]\n"
    );
    let (err, _, _) = error_at(&body, "shares");
    assert!(err.contains("sum to 2: as fractions"), "{err}");
}

fn throng(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_throng"));
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `config` with the LLM policy on a tiny model into `out`.
fn run_llm(config: &Path, model: &Path, out: &Path) -> Output {
    throng(
        &[
            "run",
            config.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--weights",
            "f32",
            "--kv-memory",
            "64MiB",
            "--no-report",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    )
}

// Guards against issue 17, item 18: an undefined template variable said "undefined value (in
// player:1)" without naming the variable, and the failed folder's advice was `--resume`, which
// renders the same template again.
#[test]
fn an_undefined_template_variable_is_named_with_a_fix_that_works() {
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    for (template, edit, variable, steps_before) in [
        ("player", "{{ foo }}\n", "`foo`", 0),
        (
            "player",
            "{{ own.missing }} {{ round }}\n",
            "`own.missing`",
            0,
        ),
        ("system", "{{ playerz }} players\n", "`playerz`", 0),
        // Round 2 only: the first step finishes, and its records are kept.
        (
            "player",
            "{% if round > 1 %}{{ earlier_rounds }}{% endif %}\n",
            "`earlier_rounds`",
            1,
        ),
    ] {
        let templates = tmp.path().join(format!("templates-{variable}"));
        std::fs::create_dir_all(&templates).unwrap();
        for name in ["system", "player", "persona"] {
            let file = format!("{name}.jinja");
            let mut text =
                std::fs::read_to_string(repo().join("templates/guess").join(&file)).unwrap();
            if name == template {
                text = format!("{edit}{text}");
            }
            std::fs::write(templates.join(&file), text).unwrap();
        }
        let config = tmp.path().join(format!("{template}-{steps_before}.toml"));
        std::fs::write(
            &config,
            format!(
                "name = \"undefined\"\nsteps = 2\nagents = 3\npolicy = \"llm\"\ntemplates = {:?}\n\n[llm]\nmax_tokens = 8\n{SCENARIO}",
                templates.display().to_string()
            ),
        )
        .unwrap();
        let out = tmp
            .path()
            .join(format!("run-{template}-{steps_before}-{}", variable.len()));
        let output = run_llm(&config, model.path(), &out);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("{template}.jinja"))
                && err.contains(&format!("undefined variable {variable}"))
                && err.contains("is given: "),
            "{err}"
        );
        assert!(err.contains("line 1 ("), "the line and its text: {err}");
        // The advice is to fix the template and start again, not to resume.
        assert!(
            err.contains("start a new run: throng run")
                && err.contains(&format!(
                    "fix {}",
                    templates.join(format!("{template}.jinja")).display()
                ))
                && !err.contains(&format!("throng run --resume {}", out.display())),
            "{err}"
        );
        match steps_before {
            0 => assert!(err.contains("has no finished step"), "{err}"),
            n => assert!(
                err.contains(&format!("keeps the {n} step finished")),
                "{err}"
            ),
        }
        let manifest: throng::record::Manifest =
            throng::record::read_json(&out.join("manifest.json")).unwrap();
        assert_eq!(manifest.status, throng::record::Status::Failed);
        assert!(manifest.error.unwrap().contains(variable));
    }
}

// Guards against issue 17, item 18: a file of garbage given as a GGUF model was refused with
// about 20 lines of candle backtrace (RUST_BACKTRACE=1) around its one-line cause.
#[test]
fn a_garbage_model_file_is_refused_in_a_line_or_two() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let garbage = tmp.path().join("garbage.gguf");
    std::fs::write(&garbage, &bytes).unwrap();
    // The GGUF magic and version, then garbage counts.
    bytes.splice(0..8, *b"GGUF\x03\x00\x00\x00");
    let magic = tmp.path().join("magic.gguf");
    std::fs::write(&magic, &bytes).unwrap();
    for (file, cause) in [(&garbage, "unknown magic"), (&magic, "tensor_count")] {
        for backtrace in ["1", "full", "0"] {
            let out = throng(
                &[
                    "generate",
                    "--model",
                    file.to_str().unwrap(),
                    "--prompt",
                    "hi",
                ],
                &[
                    ("RUST_BACKTRACE", backtrace),
                    ("RUST_LIB_BACKTRACE", backtrace),
                ],
            );
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(
                err.lines().count() <= 2 && !err.contains("candle_core::") && !err.contains(" at "),
                "RUST_BACKTRACE={backtrace}: {err}"
            );
            assert!(
                err.contains(cause)
                    && err.contains("not GGUF")
                    && err.contains(file.to_str().unwrap()),
                "{err}"
            );
        }
    }
}

// Guards against issue 17, item 18: a nonexistent `dir/file.gguf`, or a FIFO, was taken for a
// Hugging Face repo id (and looked up on the network), or blocked reading the pipe.
#[test]
fn a_model_that_looks_like_a_path_is_read_as_one() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("model.gguf");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let dangling = tmp.path().join("gone");
    std::os::unix::fs::symlink(tmp.path().join("nowhere.gguf"), &dangling).unwrap();
    let fifo = fifo.to_str().unwrap().to_string();
    let dangling = dangling.to_str().unwrap().to_string();
    for (spec, words) in [
        ("dir/file.gguf", "no such file or folder"),
        ("models/SmolLM2.Q4_1.GGUF", "no such file or folder"),
        ("./not-here", "no such file or folder"),
        ("../not-here/either", "no such file or folder"),
        ("/no/such/model", "no such file or folder"),
        (fifo.as_str(), "is a named pipe (FIFO), not a regular file"),
        ("/dev/null", "is a device, not a regular file"),
        (dangling.as_str(), "a symbolic link to"),
    ] {
        let started = Instant::now();
        let out = throng(
            &["generate", "--model", spec, "--prompt", "hi"],
            &[("HF_HUB_OFFLINE", "0")],
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{spec}: {err}");
        assert!(err.contains(spec) && err.contains(words), "{spec}: {err}");
        assert!(
            !err.contains("Hugging Face cache") && !err.contains("huggingface.co"),
            "{spec} was looked up as a repo id: {err}"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{spec} hung");
    }
    // A repo id is still a repo id: offline, its error names the Hub.
    let out = throng(
        &[
            "generate",
            "--model",
            "someone/some-model",
            "--prompt",
            "hi",
        ],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert!(
        stderr(&out).contains("Hugging Face cache"),
        "{}",
        stderr(&out)
    );
}
