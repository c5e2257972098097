//! One process per device: `throng run` under `mpirun` gives the records of one process, in
//! both splits and for any number of ranks; a rank that dies or hangs ends the job with its
//! number; a stopped or killed job resumes under any number of ranks.
//!
//! These start the `throng` binary under Open MPI's `mpirun` (`--oversubscribe`: CI has 2
//! cores). Without `mpirun` they skip loudly, unless THRONG_REQUIRE_ASSETS=1 (CI), where that
//! is a failure: `.ci/run` installs Open MPI.

#![cfg_attr(not(feature = "mpi"), allow(dead_code, unused_imports))]

mod common;

use common::cli::{
    Ran, SCRIPTED_RECORDS, Watched, assert_same_records, decisions_without_timings, repo, throng,
};
use common::mpi::{mpi, mpirun};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out
}

/// Small scripted runs of the shipped configs: the energy market (3 cells) and the guessing
/// game (8 cells: 4 arms x 2 replicates).
fn scripted_runs() -> [(&'static str, Vec<&'static str>); 2] {
    [
        (
            "experiments/exp2-regulated.toml",
            vec![
                "--policy",
                "scripted",
                "--agents",
                "12",
                "--replicates",
                "3",
                "--steps",
                "4",
            ],
        ),
        (
            "experiments/guess-basic-vs-cot.toml",
            vec![
                "--policy",
                "scripted",
                "--agents",
                "30",
                "--replicates",
                "2",
                "--steps",
                "3",
            ],
        ),
    ]
}

#[cfg(not(feature = "mpi"))]
#[test]
// Guards against N copies of a non-MPI build each running the whole job into one folder.
fn a_build_without_mpi_refuses_to_run_under_mpirun() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("run");
    let (config, args) = &scripted_runs()[0];
    let mut all = vec![
        "run",
        config,
        "--no-report",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    all.extend(args.iter().copied());
    let out = mpi(&mpirun, 2, &all).output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("built without MPI") && text(&out).contains("--features mpi"),
        "{}",
        text(&out)
    );
    assert!(!out_dir.join("state.parquet").exists());
}

#[cfg(feature = "mpi")]
#[test]
// Guards rank invariance: a run's records never depend on how many ranks ran it or how they
// split it (scripted policy, energy market and guessing game).
fn scripted_records_are_identical_under_one_two_and_three_ranks() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for (i, (config, args)) in scripted_runs().iter().enumerate() {
        let alone = tmp.path().join(format!("{i}-alone"));
        let mut base = vec!["run", *config, "--no-report"];
        base.extend(args.iter().copied());
        let mut cmd = throng();
        cmd.args(&base).args(["--out", alone.to_str().unwrap()]);
        ok(cmd);
        for (n, split) in [
            (1, "cells"),
            (2, "cells"),
            (3, "cells"),
            (2, "agents"),
            (3, "agents"),
        ] {
            let dir = tmp.path().join(format!("{i}-{n}-{split}"));
            let mut all = base.clone();
            all.extend(["--split", split, "--out", dir.to_str().unwrap()]);
            let out = ok(mpi(&mpirun, n, &all));
            assert_same_records(
                &alone,
                &dir,
                &SCRIPTED_RECORDS,
                &format!("{config} on {n} ranks split by {split}"),
            );
            let steps = throng::record::read_steps(&dir).unwrap();
            assert!(steps.iter().all(|s| s.ranks == n), "{}", text(&out));
            // Each rank's own step time, for the live page to show a slow one (one process
            // alone has no ranks to compare).
            for s in &steps {
                let times: Vec<f64> = s
                    .rank_seconds
                    .split_whitespace()
                    .map(|t| t.parse().unwrap())
                    .collect();
                assert_eq!(times.len(), if n == 1 { 0 } else { n }, "{s:?}");
                assert!(times.iter().all(|t| t.is_finite() && *t >= 0.0), "{s:?}");
            }
        }
    }
}

/// A guessing game long enough (a few seconds) to be interrupted mid-run.
const LONG: [&str; 9] = [
    "experiments/guess-1m-dummy.toml",
    "--agents",
    "60000",
    "--steps",
    "25",
    "--no-report",
    "--rank-timeout",
    "30",
    "--out",
];

/// Rows of `steps.csv` written so far.
fn steps_done(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("steps.csv"))
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

