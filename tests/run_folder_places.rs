//! Where a run may be written, through the built binary: a config's `name` is one folder
//! name.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn throng() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_throng"));
    cmd.current_dir(repo())
        .env_remove("THRONG_CRASH_AT")
        .env_remove("THRONG_FULL_DISK_AT");
    cmd
}

fn output(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("panicked"),
        "throng panicked instead of reporting an error:\n{text}"
    );
    (out.status.success(), text)
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
            let (ok, text) = output(throng().current_dir(&work).arg(command).arg(&config));
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
        let (ok, text) = output(
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
