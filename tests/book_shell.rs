//! The shell blocks of the README and the book, run as a reader would type them, on the
//! scripted policy: every ```sh block runs in a copy of the repository's experiments, templates
//! and example study, with `throng` the binary this build made and `cargo run --release --` that
//! binary (or the example study's, in its folder). A `throng run` without `--policy` gets
//! `--policy scripted`, so that no block waits on a model it need not. What a block needs that
//! this machine or this test cannot give (a GPU, several ranks, SLURM, a package install, a
//! server left running, the test command itself) is named by the rules in [`NOT_HERE`], each
//! with its reason and the test that covers it instead, and printed as it is passed over.
//!
//! A block fails the test when a command exits non-zero, with the block's file and line, the
//! script as it ran and its output.

mod common;

use common::book::{blocks, documents, root};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Lines passed over, by how they begin (after `cd` and variables): why, and what covers them.
const NOT_HERE: &[(&str, &str)] = &[
    (
        "scripts/test",
        "the test command itself, which runs this test",
    ),
    (
        "apt-get",
        "installs system packages: scripts/test installs what the tests need",
    ),
    (
        "cargo build",
        "a build: the test command builds the same features",
    ),
    (
        "CARGO_TARGET_DIR=target/cuda",
        "the CUDA build: scripts/gpu-check on a GPU machine",
    ),
    (
        "target/cuda/",
        "the CUDA binary: scripts/gpu-check on a GPU machine",
    ),
    (
        "scripts/gpu-check",
        "a GPU machine's check (docs/src/gpu.md)",
    ),
    (
        "mpirun",
        "several ranks: tests/cluster.rs runs them under mpirun",
    ),
    (
        "sbatch",
        "SLURM, which no machine here has: the script's `srun` line is the mpirun of tests/cluster.rs",
    ),
    (
        "pip install",
        "a package install: scripts/test builds and installs the wheel",
    ),
    ("maturin", "the wheel's build: scripts/test builds it"),
    (
        "python ",
        "the Python package, not installed in cargo's tests: python/tests/test_scenario.py runs the \
         example's class on its configs",
    ),
    (
        "throng api",
        "a server left running: tests/api.rs and python/tests/test_api_openai.py",
    ),
    ("curl", "asks a running server: tests/api.rs"),
];

/// Lines that name a device: a GPU's.
fn on_a_gpu(line: &str) -> bool {
    line.contains("--device cuda") || line.contains("--features cuda")
}

/// One ```sh block: where it is, and its lines.
struct Block {
    file: PathBuf,
    line: usize,
    lines: Vec<String>,
}

/// The ```sh blocks of `text`, their continued lines (`\` at the end) joined.
fn sh_blocks(file: &Path, text: &str) -> Vec<Block> {
    blocks(text)
        .into_iter()
        .filter(|b| b.info == "sh")
        .map(|b| {
            let mut lines: Vec<String> = Vec::new();
            for line in b.lines {
                match lines.last_mut() {
                    Some(last) if last.ends_with('\\') => {
                        last.pop();
                        last.push(' ');
                        last.push_str(line.trim_start());
                    }
                    _ => lines.push(line),
                }
            }
            Block {
                file: file.to_path_buf(),
                line: b.line,
                lines,
            }
        })
        .collect()
}

/// Why `line` does not run here, if it does not.
fn not_here(line: &str) -> Option<&'static str> {
    let command = line.trim_start();
    if on_a_gpu(command) {
        return Some("a GPU: scripts/gpu-check on a GPU machine");
    }
    NOT_HERE
        .iter()
        .find(|(start, _)| command.starts_with(start))
        .map(|(_, why)| *why)
}

