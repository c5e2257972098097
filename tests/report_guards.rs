//! What `throng report` refuses, through the built binary: record files damaged since the run
//! wrote them (every file it reads is checked against the checksums the manifest keeps), and
//! a folder a run is still writing (no report is written into it).

mod common;

use common::cli::{Ran, output, throng};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Two population sizes of two replicates, 3 steps each; scripted.
const ENERGY: &str = "tests/fixtures/energy-resume.toml";
const GUESS: &str = "tests/fixtures/guess-resume.toml";

fn run(config: &str, out: &Path, extra: &[&str]) {
    let Ran { ok, text, .. } = output(
        throng()
            .args(["run", config, "--no-report", "--out"])
            .arg(out)
            .args(extra),
    );
    assert!(ok, "{text}");
}

fn report(dir: &Path) -> Ran {
    output(throng().arg("report").arg(dir))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Flips every bit of up to 64 bytes of `path` from `offset` on.
fn flip(path: &Path, offset: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let end = (offset + 64).min(bytes.len());
    for b in &mut bytes[offset..end] {
        *b ^= 0xff;
    }
    std::fs::write(path, bytes).unwrap();
}

/// Damages `name` in a copy of the run `whole` with `damage`, and checks that the report refuses
/// it by name, says it is damaged and what to do, and writes nothing.
fn assert_refused(whole: &Path, scratch: &Path, name: &str, how: &str, damage: impl Fn(&Path)) {
    if scratch.exists() {
        std::fs::remove_dir_all(scratch).unwrap();
    }
    copy_dir(whole, scratch);
    damage(&scratch.join(name));
    let Ran { ok, text, .. } = report(scratch);
    let what = format!("{name} {how}");
    assert!(!ok, "{what}: the report read a damaged file:\n{text}");
    assert!(text.contains(name), "{what}: the file is named: {text}");
    assert!(text.contains("damaged"), "{what}: {text}");
    assert!(
        text.contains("throng run") && text.contains("copy"),
        "{what}: says what to do: {text}"
    );
    assert!(
        !scratch.join("report.html").exists() && !scratch.join("summary.json").exists(),
        "{what}: no report drawn from it"
    );
}

// Guards against issue 17, item 3: XOR-ing 64 bytes in the middle of a finished run's
// `state.parquet` went unnoticed, and the report plotted the damaged values.
#[test]
fn the_report_refuses_every_record_file_it_reads_once_damaged_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    // The files each scenario's report reads.
    for (config, files) in [
        (
            ENERGY,
            &[
                "state.parquet",
                "trades.parquet",
                "steps.csv",
                "cells.jsonl",
            ][..],
        ),
        (GUESS, &["state.parquet", "aggregates.csv", "steps.csv"]),
    ] {
        let whole = tmp.path().join("whole");
        if whole.exists() {
            std::fs::remove_dir_all(&whole).unwrap();
        }
        run(config, &whole, &[]);
        let scratch = tmp.path().join("scratch");
        for name in files {
            let len = std::fs::metadata(whole.join(name)).unwrap().len() as usize;
            assert!(len > 64, "{config}: {name} is too short to damage");
            // The header, the data pages, the footer that describes them, and the very end.
            for offset in [0, len / 4, len / 2, 3 * len / 4, len - 64] {
                assert_refused(&whole, &scratch, name, &format!("at {offset}"), |p| {
                    flip(p, offset)
                });
            }
            assert_refused(&whole, &scratch, name, "truncated", |p| {
                let bytes = std::fs::read(p).unwrap();
                std::fs::write(p, &bytes[..bytes.len() - 1]).unwrap();
            });
            assert_refused(&whole, &scratch, name, "appended to", |p| {
                let mut bytes = std::fs::read(p).unwrap();
                bytes.push(b'\n');
                std::fs::write(p, &bytes).unwrap();
            });
        }
        // The undamaged run reports.
        let Ran { ok, text, .. } = report(&whole);
        assert!(ok, "{config}: {text}");
    }
}

