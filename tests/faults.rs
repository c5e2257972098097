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