fn wait_for_steps(dir: &Path, n: usize, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps_done(dir) < n {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before {n} steps");
        }
        assert!(Instant::now() < deadline, "no {n} steps within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` at most `limit`, killing it if it takes longer; returns its output.
fn wait_at_most(mut child: std::process::Child, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), started.elapsed());
        }
        if started.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}: it hangs\n{}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The process of rank `rank` among `mpirun`'s children.
#[cfg(feature = "mpi")]
fn rank_pid(mpirun_pid: u32, rank: usize) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let children = Command::new("pgrep")
            .args(["-P", &mpirun_pid.to_string()])
            .output()
            .unwrap();
        for pid in String::from_utf8_lossy(&children.stdout).split_whitespace() {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
            if environ.split(|&b| b == 0).any(|kv| kv == wanted.as_bytes()) {
                return pid.parse().unwrap();
            }
        }
        assert!(Instant::now() < deadline, "no rank {rank} under mpirun");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// The uninterrupted run of [`LONG`], by one process.
fn whole(tmp: &Path) -> PathBuf {
    let whole = tmp.join("whole");
    let mut cmd = throng();
    cmd.arg("run").args(LONG).arg(&whole);
    ok(cmd);
    whole
}

#[cfg(feature = "mpi")]
#[test]
// Guards fault handling: a rank killed mid-run ends the job with an error naming it (not a
// hang), and the folder resumes under another number of ranks to an uninterrupted run's
// records.
fn a_killed_rank_stops_the_job_by_name_and_it_resumes_on_other_ranks() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let whole = whole(tmp.path());
    let dir = tmp.path().join("killed");
    let mut args = vec!["run"];
    args.extend(LONG);
    args.push(dir.to_str().unwrap());
    let mut child = mpi(&mpirun, 2, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_steps(&dir, 3, &mut child);
    signal(rank_pid(child.id(), 1), "KILL");
    let (out, took) = wait_at_most(child, Duration::from_secs(90));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("rank 1"),
        "the error must name rank 1:\n{}",
        text(&out)
    );
    eprintln!("the job ended {took:?} after rank 1 was killed");
    ok(mpi(
        &mpirun,
        3,
        &["run", "--resume", dir.to_str().unwrap(), "--no-report"],
    ));
    assert_same_records(
        &whole,
        &dir,
        &SCRIPTED_RECORDS,
        "killed on 2 ranks, resumed on 3",
    );
}

#[cfg(feature = "mpi")]
#[test]
// Guards the exchange's timeout: a rank that hangs (stopped, so MPI cannot see it die) ends
// the job with its number once --rank-timeout has passed, instead of waiting forever.
fn a_hung_rank_stops_the_job_after_the_timeout() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hung");
    let mut args = vec!["run"];
    args.extend(&LONG[..6]);
    args.extend(["--rank-timeout", "3", "--out", dir.to_str().unwrap()]);
    let mut child = mpi(&mpirun, 2, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_steps(&dir, 2, &mut child);
    let pid = rank_pid(child.id(), 1);
    signal(pid, "STOP");
    let (out, _) = wait_at_most(child, Duration::from_secs(90));
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("rank 1 sent nothing for 3 s"),
        "the error must name the hung rank:\n{}",
        text(&out)
    );
}

#[cfg(feature = "mpi")]
#[test]
// Guards SLURM's time limit under MPI: SIGTERM to one rank pauses every rank after the same
// step with exit 0, and one process resumes the folder to an uninterrupted run's records.
fn sigterm_to_one_rank_pauses_the_job_resumably() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let whole = whole(tmp.path());
    let dir = tmp.path().join("stopped");
    let mut args = vec!["run"];
    args.extend(LONG);
    args.push(dir.to_str().unwrap());
    let mut child = mpi(&mpirun, 2, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_steps(&dir, 2, &mut child);
    signal(rank_pid(child.id(), 1), "TERM");
    let (out, _) = wait_at_most(child, Duration::from_secs(90));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("resume with: throng run --resume"),
        "{}",
        text(&out)
    );
    assert!(
        steps_done(&dir) < 25,
        "it should have stopped early:\n{}",
        text(&out)
    );
    let mut cmd = throng();
    cmd.args(["run", "--resume", dir.to_str().unwrap(), "--no-report"]);
    ok(cmd);
    assert_same_records(
        &whole,
        &dir,
        &SCRIPTED_RECORDS,
        "stopped on 2 ranks by SIGTERM, resumed by one process",
    );
}

