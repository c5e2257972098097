//! Faults of a single process: SIGTERM (what a batch system sends at a job's time limit)
//! leaves a resumable folder and exits 0, and a damaged newest checkpoint makes `--resume`
//! fall back to the previous one with a warning. Ranks' faults are in `cluster.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn throng(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_throng"));
    cmd.current_dir(repo()).args(args);
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

/// Starts the LONG run into `dir` with step 3 never finishing, and waits until it is stuck
/// there: 2 steps recorded.
fn start_stuck(dir: &Path, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["run"];
    args.extend(LONG);
    let mut child = throng(&args)
        .arg(dir)
        .args(extra)
        .env("THRONG_CRASH_AT", "3:hang")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_done(dir) < 2 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "it ended before 2 steps"
        );
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn sigterm(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for `child` for at most `limit`; kills it and fails if it is still running then.
fn wait_at_most(mut child: std::process::Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}:\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A run stopped at once: exit 130, the folder paused at its last checkpoint, and `--resume`
/// finishes it with the records of an uninterrupted run.
fn assert_stopped_at_once_and_resumable(out: &Output, stopped: &Path, why: &str) {
    let shown = text(out);
    assert_eq!(out.status.code(), Some(130), "{shown}");
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
    let child = start_stuck(&stopped, &["--stop-timeout", "2"]);
    let signalled = Instant::now();
    sigterm(&child);
    let out = wait_at_most(child, Duration::from_secs(60));
    assert!(
        signalled.elapsed() >= Duration::from_secs(2),
        "it stopped before its deadline:\n{}",
        text(&out)
    );
    assert!(
        text(&out).contains("send the signal again, or wait 2 s, to stop at once"),
        "{}",
        text(&out)
    );
    assert_stopped_at_once_and_resumable(
        &out,
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
    let child = start_stuck(&stopped, &[]);
    sigterm(&child);
    std::thread::sleep(Duration::from_millis(500));
    sigterm(&child);
    let out = wait_at_most(child, Duration::from_secs(30));
    assert!(
        text(&out).contains("send the signal again, or wait 300 s, to stop at once"),
        "{}",
        text(&out)
    );
    assert_stopped_at_once_and_resumable(&out, &stopped, "a second signal");
}
