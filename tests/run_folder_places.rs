//! Where a run may be written, through the built binary: a config's `name` is one folder
//! name, `--out` is a folder outside every other run's, a start that fails (a full disk) or
//! never ran leaves nothing in the way, and a run that lost its config keeps its records and
//! says how to get the config back.

mod common;

use common::cli::{Ran, output, repo, throng};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guessing game, scripted: 6 steps over two population sizes, in well under a second.
const GUESS: &str = "tests/fixtures/guess-resume.toml";

fn run(out: &Path, extra: &[&str]) -> Ran {
    output(
        throng()
            .args(["run", GUESS, "--no-report", "--out"])
            .arg(out)
            .args(extra),
    )
}

fn resume(out: &Path) -> Ran {
    output(throng().args(["run", "--no-report", "--resume"]).arg(out))
}

/// Every path under `dir`, relative to it, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The fixture's config with `name` set to `name` (a TOML value), its templates found from
/// anywhere; `name` is on line 2.
fn config_named(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    std::fs::write(
        &path,
        format!(
            "# a config whose name is on line 2\nname = {name}\nseed = 9\nsteps = 1\npolicy = \"scripted\"\n\
             templates = {:?}\nagents = 20\n\n[scenario]\nname = \"guess\"\n",
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    path
}

// Guards against issue 17, item 12: a config `name` of "../../escape-name" made the run's
// folder two levels above `runs/`, and `name = ""` made `runs/-<time>`.
#[test]
fn a_name_that_is_not_one_folder_name_is_refused_at_validation() {
    let tmp = tempfile::tempdir().unwrap();
    // Runs go to `runs/` of the working folder, two levels below the temporary folder, so
    // that an escape would land inside it.
    let work = tmp.path().join("a").join("b");
    std::fs::create_dir_all(&work).unwrap();
    let long = format!("\"{}\"", "x".repeat(300));
    for (name, says) in [
        (r#""../../escape-name""#, "separator `/`"),
        (r#""""#, "is empty"),
        (r#""   ""#, "is empty"),
        (r#""a/b""#, "separator `/`"),
        (r#""/etc""#, "separator `/`"),
        (r#""..""#, "the folder above"),
        (r#"".""#, "the current folder"),
        (r#"'back\slash'"#, "separator `\\`"),
        (r#""tab\there""#, "control character"),
        (r#""new\nline""#, "control character"),
        (r#""bell\u0007""#, "control character"),
        (long.as_str(), "more than the 200"),
    ] {
        let config = config_named(tmp.path(), name);
        for command in ["run", "plan"] {
            let Ran { ok, text, .. } =
                output(throng().current_dir(&work).arg(command).arg(&config));
            assert!(!ok, "{command} name = {name}: accepted:\n{text}");
            assert!(
                text.contains("exp.toml:2:") && text.contains("field `name`"),
                "{command} name = {name}: file, line and field: {text}"
            );
            assert!(
                text.contains(says) && text.contains("cannot name a run folder"),
                "{command} name = {name}: {text}"
            );
        }
        assert_eq!(
            tree(tmp.path()),
            ["a", "a/b", "exp.toml"],
            "name = {name}: nothing was written anywhere"
        );
    }
    // Names that are one folder name run, into `runs/<name>-<time>`.
    for name in ["exp1-unregulated", "a.b", "résumé 2", "..x"] {
        let config = config_named(tmp.path(), &format!("{name:?}"));
        let Ran { ok, text, .. } = output(
            throng()
                .current_dir(&work)
                .arg("run")
                .arg(&config)
                .arg("--no-report"),
        );
        assert!(ok, "name = {name:?}: {text}");
        let made: Vec<String> = std::fs::read_dir(work.join("runs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            made.iter().any(|m| m.starts_with(&format!("{name}-"))),
            "{name}: {made:?}"
        );
    }
}

// Guards against issue 17, item 13: a full disk at the very first write (a 1 KiB file
// system) left `.throng.lock` and an empty `manifest.json.tmp`, and the folder could then be
// neither resumed nor reused. `THRONG_FULL_DISK_AT` fails that write as a full disk does.
#[test]
fn a_full_disk_at_the_first_writes_leaves_the_folder_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    for point in ["manifest", "config"] {
        // A folder the run makes, and one that was there (empty) before.
        for existed in [false, true] {
            let out = tmp.path().join(format!("{point}-{existed}"));
            if existed {
                std::fs::create_dir(&out).unwrap();
            }
            let Ran { ok, text, .. } = output(run_cmd(&out).env("THRONG_FULL_DISK_AT", point));
            assert!(!ok, "{point}: {text}");
            assert!(
                text.contains(&format!("cannot start the run in {}", out.display()))
                    && text.contains(&format!("its {point} could not be written"))
                    && text.contains("left as it was"),
                "{point}: {text}"
            );
            assert_eq!(
                text.matches("No space left on device").count(),
                1,
                "{point}: the cause is named once: {text}"
            );
            match existed {
                true => assert!(tree(&out).is_empty(), "{point}: {:?}", tree(&out)),
                false => assert!(!out.exists(), "{point}: the folder it made is gone"),
            }
            // Nothing to resume, said plainly; the same --out works once there is room.
            let Ran { ok, text, .. } = resume(&out);
            assert!(!ok, "{text}");
            assert!(
                text.contains("no such folder") || text.contains("not a throng run folder"),
                "{point}: {text}"
            );
            let Ran { ok, text, .. } = output(&mut run_cmd(&out));
            assert!(ok, "{point}: the same --out again: {text}");
        }
    }
}

// The same on a real 4 KiB file system (tmpfs, in a mount namespace of its own so that
// nothing outlives the test), where it can be made: full at the manifest, at the config, and
// at the config as written. Skipped where mounts are not allowed (a container without the
// capability); the test above covers the same ground everywhere.
#[test]
fn a_real_full_file_system_at_the_first_writes_leaves_the_folder_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let mount = tmp.path().join("fs");
    std::fs::create_dir(&mount).unwrap();
    // The lock takes the first page; each size leaves no page for the next file.
    for (size, what) in [("4k", "manifest"), ("8k", "config"), ("12k", "config")] {
        let script = r#"
            mount -t tmpfs -o size="$1" tmpfs "$2" 2>/dev/null || exit 77
            mkdir "$2/run"
            "$3" run "$4" --no-report --out "$2/run"; echo "first: $?"
            echo "left: $(ls -A "$2/run" | tr '\n' ' ')"
            "$3" run --no-report --resume "$2/run"; echo "resume: $?"
            mount -o remount,size=64m "$2"
            "$3" run "$4" --no-report --out "$2/run"; echo "again: $?"
        "#;
        let mut cmd = Command::new("unshare");
        // As root, a mount namespace; otherwise a user namespace that maps us to root in it.
        let root = unsafe { libc::geteuid() } == 0;
        cmd.args(if root {
            &["--mount"][..]
        } else {
            &["--mount", "--map-root-user"]
        });
        cmd.args(["sh", "-c", script, "sh", size])
            .arg(&mount)
            .arg(env!("CARGO_BIN_EXE_throng"))
            .arg(repo().join(GUESS))
            .current_dir(repo());
        let out = match cmd.output() {
            Ok(out) if out.status.code() != Some(77) && out.status.success() => out,
            Ok(out) => {
                common::loud_skip(&format!(
                    "cannot mount a tmpfs here (unshare: {}): the full-disk test with                      THRONG_FULL_DISK_AT still runs",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                return;
            }
            Err(e) => {
                common::loud_skip(&format!("no `unshare` here ({e})"));
                return;
            }
        };
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains("panicked"), "{text}");
        assert!(text.contains("first: 1"), "{size}: {text}");
        assert!(
            text.contains(&format!("its {what} could not be written"))
                && text.contains("No space left on device")
                && text.contains("left as it was"),
            "{size}: {text}"
        );
        assert!(
            text.contains("left: \n"),
            "{size}: the folder is empty again: {text}"
        );
        assert!(
            text.contains("resume: 1") && text.contains("not a throng run folder"),
            "{size}: {text}"
        );
        assert!(
            text.contains("again: 0"),
            "{size}: the same --out works: {text}"
        );
    }
}

/// `run(out)` as a command, for an environment to be set on it.
fn run_cmd(out: &Path) -> Command {
    let mut cmd = throng();
    cmd.args(["run", GUESS, "--no-report", "--out"]).arg(out);
    cmd
}

// The leftovers the issue found (a lock and an empty `manifest.json.tmp`), and those of a
// start killed between its manifest and its config: `--resume` says the run never ran and
// how to start it, and `--out` takes the folder as empty.
#[test]
fn leftovers_of_a_start_that_never_ran_are_taken_as_empty_and_not_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let finished = tmp.path().join("finished");
    let Ran { ok, text, .. } = output(&mut run_cmd(&finished));
    assert!(ok, "{text}");
    let mut fresh = manifest(&finished);
    fresh["status"] = "running".into();
    fresh["steps_done"] = 0.into();
    fresh.as_object_mut().unwrap().remove("checksums");
    let cases: [(&str, &[(&str, String)]); 3] = [
        (
            "lock and empty manifest.json.tmp",
            &[
                (".throng.lock", "123".into()),
                ("manifest.json.tmp", String::new()),
            ],
        ),
        (
            "empty manifest.json.tmp",
            &[("manifest.json.tmp", String::new())],
        ),
        (
            "manifest, no config",
            &[
                (".throng.lock", "123".into()),
                ("manifest.json", fresh.to_string()),
            ],
        ),
    ];
    for (what, files) in cases {
        let out = tmp.path().join(what.replace(' ', "-"));
        std::fs::create_dir(&out).unwrap();
        for (name, text) in files {
            std::fs::write(out.join(name), text).unwrap();
        }
        let Ran { ok, text, .. } = resume(&out);
        assert!(!ok, "{what}: {text}");
        assert!(
            text.contains("never ran")
                && text.contains(&format!("throng run CONFIG --out {}", out.display())),
            "{what}: {text}"
        );
        assert!(!text.contains("delete"), "{what}: {text}");
        let Ran { ok, text, .. } = output(&mut run_cmd(&out));
        assert!(ok, "{what}: the folder is taken as empty: {text}");
        assert_eq!(manifest(&out)["status"], "finished", "{what}");
        assert!(!out.join("manifest.json.tmp").exists(), "{what}");
    }
    // A start with anything else in its folder is not taken for one that never ran.
    let out = tmp.path().join("more");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("manifest.json.tmp"), "").unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let Ran { ok, text, .. } = output(&mut run_cmd(&out));
    assert!(!ok && text.contains("not a throng run"), "{text}");
    assert_eq!(tree(&out), ["manifest.json.tmp", "notes.txt"]);
}

// Guards against issue 17, item 14: a paused run whose `config.toml` was deleted was told to
// start again "(or delete the folder)", which would discard its finished steps.
#[test]
fn a_paused_run_that_lost_its_config_keeps_its_steps_and_says_how_to_get_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = output(&mut run_cmd(&whole));
    assert!(ok, "{text}");
    let out = tmp.path().join("paused");
    let Ran { ok, text, .. } = run(&out, &["--stop-after", "3"]);
    assert!(ok, "{text}");
    let config = out.join("config.toml");
    let kept = std::fs::read(&config).unwrap();
    std::fs::remove_file(&config).unwrap();
    let records = tree(&out);
    let Ran { ok, text, .. } = resume(&out);
    assert!(!ok, "{text}");
    for says in [
        "config.toml is missing",
        "3 finished steps (of 6)",
        "do not delete the folder",
        &format!("{}", config.display()),
        "inputs/config.toml is the config as the run started",
        "steps = 3, replicates = 2, agents = [200, 300], policy = scripted",
    ] {
        assert!(text.contains(says), "says {says:?}: {text}");
    }
    assert!(!text.contains("or delete the folder"), "{text}");
    assert!(!text.contains("never ran"), "{text}");
    assert_eq!(tree(&out), records, "the refused resume touched nothing");
    // Without the copy as started, it names the config as written.
    let started = out.join("inputs/config.toml");
    std::fs::rename(&started, tmp.path().join("started")).unwrap();
    let Ran { ok, text, .. } = resume(&out);
    assert!(!ok, "{text}");
    assert!(
        text.contains("config.original.toml is the config as written"),
        "{text}"
    );
    // Without the original either, it names the experiment file the run started from.
    std::fs::rename(
        out.join("config.original.toml"),
        tmp.path().join("original"),
    )
    .unwrap();
    let Ran { ok, text, .. } = resume(&out);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("the run was started from {GUESS}")),
        "{text}"
    );
    // With the config back, the run goes on to the records of a run never interrupted.
    std::fs::rename(
        tmp.path().join("original"),
        out.join("config.original.toml"),
    )
    .unwrap();
    std::fs::rename(tmp.path().join("started"), &started).unwrap();
    std::fs::write(&config, kept).unwrap();
    let Ran { ok, text, .. } = resume(&out);
    assert!(ok, "{text}");
    for name in [
        "state.parquet",
        "state.csv",
        "aggregates.csv",
        "cells.jsonl",
        "decisions.jsonl",
    ] {
        assert!(
            std::fs::read(whole.join(name)).unwrap() == std::fs::read(out.join(name)).unwrap(),
            "{name} differs from the uninterrupted run's"
        );
    }
}

// Guards against issue 17, item 15: `--resume R --out elsewhere` ignored `--out` silently.
#[test]
fn resume_refuses_an_out_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let Ran { ok, text, .. } = run(&out, &["--stop-after", "1"]);
    assert!(ok, "{text}");
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    for target in [&elsewhere, &out] {
        let Ran { ok, text, .. } = output(
            throng()
                .args(["run", "--no-report", "--resume"])
                .arg(&out)
                .arg("--out")
                .arg(target),
        );
        assert!(!ok, "{text}");
        assert!(
            text.contains("--resume continues the run in its own folder")
                && text.contains(&format!("drop --out {}", target.display())),
            "{text}"
        );
    }
    assert!(!elsewhere.exists(), "nothing was written elsewhere");
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
}

// Guards against issue 17, item 15: `--out` inside another run's folder was accepted, mixing
// a second run into the first one's files.
#[test]
fn an_out_folder_inside_another_run_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    let Ran { ok, text, .. } = run(&other, &["--stop-after", "2"]);
    assert!(ok, "{text}");
    let before = tree(&other);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&other, &link).unwrap();
    for out in [
        other.join("sub"),
        other.join("a/b/c"),
        other.join("state.parts/new"),
        other.join("x/../sub"),
        link.join("sub"),
        tmp.path().join("elsewhere/../other/sub"),
    ] {
        let Ran { ok, text, .. } = run(&out, &[]);
        assert!(!ok, "{}: {text}", out.display());
        assert!(
            text.contains(&format!("is inside the run folder {}", other.display()))
                && text.contains("outside it"),
            "{}: {text}",
            out.display()
        );
    }
    assert_eq!(tree(&other), before, "the run's folder is untouched");
    // Beside a run, or out of it through `..`, is fine.
    for out in [tmp.path().join("beside"), other.join("../out-again")] {
        let Ran { ok, text, .. } = run(&out, &[]);
        assert!(ok, "{}: {text}", out.display());
    }
}

// Guards against issue 17, item 15: `--out` naming a regular file or a dangling symbolic link
// printed "File exists (os error 17)", with the cause twice.
#[test]
fn an_out_that_cannot_be_a_folder_is_named_once() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "mine").unwrap();
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
    let link_to_file = tmp.path().join("link-to-file");
    std::os::unix::fs::symlink(&file, &link_to_file).unwrap();
    for (out, says) in [
        (
            file.clone(),
            format!("{} is a file, not a folder", file.display()),
        ),
        (
            file.join("sub"),
            format!("{} is a file, not a folder", file.display()),
        ),
        (
            link_to_file.clone(),
            format!("{} is a file, not a folder", link_to_file.display()),
        ),
        (
            dangling.clone(),
            format!(
                "{} is a symbolic link to {}, which does not exist",
                dangling.display(),
                tmp.path().join("nowhere").display()
            ),
        ),
        (
            dangling.join("sub"),
            format!("{} is a symbolic link to", dangling.display()),
        ),
    ] {
        let Ran { ok, text, .. } = run(&out, &[]);
        assert!(!ok, "{}: {text}", out.display());
        assert!(text.contains(&says), "{}: {text}", out.display());
        assert!(text.contains("give --out a new or empty folder"), "{text}");
        assert!(!text.contains("os error"), "{}: {text}", out.display());
        assert!(!text.contains("caused by"), "named once: {text}");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    assert!(!tmp.path().join("nowhere").exists());
}