/// A fresh folder holding copies of what the blocks read: the experiments, templates, model
/// presets and the example study, and the inputs the engine chapter's commands name.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary folder");
    for part in ["experiments", "templates", "models", "examples"] {
        copy_tree(&root().join(part), &dir.path().join(part));
    }
    // The engine chapter's `--schema decision.json` and `--requests batch.jsonl`: the reader's
    // own files, here a decision of the energy market's shape and two requests.
    fs::write(
        dir.path().join("decision.json"),
        r#"{"type": "object", "properties": {"price": {"type": "number", "minimum": 0,
            "maximum": 300, "multipleOf": 0.01}, "reason": {"type": "string", "maxLength": 60}},
            "required": ["price", "reason"], "additionalProperties": false}"#,
    )
    .unwrap();
    fs::write(
        dir.path().join("batch.jsonl"),
        "{\"tag\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"Say yes.\"}], \
         \"max_tokens\": 8}\n{\"tag\": \"b\", \"prompt\": \"Count to three:\", \"max_tokens\": 8}\n",
    )
    .unwrap();
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name();
        // A run's folders and build outputs are not the reader's.
        if name == "runs" || name == "target" {
            continue;
        }
        if path.is_dir() {
            copy_tree(&path, &to.join(&name));
        } else {
            fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

/// The script a block runs as: `throng` and `cargo run --release --` are this build's
/// binaries, and a run without a policy is scripted.
fn script(lines: &[&str]) -> String {
    let throng = env!("CARGO_BIN_EXE_throng");
    let bin_dir = Path::new(throng).parent().unwrap();
    let study = bin_dir.join("public-goods");
    format!(
        r#"set -euo pipefail
throng_bin={throng:?}
study_bin={study:?}
scripted() {{
    local bin=$1; shift
    if [ "${{1:-}}" = run ] && [[ " $* " != *" --policy "* ]] && [[ " $* " != *" --resume "* ]]; then
        "$bin" "$@" --policy scripted
    else
        "$bin" "$@"
    fi
}}
throng() {{ scripted "$throng_bin" "$@"; }}
cargo() {{
    if [ "${{1:-}} ${{2:-}} ${{3:-}}" != "run --release --" ]; then
        echo "book_shell: only 'cargo run --release -- ...' runs here, not 'cargo $*'" >&2
        return 2
    fi
    shift 3
    case "$PWD" in
        */examples/public-goods)
            [ -x "$study_bin" ] || {{ echo "book_shell: $study_bin is not built: cargo build --release --workspace --features mpi" >&2; return 2; }}
            scripted "$study_bin" "$@" ;;
        *) scripted "$throng_bin" "$@" ;;
    esac
}}
{}
"#,
        lines.join("\n")
    )
}

#[test]
fn every_shell_block_of_the_readme_and_the_book_runs() {
    let have_model = common::smollm2().is_some();
    let mut ran = 0;
    let mut failures = Vec::new();
    for path in documents() {
        let text = fs::read_to_string(&path).unwrap();
        for block in sh_blocks(&path, &text) {
            let place = format!(
                "{}:{}",
                block.file.strip_prefix(root()).unwrap().display(),
                block.line
            );
            let mut lines = Vec::new();
            for line in &block.lines {
                match not_here(line) {
                    Some(why) => eprintln!("book_shell: {place}: passed over `{line}`: {why}"),
                    None if !have_model && line.contains("throng generate") => {
                        eprintln!("book_shell: {place}: passed over `{line}`: no SmolLM2 here")
                    }
                    None => lines.push(line.as_str()),
                }
            }
            if lines.iter().all(|l| l.trim().is_empty()) {
                continue;
            }
            let dir = workspace();
            let script = script(&lines);
            let out = Command::new("bash")
                .arg("-c")
                .arg(&script)
                .current_dir(dir.path())
                .output()
                .expect("bash runs");
            ran += 1;
            eprintln!("book_shell: {place}: ran {} lines", lines.len());
            if !out.status.success() {
                failures.push(format!(
                    "{place} ({}):\n{}\n--- stdout\n{}\n--- stderr\n{}",
                    out.status,
                    lines.join("\n"),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "shell blocks that failed:\n\n{}",
        failures.join("\n\n")
    );
    // The README's main job, the guessing game, the benches, generate and the example study
    // at least: a scan that found nothing would pass without running anything.
    assert!(ran >= 6, "only {ran} shell blocks ran");
}

#[test]
fn a_block_is_read_with_its_continued_lines_joined() {
    let text = "x\n```sh\nthrong run a.toml \\\n  --steps 2\nthrong report runs/a\n```\n\
                ```toml\nk = 1\n```\n```sh\necho hi\n```\n";
    let blocks = sh_blocks(Path::new("f.md"), text);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].line, 2);
    assert_eq!(
        blocks[0].lines,
        ["throng run a.toml  --steps 2", "throng report runs/a"]
    );
    assert_eq!(blocks[1].lines, ["echo hi"]);
    assert_eq!(
        not_here("mpirun -np 4 target/release/throng run x"),
        Some("several ranks: tests/cluster.rs runs them under mpirun")
    );
    assert!(not_here("throng run x --device cuda:0").is_some());
    assert_eq!(not_here("throng run x"), None);
}
