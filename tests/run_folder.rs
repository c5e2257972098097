//! Run folders as users meet them, through the built `throng` binary: a folder is a new run,
//! an empty folder, or a run to resume, never anything else; one process writes it at a
//! time; a run killed anywhere resumes to exactly the records of a run never interrupted;
//! and the report reads what the book's Run folder chapter (docs/src/run-folder.md) says it
//! reads.

mod common;

use common::cli::{self, Ran, SCRIPTED_RECORDS, output, throng};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Two population sizes of two replicates, 3 steps each: 6 steps, with a new population
/// starting at step 4.
const ENERGY: &str = "tests/fixtures/energy-resume.toml";
/// The guessing game, three rounds of memory.
const GUESS: &str = "tests/fixtures/guess-resume.toml";
const STEPS: usize = 6;

fn run(config: &str, out: &Path, extra: &[&str]) -> Ran {
    output(
        throng()
            .args(["run", config, "--no-report", "--out"])
            .arg(out)
            .args(extra),
    )
}

fn resume(out: &Path) -> Ran {
    output(throng().args(["run", "--no-report", "--resume"]).arg(out))
}

/// The records a researcher publishes from are the uninterrupted run's, byte for byte (the runs
/// are scripted); `steps.csv` holds timings, so only its length and step columns are compared;
/// and the run `pieces` finished.
fn assert_same_records(whole: &Path, pieces: &Path, what: &str) {
    cli::assert_same_records(whole, pieces, &SCRIPTED_RECORDS, what);
    let steps = |dir: &Path| -> Vec<String> {
        std::fs::read_to_string(dir.join("steps.csv"))
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
            .collect()
    };
    assert_eq!(steps(whole), steps(pieces), "{what}: steps.csv differs");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pieces.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["status"], "finished", "{what}");
    assert_eq!(manifest["steps_done"], STEPS, "{what}");
}

fn uninterrupted(config: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = run(config, &whole, &[]);
    assert!(ok, "{text}");
    (tmp, whole)
}

// A run once appended to a folder of the user's own files (a `state.csv` got rows added), and
// a rerun into a folder killed in step 1 wrote its step 0 twice.
#[test]
fn a_folder_that_is_not_a_new_or_empty_one_is_refused_and_left_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("state.csv"), "my own data\n").unwrap();
    let Ran { ok, text, .. } = run(ENERGY, &mine, &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("not a throng run"), "{text}");
    assert!(text.contains("new or empty folder"), "{text}");
    assert_eq!(
        std::fs::read_dir(&mine).unwrap().count(),
        1,
        "a refused folder gets no files"
    );
    assert_eq!(
        std::fs::read_to_string(mine.join("state.csv")).unwrap(),
        "my own data\n"
    );
    // Resuming it is refused too: it is not a run.
    let Ran { ok, text, .. } = resume(&mine);
    assert!(!ok && text.contains("not a throng run folder"), "{text}");

    // An empty folder is fine; a finished run is not a place for a new one.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let Ran { ok, text, .. } = run(ENERGY, &empty, &[]);
    assert!(ok, "{text}");
    let Ran { ok, text, .. } = run(ENERGY, &empty, &[]);
    assert!(!ok && text.contains("--resume"), "{text}");
    let Ran { ok, text, .. } = resume(&empty);
    assert!(!ok && text.contains("has finished"), "{text}");
}

// A missing folder was reported as `config.toml:0:0: cannot read the config`.
#[test]
fn resuming_a_missing_folder_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let Ran { ok, text, .. } = resume(&tmp.path().join("nowhere"));
    assert!(!ok, "{text}");
    assert!(text.contains("no such folder"), "{text}");
    assert!(!text.contains("config.toml"), "{text}");
}

// Two runs into one folder both wrote it: a manifest saying `finished`, a third more state
// lines than a run has, and decisions that were not JSON.
#[test]
fn a_second_run_into_a_folder_being_written_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut first = throng()
        .args(["run", ENERGY, "--no-report", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = first.id() as i32;
    // Hold the first run still, mid-write, while the others try.
    let started = Instant::now();
    while !out.join("manifest.json").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no manifest");
        std::thread::sleep(Duration::from_millis(2));
    }
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let second = run(ENERGY, &out, &[]);
    let third = resume(&out);
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(first.wait().unwrap().success());
    for Ran { ok, text, .. } in [second, third] {
        assert!(!ok, "{text}");
        assert!(
            text.contains(&format!("another throng (pid {pid}) is writing")),
            "{text}"
        );
    }
    // The first run's records are whole, as if it had been alone.
    let (_keep, whole) = uninterrupted(ENERGY);
    assert_same_records(&whole, &out, "the run that held the folder");
}

