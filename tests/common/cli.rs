//! Running the built `throng` binary, and comparing the run folders it writes.
//!
//! `throng()` is the command every test starts from; `output` (or `output_within`, with a time
//! limit) runs it and fails the test if it crashed; `assert_same_records` holds a run folder
//! against an uninterrupted run's.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The repository root, where `throng()` runs (the shipped `experiments/`, `templates/` and
/// `tests/fixtures/` are found from it): the package's own folder, or for the browser test,
/// a package of its own in `tests/browser`, the folder above it that holds `experiments/`.
pub fn repo() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("experiments").is_dir())
        .unwrap_or(manifest)
        .to_path_buf()
}

/// The built `throng` binary: Cargo names it to the throng package's tests. The browser test
/// is a package of its own, so that its WebDriver client's dependencies do not change the
/// features (and so the build) of the throng that `cargo test` and the Python wheel share; it
/// runs the binary `THRONG_BIN` names, or the release build's.
pub fn binary() -> PathBuf {
    if let Some(path) = option_env!("CARGO_BIN_EXE_throng") {
        return path.into();
    }
    let path = std::env::var_os("THRONG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/release/throng"));
    assert!(
        path.is_file(),
        "no throng binary at {}: build it first (cargo build --release) or set THRONG_BIN",
        path.display()
    );
    path
}

/// The variables that make the binary fail on purpose (`THRONG_CRASH_AT` aborts it at a
/// point of a run, `THRONG_FULL_DISK_AT` fails a write there as a full disk does). `throng()`
/// removes them, so that one left set in the shell cannot fail a test that does not ask for
/// it; a test that does sets it on the command.
pub const FAULTS: [&str; 2] = ["THRONG_CRASH_AT", "THRONG_FULL_DISK_AT"];

/// The built `throng` binary, run from the repository root, without the fault variables of
/// `FAULTS`. Add its arguments (and any environment) to it.
pub fn throng() -> Command {
    let mut cmd = Command::new(binary());
    cmd.current_dir(repo());
    for var in FAULTS {
        cmd.env_remove(var);
    }
    cmd
}

/// `throng()` with its cache (downloaded models, LLM-written personas) in `cache`, through
/// `THRONG_CACHE`.
pub fn throng_with_cache(cache: &Path) -> Command {
    let mut cmd = throng();
    cmd.env("THRONG_CACHE", cache);
    cmd
}

/// How a command ended.
#[derive(Debug)]
pub struct Ran {
    /// Whether it exited with status 0.
    pub ok: bool,
    /// Its exit code; `None` if a signal ended it.
    pub code: Option<i32>,
    /// Its stdout, then its stderr.
    pub text: String,
    /// How long it ran.
    pub took: Duration,
}

/// Runs `cmd` to its end, as `Command::output` does (stdin empty, stdout and stderr captured),
/// and says how it ended. A crash (a panic, or an allocation that aborted) fails the test
/// whatever the exit code: the binary reports every error it meets.
pub fn output(cmd: &mut Command) -> Ran {
    run(cmd, None)
}

/// `output`, and a command still running after `limit` fails the test (it is killed first):
/// for commands that must be refused or fail fast, which would otherwise run for hours.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Ran {
    run(cmd, Some(limit))
}

fn run(cmd: &mut Command, limit: Option<Duration>) -> Ran {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read both pipes while the command runs, so that one that prints much never blocks on a
    // full pipe.
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let status = match limit {
        None => child.wait().unwrap(),
        Some(limit) => loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > limit {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!(
                    "still running after {limit:?} (killed):\n{}",
                    String::from_utf8_lossy(&stderr.join().unwrap())
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        },
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    assert!(
        !text.contains("panicked") && !text.contains("memory allocation of"),
        "throng crashed instead of reporting an error:\n{text}"
    );
    Ran {
        ok: status.success(),
        code: status.code(),
        text,
        took,
    }
}

/// All that `pipe` gives until it closes, read on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        pipe.read_to_end(&mut bytes).unwrap();
        bytes
    })
}

/// The decisions log of a run folder.
pub const DECISIONS: &str = "decisions.jsonl";

/// The records a researcher publishes from whose bytes depend on the run alone, whatever its
/// policy (`state.csv` is written for small runs only). `decisions.jsonl`, the other, holds
/// timings; `assert_same_records` compares it in every case.
pub const RECORDS: [&str; 4] = [
    "state.parquet",
    "state.csv",
    "aggregates.csv",
    "cells.jsonl",
];