#[cfg(feature = "mpi")]
#[test]
// Guards against issue 17, item 10, under MPI: when the step in progress cannot finish on any
// rank, SIGTERM still ends the job at the stated deadline, whichever ranks it reaches (all of
// them, as SLURM sends it, or one), with the folder paused at its last checkpoint and
// resumable.
fn a_step_that_cannot_finish_on_any_rank_is_stopped_at_the_deadline() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let whole = whole(tmp.path());
    for signalled in [vec![0, 1], vec![1]] {
        let dir = tmp.path().join(format!("stuck-{signalled:?}"));
        let mut args = vec!["run"];
        args.extend(LONG);
        args.push(dir.to_str().unwrap());
        args.extend(["--stop-timeout", "2"]);
        // Every rank says when it reaches the hang (two steps in steps.csv are not enough: a
        // signal that lands before step 3 begins pauses the run the ordinary way).
        let mut stuck = Watched::spawn(mpi(&mpirun, 2, &args).env("THRONG_CRASH_AT", "3:hang"));
        stuck.wait_for("this step never finishes", 2, Duration::from_secs(120));
        for &rank in &signalled {
            signal(rank_pid(stuck.child.id(), rank), "TERM");
        }
        let Ran {
            ok: succeeded,
            text,
            took,
            ..
        } = stuck.wait_at_most(Duration::from_secs(90));
        let shown = format!("signalled ranks {signalled:?}, ended after {took:?}:\n{text}");
        assert!(!succeeded, "{shown}");
        assert!(
            text.contains("stopped at once (the step did not finish within 2 s"),
            "{shown}"
        );
        let manifest: throng::record::Manifest =
            throng::record::read_json(&dir.join("manifest.json")).unwrap();
        assert_eq!(manifest.status, throng::record::Status::Paused, "{shown}");
        let mut cmd = throng();
        cmd.args(["run", "--resume", dir.to_str().unwrap(), "--no-report"]);
        ok(cmd);
        assert_same_records(&whole, &dir, &SCRIPTED_RECORDS, &shown);
    }
}

#[cfg(feature = "mpi")]
#[test]
// Guards rank invariance with the model: on the CPU the engine is batch invariant, so an LLM
// run on SmolLM2 over 2 ranks, in either split, decides exactly as one process, and keeps
// every rank's replies in its decision store.
fn an_llm_run_on_two_ranks_equals_one_process() {
    let Some(mpirun) = mpirun() else { return };
    let Some(model) = common::smollm2() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("guess.toml");
    std::fs::write(
        &config,
        format!(
            r#"name = "guess-ranks"
seed = 5
steps = 2
policy = "llm"
templates = {:?}
agents = 5

[llm]
max_tokens = 16

[scenario]
name = "guess"
prompt = "basic"

[sweep]
llm = {{ temperature = [0.0, 1.0] }}
"#,
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    let model = model.to_str().unwrap();
    let base = [
        "run",
        config.to_str().unwrap(),
        "--no-report",
        "--model",
        model,
    ];
    let alone = tmp.path().join("alone");
    let mut cmd = throng();
    cmd.args(base).arg("--out").arg(&alone);
    ok(cmd);
    let reference = decisions_without_timings(&alone);
    assert_eq!(reference.len(), 2 * 5 * 2, "2 arms x 5 agents x 2 rounds");
    for d in &reference {
        assert!(d["fallback"].is_null(), "every decision validates: {d}");
        let guess = d["decision"]["guess"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&guess), "{d}");
    }
    for split in ["agents", "cells"] {
        let dir = tmp.path().join(split);
        let mut all = base.to_vec();
        all.extend(["--split", split, "--out", dir.to_str().unwrap()]);
        ok(mpi(&mpirun, 2, &all));
        assert_eq!(
            decisions_without_timings(&dir),
            reference,
            "decisions on 2 ranks split by {split}"
        );
        for name in ["state.parquet", "aggregates.csv", "cells.jsonl"] {
            assert!(
                std::fs::read(alone.join(name)).unwrap() == std::fs::read(dir.join(name)).unwrap(),
                "{name} differs on 2 ranks split by {split}"
            );
        }
        // The store holds every rank's replies: one process reusing it asks the model nothing.
        let again = tmp.path().join(format!("{split}-again"));
        let mut cmd = throng();
        cmd.args(base)
            .arg("--reuse")
            .arg(&dir)
            .arg("--out")
            .arg(&again);
        ok(cmd);
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(again.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(
            manifest["reuse"]["reused"], 20,
            "every decision of the run on 2 ranks split by {split} is reused"
        );
        assert_eq!(decisions_without_timings(&again), reference);
    }
}
