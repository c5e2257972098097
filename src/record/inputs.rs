//! What a run read when it started, kept in its folder so that `--resume` runs exactly that.
//!
//! A run folder holds copies of its inputs under `inputs/` (the resolved config and every
//! prompt template the run reads), and its manifest holds the sha256 of each file the run
//! reads (`config.toml` and those copies). A resume recomputes them and refuses to go on
//! when any differs: an edit made while a run was paused would otherwise apply from the
//! middle of the run, silently.

use super::RecordError;
pub use super::names::{INPUTS, STARTED_CONFIG};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The sha256 of `bytes`, in hex.
pub fn fingerprint(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The fingerprints of `files` (paths relative to `dir`).
pub fn fingerprints(
    dir: &Path,
    files: impl IntoIterator<Item = String>,
) -> Result<BTreeMap<String, String>, RecordError> {
    files
        .into_iter()
        .map(|file| {
            let path = dir.join(&file);
            let bytes = std::fs::read(&path).map_err(|e| RecordError::io(&path, e))?;
            Ok((file, fingerprint(&bytes)))
        })
        .collect()
}

/// How one input differs from what the run started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputChange {
    /// The file is gone (or unreadable).
    Missing { file: String },
    /// The file's bytes differ; `details` names the settings that differ, where the file is
    /// the config and its copy as started is there to compare with.
    Changed { file: String, details: Vec<String> },
}

impl InputChange {
    /// The file, relative to the run folder (`config.toml`, `inputs/templates/player.jinja`).
    pub fn file(&self) -> &str {
        match self {
            InputChange::Missing { file } | InputChange::Changed { file, .. } => file,
        }
    }

    /// Whether the file is the run's copy of a prompt template (`inputs/templates/...`):
    /// the run renders that copy, so it, not the template it was copied from, changed.
    pub(crate) fn is_template(&self) -> bool {
        Path::new(self.file()).starts_with(Path::new(INPUTS).join("templates"))
    }
}

/// Where the run in `dir` (with manifest `manifest`) copied its template `file`
/// (`inputs/templates/player.jinja`) from, if that file still holds what the run started
/// with: the `templates` folder its config named, or a scenario's default folder beside or
/// under the folder throng ran in, as when the run started (paths relative to where throng
/// runs now, as the manifest's `config_file` is).
pub(crate) fn original_template(
    dir: &Path,
    manifest: &super::Manifest,
    file: &str,
) -> Option<PathBuf> {
    let want = manifest.inputs.get(file)?;
    let name = Path::new(file).file_name()?;
    let config = Path::new(&manifest.config_file);
    let config_dir = config.parent().unwrap_or(Path::new(""));
    let named = std::fs::read_to_string(dir.join(super::CONFIG_ORIGINAL))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("templates")?.as_str().map(|t| config_dir.join(t)));
    let folders = named.into_iter().chain([
        config_dir
            .join("..")
            .join("templates")
            .join(&manifest.scenario),
        Path::new("templates").join(&manifest.scenario),
    ]);
    folders
        .map(|folder| folder.join(name))
        .find(|path| std::fs::read(path).is_ok_and(|bytes| fingerprint(&bytes) == *want))
}

impl std::fmt::Display for InputChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputChange::Missing { file } => write!(f, "{file} is missing"),
            InputChange::Changed { file, details } if details.is_empty() => {
                write!(f, "{file} was edited")
            }
            InputChange::Changed { file, details } => {
                write!(f, "{file} was edited: {}", details.join("; "))
            }
        }
    }
}

/// Every recorded input of the run in `dir` that is no longer what the run started with.
pub fn changes(dir: &Path, recorded: &BTreeMap<String, String>) -> Vec<InputChange> {
    let mut out = Vec::new();
    for (file, want) in recorded {
        let Ok(bytes) = std::fs::read(dir.join(file)) else {
            out.push(InputChange::Missing { file: file.clone() });
            continue;
        };
        if fingerprint(&bytes) == *want {
            continue;
        }
        let details = match (file.as_str(), std::fs::read(dir.join(STARTED_CONFIG))) {
            (super::CONFIG, Ok(started)) if fingerprint(&started) == *want => config_differences(
                &String::from_utf8_lossy(&started),
                &String::from_utf8_lossy(&bytes),
            ),
            _ => Vec::new(),
        };
        out.push(InputChange::Changed {
            file: file.clone(),
            details,
        });
    }
    out
}

