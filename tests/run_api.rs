//! The library's run API as a program that embeds throng calls it: typed options in, an
//! outcome or a typed error out, and progress told to an observer; the records it writes are
//! the command line's, byte for byte (the command line is a thin layer over the same call).

mod common;

use common::cli::{RECORDS, assert_same_records, output, throng};
use std::path::Path;
use throng::run::{Observer, RunError, RunOptions};
use throng::scenarios::Registry;
use throng::sim::runner::{Ended, Progress};

const CONFIG: &str = "tests/fixtures/guess-regression.toml";

/// What an observer was told.
#[derive(Default)]
struct Told {
    planned: u64,
    decided: u64,
    steps: usize,
    ended: Option<bool>,
}

impl Observer for Told {
    fn started(&mut self, planned: u64, root: bool) {
        assert!(root, "a process alone is its job's first rank");
        self.planned = planned;
    }

    fn progress(&mut self, progress: &Progress) {
        match progress {
            Progress::Decided(n) => self.decided += *n as u64,
            Progress::Step { .. } => self.steps += 1,
        }
    }

    fn ended(&mut self, finished: bool) {
        self.ended = Some(finished);
    }
}

/// A run of `config` into `out` through the library, without a report; signals are left to
/// the test harness.
fn options(out: &Path) -> RunOptions {
    RunOptions {
        out: Some(out.to_path_buf()),
        report: false,
        catch_signals: false,
        ..RunOptions::new(CONFIG)
    }
}

// Guards against the library and the command line running a config differently: the CLI is
// flags parsed into the same options, so the records must be the same bytes.
#[test]
fn a_library_run_writes_the_records_the_command_line_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let (library, command) = (tmp.path().join("library"), tmp.path().join("command"));
    let mut told = Told::default();
    let outcome = throng::run::run(&Registry::builtin(), options(&library), &mut told).unwrap();
    assert_eq!(outcome.ended, Ended::Finished);
    assert_eq!(outcome.dir, library);
    assert_eq!(outcome.lines(), [format!("run: {}", library.display())]);
    assert_eq!(told.ended, Some(true));
    assert_eq!(told.steps, outcome.steps_done as usize);
    assert!(told.steps > 0 && told.decided > 0 && told.decided <= told.planned);

    let ran = output(
        throng()
            .args(["run", CONFIG, "--no-report", "--out"])
            .arg(&command),
    );
    assert!(ran.ok, "{}", ran.text);
    let mut records = RECORDS.to_vec();
    records.push("decisions.jsonl");
    assert_same_records(
        &library,
        &command,
        &records,
        "the library's run and the command's",
    );
}

// Guards against a bad combination of options reaching the caller as a panic or as text to
// parse: it is a typed refusal saying what to drop, and nothing is written.
#[test]
fn a_resume_given_another_folder_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    let options = RunOptions {
        out: Some(elsewhere.clone()),
        catch_signals: false,
        ..RunOptions::resume(tmp.path().join("paused"))
    };
    let e = throng::run::run(&Registry::builtin(), options, &mut throng::run::Quiet)
        .expect_err("a resume runs in its own folder");
    assert!(matches!(e, RunError::Refused(_)), "{e:?}");
    assert!(e.to_string().contains("drop --out"), "{e}");
    assert!(!elsewhere.exists());
}

// Guards the stop a program that owns the signals asks for: the run pauses after the current
// step, resumable, and says so.
#[test]
fn an_observer_that_asks_to_stop_pauses_the_run_after_the_step() {
    struct StopAtOnce;
    impl Observer for StopAtOnce {
        fn stop_requested(&mut self) -> bool {
            true
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("paused");
    let outcome = throng::run::run(&Registry::builtin(), options(&dir), &mut StopAtOnce).unwrap();
    assert_eq!(outcome.ended, Ended::Paused);
    assert!(outcome.by_signal);
    let said = outcome.lines().join("\n");
    assert!(said.contains("resume with:"), "{said}");
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"status\": \"paused\""), "{manifest}");
}