/// Runs `config` with a crash at each of `kills` in turn (each resume crashing at the next),
/// then resumes to the end.
fn crash_and_resume(config: &str, kills: &[(usize, &str)], whole: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let pieces = tmp.path().join("pieces");
    for (i, (step, point)) in kills.iter().enumerate() {
        let spec = format!("{step}:{point}");
        let mut cmd = if i == 0 {
            let mut c = throng();
            c.args(["run", config, "--no-report", "--out"]).arg(&pieces);
            c
        } else {
            let mut c = throng();
            c.args(["run", "--no-report", "--resume"]).arg(&pieces);
            c
        };
        let Ran { ok, text, .. } = output(cmd.env("THRONG_CRASH_AT", &spec));
        // A crash point at a step already done before this try is never reached: the try
        // finishes the run, and there is nothing left to kill.
        if ok {
            assert!(!text.contains("aborting here"), "{text}");
            break;
        }
        assert!(text.contains("aborting here"), "{spec}: {text}");
    }
    let Ran { ok, text, .. } = resume(&pieces);
    assert!(
        ok || text.contains("has finished"),
        "resuming after {kills:?}: {text}"
    );
    assert_same_records(whole, &pieces, &format!("killed at {kills:?}"));
}

fn kill_point() -> impl Strategy<Value = (usize, &'static str)> {
    (
        1..=STEPS,
        prop::sample::select(throng::sim::runner::fault::POINTS),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    // A resumed run once differed from the uninterrupted one from its first resumed step (floats
    // that did not round-trip through the checkpoint); the test that claimed otherwise passed by
    // luck on its one case. Kill points anywhere: inside step 1, between the records and the
    // checkpoint, at the start of a new population, and kills during a resume.
    #[test]
    fn killed_anywhere_and_resumed_the_records_equal_an_uninterrupted_run(
        kills in prop::collection::vec(kill_point(), 1..=3),
        guess in any::<bool>(),
    ) {
        let config = if guess { GUESS } else { ENERGY };
        let (_keep, whole) = uninterrupted(config);
        let mut kills = kills;
        // In the order a run meets them: by step, then by the point's place in a step.
        kills.sort_by_key(|&(step, point)| {
            (step, throng::sim::runner::fault::POINTS.iter().position(|p| *p == point))
        });
        crash_and_resume(config, &kills, &whole);
    }
}

/// Large enough that a run lasts a second or two: room to be killed at random moments.
const KILLED: &str = "tests/fixtures/guess-kill.toml";

/// Each step of the killed runs waits this long first (`THRONG_STEP_DELAY_MS`): the runs then
/// last about the same time whatever else the machine does, so a kill drawn within the
/// uninterrupted run's time lands inside the run (on CI a run once ended before its kill).
const STEP_DELAY_MS: &str = "150";

// The same, with what users do: `kill -9` of the running binary at whatever moment it is in,
// again and again, each resume killed in turn.
#[test]
fn a_real_sigkill_at_random_moments_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let started = Instant::now();
    let Ran { ok, text, .. } = output(
        throng()
            .env("THRONG_STEP_DELAY_MS", STEP_DELAY_MS)
            .args(["run", KILLED, "--no-report", "--out"])
            .arg(&whole),
    );
    assert!(ok, "{text}");
    // Kills fall in the first four fifths of a run's time, so that the first lands.
    let window = started.elapsed().as_micros() as u64 * 4 / 5;
    let pieces = tmp.path().join("pieces");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut kills = Vec::new();
    for attempt in 0..6 {
        let mut cmd = throng();
        cmd.env("THRONG_STEP_DELAY_MS", STEP_DELAY_MS);
        // A kill before the run wrote its config (the last of the files its start writes)
        // leaves a run that never ran, which --out takes as empty: start it again.
        if attempt == 0 || never_ran(&pieces) {
            cmd.args(["run", KILLED, "--no-report", "--out"])
                .arg(&pieces);
        } else {
            cmd.args(["run", "--no-report", "--resume"]).arg(&pieces);
        }
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let at = next() % window;
        std::thread::sleep(Duration::from_micros(at));
        if child.try_wait().unwrap().is_some() {
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills.push(Duration::from_micros(at));
    }
    assert!(
        !kills.is_empty(),
        "no run was killed: the window is too short"
    );
    let Ran { ok, text, .. } = match never_ran(&pieces) {
        true => run(KILLED, &pieces, &[]),
        false => resume(&pieces),
    };
    assert!(ok || text.contains("has finished"), "{text}");
    assert_same_records(&whole, &pieces, &format!("killed after {kills:?}"));
}

/// Whether a run's start was killed before it wrote its `config.toml`, the last file a start
/// writes: such a folder holds no run to resume.
fn never_ran(dir: &Path) -> bool {
    !dir.join("manifest.json").exists() || !dir.join("config.toml").exists()
}

// A corrupt `state.parquet` went unnoticed, because the report read the CSV.
#[test]
fn the_report_refuses_a_corrupt_parquet_table() {
    let (_keep, whole) = uninterrupted(ENERGY);
    let path = whole.join("state.parquet");
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes.truncate(middle);
    std::fs::write(&path, &bytes).unwrap();
    let Ran { ok, text, .. } = output(throng().arg("report").arg(&whole));
    assert!(!ok, "{text}");
    assert!(text.contains("state.parquet"), "{text}");
    assert!(text.contains("truncated or corrupt"), "{text}");
}

// An unfinished run's report looked like a finished one's.
#[test]
fn the_report_of_an_unfinished_run_says_how_far_it_got() {
    for config in [ENERGY, GUESS] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        let Ran { ok, text, .. } = run(config, &out, &["--stop-after", "2"]);
        assert!(ok, "{text}");
        assert!(text.contains("throng run --resume"), "{text}");
        let Ran { ok, text, .. } = output(throng().arg("report").arg(&out));
        assert!(ok, "{text}");
        assert!(text.contains("2 of 6 steps"), "{config}: {text}");
        let html = std::fs::read_to_string(out.join("report.html")).unwrap();
        let body = &html[html.find("<body").unwrap()..];
        let note = body
            .find("2 of 6 steps")
            .expect("the note is in report.html");
        let first_heading = body.find("<h1").unwrap_or(body.len());
        assert!(note < first_heading, "{config}: the note comes first");
    }
}