/// The settings that differ between two TOML documents, as `key: was A, now B` (dotted keys
/// for nested tables; `[[arms]]` entries by index).
pub(crate) fn config_differences(before: &str, after: &str) -> Vec<String> {
    let (Ok(before), Ok(after)) = (before.parse::<toml::Table>(), after.parse::<toml::Table>())
    else {
        return vec!["it no longer parses as TOML".into()];
    };
    let mut out = Vec::new();
    diff_tables("", &before, &after, &mut out);
    out
}

fn diff_tables(prefix: &str, before: &toml::Table, after: &toml::Table, out: &mut Vec<String>) {
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let name = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        diff_values(&name, before.get(key), after.get(key), out);
    }
}

fn diff_values(
    name: &str,
    before: Option<&toml::Value>,
    after: Option<&toml::Value>,
    out: &mut Vec<String>,
) {
    use toml::Value;
    match (before, after) {
        (Some(Value::Table(b)), Some(Value::Table(a))) => diff_tables(name, b, a, out),
        (Some(Value::Array(b)), Some(Value::Array(a)))
            if b.len() == a.len() && b.iter().chain(a).all(Value::is_table) =>
        {
            for (i, (b, a)) in b.iter().zip(a).enumerate() {
                diff_values(&format!("{name}[{i}]"), Some(b), Some(a), out);
            }
        }
        (Some(b), Some(a)) if b != a => out.push(format!("`{name}` was {b}, now {a}")),
        (Some(b), None) => out.push(format!("`{name}` ({b}) was removed")),
        (None, Some(a)) => out.push(format!("`{name}` = {a} was added")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_differences_name_every_changed_setting() {
        let before = "name = \"g\"\nseed = 11\nsteps = 5\n[scenario]\nratio = \"1/2\"\n\
                      [[arms]]\nname = \"a\"\ncap = 1.0\n";
        let after = "name = \"g\"\nseed = 12\nsteps = 5\n[scenario]\nratio = \"2/3\"\n\
                     offset = 5\n[[arms]]\nname = \"a\"\ncap = 2.0\n";
        assert_eq!(
            config_differences(before, after),
            [
                "`arms[0].cap` was 1.0, now 2.0",
                "`scenario.offset` = 5 was added",
                "`scenario.ratio` was \"1/2\", now \"2/3\"",
                "`seed` was 11, now 12",
            ]
        );
        assert!(config_differences(before, before).is_empty());
        assert_eq!(
            config_differences(before, "not [ toml"),
            ["it no longer parses as TOML"]
        );
    }

    #[test]
    fn changes_find_edited_and_missing_inputs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("inputs/templates")).unwrap();
        std::fs::write(dir.path().join(super::super::CONFIG), "seed = 1\n").unwrap();
        std::fs::write(dir.path().join(STARTED_CONFIG), "seed = 1\n").unwrap();
        std::fs::write(dir.path().join("inputs/templates/a.jinja"), "hi").unwrap();
        let recorded = fingerprints(
            dir.path(),
            [
                "config.toml".to_string(),
                "inputs/templates/a.jinja".to_string(),
            ],
        )
        .unwrap();
        assert!(changes(dir.path(), &recorded).is_empty());
        std::fs::write(dir.path().join(super::super::CONFIG), "seed = 2\n").unwrap();
        std::fs::remove_file(dir.path().join("inputs/templates/a.jinja")).unwrap();
        let found: Vec<String> = changes(dir.path(), &recorded)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "config.toml was edited: `seed` was 1, now 2",
                "inputs/templates/a.jinja is missing"
            ]
        );
    }
}