/// The records of a scripted run whose bytes depend on the run alone: `RECORDS`, and
/// `decisions.jsonl` too, since the scripted policy's decisions hold no timings.
pub const SCRIPTED_RECORDS: [&str; 5] = [
    "state.parquet",
    "state.csv",
    DECISIONS,
    "aggregates.csv",
    "cells.jsonl",
];

/// `decisions.jsonl` of the run folder `dir`, one value a line, without what measures the
/// process rather than the run: each decision's `latency_ms`, and its `cached_tokens` (the
/// prompt tokens this process's prefix cache held: a resumed process, or another rank,
/// starts with a cold cache). The scripted policy's decisions carry no LLM trace, so in them
/// `latency_ms` is null and `cached_tokens` 0 on every line (`DecisionLog` in
/// `src/record/decision.rs`, filled in `src/sim/runner/recorder.rs`): for a scripted run this
/// drops nothing that could differ.
pub fn decisions_without_timings(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(DECISIONS))
        .unwrap()
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            let record = value.as_object_mut().unwrap();
            record.remove("latency_ms");
            record.remove("cached_tokens");
            value
        })
        .collect()
}

/// Asserts that the run folder `other` holds the records of `whole` (an uninterrupted run of
/// the same experiment): each file of `names` is in both or in neither, with the same bytes;
/// and so is `decisions.jsonl`, with the same decisions but for their timings
/// (`decisions_without_timings`). List `decisions.jsonl` in `names` to compare its bytes too,
/// as a scripted run's may be (it holds no timings). `what` names the case in failures.
pub fn assert_same_records(whole: &Path, other: &Path, names: &[&str], what: &str) {
    // Whether `name` is in the run folders, which must agree on it.
    let kept = |name: &str| {
        let (a, b) = (whole.join(name).exists(), other.join(name).exists());
        assert_eq!(
            a, b,
            "{what}: {name} is in one run folder only (in the uninterrupted run's: {a})"
        );
        a
    };
    for name in names {
        if kept(name) {
            assert!(
                std::fs::read(whole.join(name)).unwrap()
                    == std::fs::read(other.join(name)).unwrap(),
                "{what}: {name} differs from the uninterrupted run's"
            );
        }
    }
    if kept(DECISIONS) {
        assert!(
            decisions_without_timings(whole) == decisions_without_timings(other),
            "{what}: the decisions differ from the uninterrupted run's"
        );
    }
}

/// A running command whose output is gathered as it comes, so that a test can wait for what
/// it says (a run reaching a point) and signal it there.
pub struct Watched {
    pub child: std::process::Child,
    printed: std::sync::Arc<std::sync::Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Watched {
    /// Starts `cmd` with stdout and stderr piped into one buffer.
    pub fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let pipes: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        let readers = pipes
            .into_iter()
            .map(|mut pipe| {
                let printed = printed.clone();
                std::thread::spawn(move || {
                    let mut chunk = [0u8; 4096];
                    while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                        printed
                            .lock()
                            .unwrap()
                            .push_str(&String::from_utf8_lossy(&chunk[..n]));
                    }
                })
            })
            .collect();
        Self {
            child,
            printed,
            readers,
        }
    }

    /// What it printed so far.
    pub fn printed(&self) -> String {
        self.printed.lock().unwrap().clone()
    }

    /// Waits until it has printed `text` `times` times; fails the test if it ends first or
    /// takes more than `limit`.
    pub fn wait_for(&mut self, text: &str, times: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.printed().matches(text).count() < times {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "it ended ({status}) before printing `{text}`:\n{}",
                    self.printed()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no `{text}` within {limit:?}:\n{}",
                self.printed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for it to end for at most `limit`, killing it and failing the test if it is still
    /// running then.
    pub fn wait_at_most(mut self, limit: Duration) -> Ran {
        let started = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if started.elapsed() > limit {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                panic!("still running after {limit:?}:\n{}", self.printed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = self.child.wait().unwrap();
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        let text = self.printed();
        assert!(!text.contains("panicked"), "it panicked:\n{text}");
        Ran {
            ok: status.success(),
            code: status.code(),
            text,
            took: started.elapsed(),
        }
    }
}