/// Removes `name` in a copy of the run `whole` and checks that the report says it is missing,
/// by name, rather than reporting without it.
fn assert_missing(whole: &Path, scratch: &Path, name: &str) {
    if scratch.exists() {
        std::fs::remove_dir_all(scratch).unwrap();
    }
    copy_dir(whole, scratch);
    std::fs::remove_file(scratch.join(name)).unwrap();
    let Ran { ok, text, .. } = report(scratch);
    assert!(
        !ok,
        "{name} deleted: the report went on without it:\n{text}"
    );
    assert!(
        text.contains(name) && text.contains("missing") && text.contains("throng run"),
        "{name} deleted: {text}"
    );
    assert!(!scratch.join("report.html").exists(), "{name} deleted");
}

// A record file deleted since the run wrote it: a lost `trades.parquet` read as a run without
// trades, and a lost part left its step out of the report without a word.
#[test]
fn the_report_refuses_a_run_whose_record_files_are_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let scratch = tmp.path().join("scratch");
    let whole = tmp.path().join("energy");
    run(ENERGY, &whole, &[]);
    for name in [
        "state.parquet",
        "trades.parquet",
        "steps.csv",
        "cells.jsonl",
    ] {
        assert_missing(&whole, &scratch, name);
    }
    let paused = tmp.path().join("paused");
    run(ENERGY, &paused, &["--stop-after", "2"]);
    for name in [
        "state.parts/g000-s000001.parquet",
        "trades.parts/g000-s000002.parquet",
    ] {
        assert_missing(&paused, &scratch, name);
    }
}

// The same for a paused run, whose tables are still in parts, and for a run resumed after the
// pause (the checksums are taken again when it finishes, over the files it then has).
#[test]
fn a_paused_runs_parts_are_checked_and_a_resumed_run_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let paused = tmp.path().join("paused");
    run(GUESS, &paused, &["--stop-after", "2"]);
    let scratch = tmp.path().join("scratch");
    for name in [
        "state.parts/g000-s000001.parquet",
        "state.parts/g000-s000002.parquet",
        "aggregates.csv",
        "steps.csv",
    ] {
        let len = std::fs::metadata(paused.join(name)).unwrap().len() as usize;
        assert_refused(&paused, &scratch, name, "in a paused run", |p| {
            flip(p, len / 2)
        });
    }
    let Ran { ok, text, .. } = output(
        throng()
            .args(["run", "--no-report", "--resume"])
            .arg(&paused),
    );
    assert!(ok, "{text}");
    let Ran { ok, text, .. } = report(&paused);
    assert!(ok, "{text}");
    assert!(!text.contains("unfinished"), "{text}");
}

/// Large enough that the run lasts a second or so.
const LONG: &str = "tests/fixtures/guess-kill.toml";

// Guards against issue 17, item 11: `throng report` on a run still writing its folder wrote
// its report into that folder, and the stale report stayed after the run finished.
#[test]
fn the_report_of_a_run_still_writing_its_folder_is_refused_and_written_by_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut running = throng()
        .args(["run", LONG, "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = running.id() as i32;
    let started = Instant::now();
    while !out.join("manifest.json").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no manifest");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Held still mid-run, as a long step would hold it.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let refused = report(&out);
    let files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let Ran { ok, text, .. } = refused;
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("throng (pid {pid}) is still writing")),
        "names the writer: {text}"
    );
    assert!(
        text.contains("writes its report when it ends"),
        "says when the report comes: {text}"
    );
    assert!(
        !files
            .iter()
            .any(|f| f == "report.html" || f == "summary.json" || f.starts_with("fig")),
        "nothing of a report was written into the folder: {files:?}"
    );
    // The run ends, writing its own report, of the finished run.
    assert!(running.wait().unwrap().success());
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        !html.contains("unfinished"),
        "the run's own report is whole"
    );
    // Once the run has let go of the folder, a report is written as always.
    let Ran { ok, text, .. } = report(&out);
    assert!(ok, "{text}");
}
