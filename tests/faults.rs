//! Faults of a single process: SIGTERM (what a batch system sends at a job's time limit)
//! leaves a resumable folder and exits 0, and a damaged newest checkpoint makes `--resume`
//! fall back to the previous one with a warning. Ranks' faults are in `cluster.rs`.

mod common;

use common::cli::{self, Ran, Watched};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `cli::throng()` with `args`.
fn throng(args: &[&str]) -> Command {
    let mut cmd = cli::throng();
    cmd.args(args);
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out
}

const RECORDS: [&str; 4] = [
    "state.parquet",
    "decisions.jsonl",
    "cells.jsonl",
    "aggregates.csv",
];

fn same_records(a: &Path, b: &Path) {
    for name in RECORDS {
        assert!(
            std::fs::read(a.join(name)).unwrap() == std::fs::read(b.join(name)).unwrap(),
            "{name} differs"
        );
    }
}

fn steps_done(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("steps.csv"))
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

/// A guessing game long enough (a few seconds) to be interrupted mid-run.
const LONG: [&str; 7] = [
    "experiments/guess-1m-dummy.toml",
    "--agents",
    "60000",
    "--steps",
    "25",
    "--no-report",
    "--out",
];

#[test]
// Guards the batch time limit: SIGTERM finishes the step, checkpoints, exits 0 with the
// resume command, and the resumed run's records equal an uninterrupted run's.
fn sigterm_leaves_a_resumable_folder_and_exits_0() {
    let tmp = tempfile::tempdir().unwrap();
    let (whole, stopped) = (tmp.path().join("whole"), tmp.path().join("stopped"));
    let mut args = vec!["run"];
    args.extend(LONG);
    ok(throng(&args).arg(&whole).stdout(Stdio::piped()));
    let mut child = throng(&args)
        .arg(&stopped)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_done(&stopped) < 2 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "it ended before 2 steps"
        );
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("stopped by a signal") && shown.contains("resume with: throng run --resume"),
        "{shown}"
    );
    assert!(steps_done(&stopped) < 25, "{shown}");
    let manifest: throng::record::Manifest =
        throng::record::read_json(&stopped.join("manifest.json")).unwrap();
    assert_eq!(manifest.status, throng::record::Status::Paused);
    ok(&mut throng(&[
        "run",
        "--resume",
        stopped.to_str().unwrap(),
        "--no-report",
    ]));
    same_records(&whole, &stopped);
}

/// The message a run prints when it reaches `THRONG_CRASH_AT=STEP:hang`.
const HUNG: &str = "this step never finishes";

/// Starts the LONG run into `dir` with step 3 never finishing, and waits until it is stuck
/// there: it says so when it reaches the hang, after step 2's records and checkpoint. (Two
/// steps in steps.csv are not enough: a signal that lands before step 3 begins pauses the
/// run the ordinary way.)
fn start_stuck(dir: &Path, extra: &[&str]) -> Watched {
    let mut args = vec!["run"];
    args.extend(LONG);
    let mut stuck = Watched::spawn(
        throng(&args)
            .arg(dir)
            .args(extra)
            .env("THRONG_CRASH_AT", "3:hang"),
    );
    stuck.wait_for(HUNG, 1, Duration::from_secs(120));
    assert_eq!(steps_done(dir), 2, "{}", stuck.printed());
    stuck
}

fn sigterm(stuck: &Watched) {
    let status = Command::new("kill")
        .args(["-TERM", &stuck.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A run stopped at once: exit 130, the folder paused at its last checkpoint, and `--resume`
/// finishes it with the records of an uninterrupted run.
fn assert_stopped_at_once_and_resumable(code: Option<i32>, shown: &str, stopped: &Path, why: &str) {
    assert_eq!(code, Some(130), "{shown}");
    assert!(
        shown.contains(&format!("stopped at once ({why})"))
            && shown.contains("resume with: throng run --resume"),
        "{shown}"
    );
    let manifest: throng::record::Manifest =
        throng::record::read_json(&stopped.join("manifest.json")).unwrap();
    assert_eq!(manifest.status, throng::record::Status::Paused, "{shown}");
    assert_eq!(manifest.steps_done, 2, "{shown}");
    let resumed = ok(&mut throng(&[
        "run",
        "--resume",
        stopped.to_str().unwrap(),
        "--no-report",
    ]));
    assert!(
        text(&resumed).contains("at step 2 of 25"),
        "{}",
        text(&resumed)
    );
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let mut args = vec!["run"];
    args.extend(LONG);
    ok(throng(&args).arg(&whole).stdout(Stdio::piped()));
    same_records(&whole, stopped);
}

#[test]
// Guards against issue 17, item 10: SIGTERM did not end a run whose step never finished (the
// pause waited for the end of the step). The first signal states a deadline; when the step
// is still running then, the run stops at once, paused at its last checkpoint.
fn a_step_that_cannot_finish_is_stopped_at_the_stated_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let stopped = tmp.path().join("stopped");
    let stuck = start_stuck(&stopped, &["--stop-timeout", "2"]);
    let signalled = Instant::now();
    sigterm(&stuck);
    let Ran {
        code, text: shown, ..
    } = stuck.wait_at_most(Duration::from_secs(60));
    assert!(
        signalled.elapsed() >= Duration::from_secs(2),
        "it stopped before its deadline:\n{shown}"
    );
    assert!(
        shown.contains("send the signal again, or wait 2 s, to stop at once"),
        "{shown}"
    );
    assert_stopped_at_once_and_resumable(
        code,
        &shown,
        &stopped,
        "the step did not finish within 2 s of the signal",
    );
}

#[test]
// Guards against issue 17, item 10: a second signal ends a run whose step cannot finish at
// once, long before the default deadline, and leaves it paused and resumable (the old
// second signal exited with the manifest still saying `running`).
fn a_second_signal_stops_a_step_that_cannot_finish_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let stopped = tmp.path().join("stopped");
    let stuck = start_stuck(&stopped, &[]);
    sigterm(&stuck);
    std::thread::sleep(Duration::from_millis(500));
    sigterm(&stuck);
    let Ran {
        code, text: shown, ..
    } = stuck.wait_at_most(Duration::from_secs(30));
    assert!(
        shown.contains("send the signal again, or wait 300 s, to stop at once"),
        "{shown}"
    );
    assert_stopped_at_once_and_resumable(code, &shown, &stopped, "a second signal");
}