// A run killed in its first step once could only be started again into a new folder.
#[test]
fn a_run_killed_before_its_first_checkpoint_resumes_from_the_start() {
    let (_keep, whole) = uninterrupted(ENERGY);
    let tmp = tempfile::tempdir().unwrap();
    let pieces = tmp.path().join("pieces");
    let Ran { ok, text, .. } = output(
        throng()
            .args(["run", ENERGY, "--no-report", "--out"])
            .arg(&pieces)
            .env("THRONG_CRASH_AT", "1:records"),
    );
    assert!(!ok, "{text}");
    let Ran { ok, text, .. } = resume(&pieces);
    assert!(ok, "{text}");
    assert!(text.contains("starts again from step 0"), "{text}");
    assert_same_records(&whole, &pieces, "killed in step 1");
}

// `--resume` once ignored `--steps`, `--replicates` and `--policy` silently. `--steps` and
// `--replicates` now extend a finished run (tests/reuse.rs), and a paused one is refused.
#[test]
fn resume_refuses_settings_it_would_ignore() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(ENERGY, &out, &["--stop-after", "1"]);
    assert!(ok, "{text}");
    for (flag, says) in [
        (&["--steps", "9"][..], "extend a finished run"),
        (&["--replicates", "3"], "extend a finished run"),
        (&["--policy", "scripted"], "as it was configured"),
    ] {
        let Ran { ok, text, .. } = output(
            throng()
                .args(["run", "--no-report", "--resume"])
                .arg(&out)
                .args(flag),
        );
        assert!(!ok, "{flag:?}: {text}");
        assert!(text.contains(says), "{flag:?}: {text}");
    }
    let Ran { ok, text, .. } = resume(&out);
    assert!(ok, "{text}");
    assert!(text.contains("at step 1 of 6"), "{text}");
}

// `--steps 0` and `--replicates 0` became 1, `--agents 1` ran a one-company market, and
// `--agents 0` wrote a folder marked finished.
#[test]
fn command_line_overrides_are_checked_like_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    for (flag, value, says) in [
        ("--steps", "0", "steps"),
        ("--replicates", "0", "replicates"),
        ("--agents", "1", "agents"),
        ("--agents", "0", "agents"),
        ("--steps", "-3", "steps"),
    ] {
        let out = tmp.path().join(format!("run{flag}{value}"));
        let Ran { ok, text, .. } = run(ENERGY, &out, &[flag, value]);
        assert!(!ok, "{flag} {value}: {text}");
        assert!(text.contains(says), "{flag} {value}: {text}");
        assert!(!out.join("manifest.json").exists(), "{flag} {value}");
    }
}

// A half-written checkpoint was found only after the model had loaded; a damaged newest
// checkpoint must never be loaded, the previous one is used and the resume says so.
#[test]
fn a_damaged_checkpoint_falls_back_to_the_previous_one_with_a_warning() {
    let (_keep, whole) = uninterrupted(ENERGY);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(ENERGY, &out, &["--stop-after", "3"]);
    assert!(ok, "{text}");
    let cp = out.join("checkpoint.bin");
    let len = std::fs::metadata(&cp).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cp)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let Ran { ok, text, .. } = resume(&out);
    assert!(ok, "{text}");
    assert!(text.contains("warning"), "{text}");
    assert!(text.contains("truncated"), "{text}");
    assert!(text.contains("previous checkpoint"), "{text}");
    assert!(
        text.contains("at step 2 of 6"),
        "resumed from the step before: {text}"
    );
    assert_same_records(&whole, &out, "resumed from the previous checkpoint");
}
