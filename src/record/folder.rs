//! A run folder held by one process: a new or empty folder for a new run, or an existing run
//! folder to resume, never anything else; locked for as long as the run writes it, so that
//! two runs never write one folder. The lock is the operating system's (`flock`), so a killed
//! process leaves nothing that blocks a later `--resume`.

use super::{MANIFEST, Manifest, RecordError};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The lock file, inside the run folder; it holds the writer's process id.
pub const LOCK: &str = ".throng.lock";
/// The manifest's temporary copy, renamed into place once written.
const MANIFEST_TMP: &str = "manifest.json.tmp";
/// The config as written, beside the config as run (`config.toml`).
pub const CONFIG_ORIGINAL: &str = "config.original.toml";

#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error(
        "{dir} already holds files that are not a throng run ({example}, ...): give --out a new or empty folder"
    )]
    Foreign { dir: PathBuf, example: String },
    #[error(
        "{dir} already holds a run: continue it with `{}`, or give --out a new or empty folder",
        crate::host::resume_command(dir)
    )]
    HoldsRun { dir: PathBuf },
    #[error("another throng (pid {pid}) is writing {dir}: wait for it to finish, or stop it first")]
    Locked { dir: PathBuf, pid: String },
    #[error("cannot resume {dir}: no such folder (give the folder that `throng run` wrote)")]
    Missing { dir: PathBuf },
    #[error("cannot resume {dir}: it is not a throng run folder (it has no manifest.json)")]
    NotARun { dir: PathBuf },
    #[error(
        "cannot resume {dir}: the run stopped at its start, before its {missing} was written (a full disk, or a kill), so it never ran and holds no records: start it again with `throng run CONFIG --out {dir}`, which takes the folder as empty"
    )]
    NeverStarted { dir: PathBuf, missing: &'static str },
    #[error(
        "{dir} cannot hold a run: {file} is a file, not a folder; give --out a new or empty folder"
    )]
    NotAFolder { dir: PathBuf, file: PathBuf },
    #[error(
        "{dir} cannot hold a run: {link} is a symbolic link to {target}, which does not exist; give --out a new or empty folder, or create {target} first"
    )]
    DanglingLink {
        dir: PathBuf,
        link: PathBuf,
        target: PathBuf,
    },
    #[error(
        "{dir} is inside the run folder {run}, whose files belong to that run alone: give --out a folder outside it"
    )]
    InsideRun { dir: PathBuf, run: PathBuf },
    #[error(
        "throng (pid {pid}) is still writing {dir}: a report now would show the run in the middle of a step and go stale as it goes on, so none is written. The run writes its report when it ends (if it was started with --no-report, run `{}` then)",
        crate::host::report_command(dir)
    )]
    Busy { dir: PathBuf, pid: String },
    #[error(
        "cannot start the run in {dir}: its manifest could not be written ({source}); the folder is left as it was"
    )]
    CannotStart { dir: PathBuf, source: RecordError },
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// A run folder this process holds the lock of.
#[derive(Debug)]
pub struct RunFolder {
    dir: PathBuf,
    /// Held open for the lock's sake; dropping it releases the folder.
    _lock: File,
    /// The folders this process made for the run (`dir` and any missing parents), innermost
    /// first: what [`RunFolder::abandon`] removes again.
    made: Vec<PathBuf>,
}

/// Who holds a run folder's lock: the lock file names the writer's pid on its first line and
/// its machine on the second (a file of an older throng has the pid alone), so that a watcher
/// on a shared file system can tell a writer of its own machine from another's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    pub pid: Option<u32>,
    pub host: Option<String>,
}

impl LockHolder {
    pub fn parse(text: &str) -> Self {
        let mut lines = text.lines().map(str::trim);
        LockHolder {
            pid: lines.next().and_then(|p| p.parse().ok()),
            host: lines.next().filter(|h| !h.is_empty()).map(str::to_string),
        }
    }
}

/// This machine's name, as lock files record it.
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn lock(dir: &Path) -> Result<File, FolderError> {
    let path = dir.join(LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| RecordError::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = LockHolder::parse(&text);
            return Err(FolderError::Locked {
                dir: dir.to_path_buf(),
                pid: match (holder.pid, holder.host) {
                    (None, _) => "unknown".into(),
                    (Some(pid), Some(h)) if h != host() => format!("{pid} on {h}"),
                    (Some(pid), _) => pid.to_string(),
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(RecordError::io(&path, e).into()),
    }
    file.set_len(0)
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .and_then(|_| write!(file, "{}\n{}\n", std::process::id(), host()))
        .and_then(|_| file.flush())
        .map_err(|e| RecordError::io(&path, e))?;
    Ok(file)
}

impl RunFolder {
    /// Takes `dir` for a new run: it must not exist, or be empty (or hold only what a start
    /// that never ran left: see [`never_started`]), and lie outside every other run's folder.
    /// The manifest (status `running`) is written before anything else, so that the folder is
    /// recognisably a run from its first moment; if it cannot be written (a full disk), what
    /// this start made is removed again and the folder is left as it was.
    pub fn create(dir: &Path, manifest: &Manifest) -> Result<Self, FolderError> {
        usable(dir)?;
        if let Some(run) = enclosing_run(dir) {
            return Err(FolderError::InsideRun {
                dir: dir.to_path_buf(),
                run,
            });
        }
        let made: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(dir).map_err(|e| RecordError::io(dir, e))?;
        let holds_run = || FolderError::HoldsRun {
            dir: dir.to_path_buf(),
        };
        // Checked before the lock file is made, so a refused folder is left as it was.
        if never_started(dir).is_none() {
            if dir.join(MANIFEST).exists() {
                // Held by a run still writing it, or an old run to resume.
                lock(dir)?;
                return Err(holds_run());
            }
            let entries = std::fs::read_dir(dir).map_err(|e| RecordError::io(dir, e))?;
            let mut foreign: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name != LOCK)
                .collect();
            foreign.sort();
            return Err(FolderError::Foreign {
                dir: dir.to_path_buf(),
                example: foreign.first().cloned().unwrap_or_default(),
            });
        }
        let file = lock(dir)?;
        // Another run may have taken the folder between our look and our lock.
        let Some(leftovers) = never_started(dir) else {
            return Err(holds_run());
        };
        let folder = Self {
            dir: dir.to_path_buf(),
            _lock: file,
            made,
        };
        let written = leftovers
            .iter()
            .filter(|name| *name != LOCK)
            .try_for_each(|name| {
                let path = dir.join(name);
                std::fs::remove_file(&path).map_err(|e| RecordError::io(&path, e))
            })
            .and_then(|()| super::full_disk_at("manifest", &dir.join(MANIFEST_TMP)))
            .and_then(|()| super::write_json_atomic(&dir.join(MANIFEST), manifest));
        if let Err(source) = written {
            folder.abandon();
            return Err(FolderError::CannotStart {
                dir: dir.to_path_buf(),
                source,
            });
        }
        Ok(folder)
    }

    /// Gives up a new run's folder whose start failed (its config could not be written, its
    /// model did not load): removes what the start wrote (manifest, configs, decision store,
    /// lock) and the folders it made, leaving the place
    /// as it was before, so that the same `--out` can be given again.
    pub fn abandon(self) {
        for name in [
            MANIFEST_TMP,
            MANIFEST,
            super::CONFIG,
            CONFIG_ORIGINAL,
            super::store::STORE,
            LOCK,
        ] {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        let _ = std::fs::remove_dir_all(self.dir.join(super::inputs::INPUTS));
        drop(self._lock);
        // Only folders it made, and only while empty.
        for dir in &self.made {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }

    /// Takes the run folder `dir` to resume it.
    pub fn resume(dir: &Path) -> Result<Self, FolderError> {
        if !dir.is_dir() {
            return Err(FolderError::Missing {
                dir: dir.to_path_buf(),
            });
        }
        if !dir.join(MANIFEST).is_file() {
            if let Some(leftovers) = never_started(dir)
                && !leftovers.is_empty()
            {
                return Err(FolderError::NeverStarted {
                    dir: dir.to_path_buf(),
                    missing: "manifest",
                });
            }
            return Err(FolderError::NotARun {
                dir: dir.to_path_buf(),
            });
        }
        let file = lock(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: file,
            made: Vec::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// What a start that never ran left in `dir`, if that is all the folder holds: nothing, or
/// some of the lock, the manifest (or its temporary copy, cut short by a full disk), the
/// config as written and the copies of its inputs (`inputs/`, written before `config.toml`),
/// with no `config.toml` and no finished step. Such a folder is taken as
/// empty by a new run. `None` when it holds anything else.
pub fn never_started(dir: &Path) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).ok()? {
        let name = entry.ok()?.file_name().to_string_lossy().into_owned();
        let start = [
            LOCK,
            MANIFEST_TMP,
            MANIFEST,
            CONFIG_ORIGINAL,
            super::inputs::INPUTS,
        ];
        if !start.contains(&name.as_str()) {
            return None;
        }
        names.push(name);
    }
    if names.iter().any(|n| n == MANIFEST) {
        // A run's manifest, written at its start and never since.
        let manifest: Manifest = super::read_json(&dir.join(MANIFEST)).ok()?;
        if manifest.steps_done > 0 || manifest.status != super::Status::Running {
            return None;
        }
    }
    names.sort();
    Some(names)
}

/// Refuses, by name, a `dir` that can never be a folder: a file, a symbolic link to nothing,
/// or a path through either.
fn usable(dir: &Path) -> Result<(), FolderError> {
    for path in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if meta.file_type().is_symlink() && !path.exists() {
            return Err(FolderError::DanglingLink {
                dir: dir.to_path_buf(),
                link: path.to_path_buf(),
                target: std::fs::read_link(path).unwrap_or_default(),
            });
        }
        if !path.is_dir() {
            return Err(FolderError::NotAFolder {
                dir: dir.to_path_buf(),
                file: path.to_path_buf(),
            });
        }
        // The rest of the path lies inside a folder that exists.
        break;
    }
    Ok(())
}

/// The run folder `dir` would lie inside, if any: the nearest folder above it holding a
/// throng manifest, after links and `..` are resolved.
fn enclosing_run(dir: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(dir).ok()?;
    let existing = absolute.ancestors().find(|a| a.exists())?;
    let mut resolved = existing.canonicalize().ok()?;
    for part in absolute.strip_prefix(existing).ok()?.components() {
        match part {
            std::path::Component::ParentDir => {
                resolved.pop();
            }
            std::path::Component::Normal(name) => resolved.push(name),
            _ => {}
        }
    }
    resolved
        .ancestors()
        .skip(1)
        .find(|a| super::read_json::<Manifest>(&a.join(MANIFEST)).is_ok())
        .map(Path::to_path_buf)
}

/// Takes the lock of the run folder `dir` to write its report there, so that no run writes
/// the folder meanwhile; refused while a run holds it. `None` for a folder without a lock file
/// (no run ever wrote it).
pub fn lock_for_report(dir: &Path) -> Result<Option<File>, FolderError> {
    if !dir.join(LOCK).is_file() {
        return Ok(None);
    }
    match lock(dir) {
        Ok(file) => Ok(Some(file)),
        Err(FolderError::Locked { dir, pid }) => Err(FolderError::Busy { dir, pid }),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two runs into one folder once both wrote it, leaving a corrupt mix of both.
    #[test]
    fn a_second_writer_is_refused_and_the_lock_dies_with_its_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let first = RunFolder::create(&dir, &Manifest::default()).unwrap();
        for err in [
            RunFolder::resume(&dir).unwrap_err(),
            RunFolder::create(&dir, &Manifest::default()).unwrap_err(),
        ] {
            let err = err.to_string();
            assert!(
                err.contains(&format!("another throng (pid {})", std::process::id())),
                "{err}"
            );
        }
        drop(first);
        RunFolder::resume(&dir).unwrap();
    }

    // A folder of the user's own files once got records appended to them.
    #[test]
    fn foreign_files_and_old_runs_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("state.csv"), "mine").unwrap();
        let err = RunFolder::create(tmp.path(), &Manifest::default()).unwrap_err();
        assert!(matches!(err, FolderError::Foreign { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("state.csv")).unwrap(),
            "mine"
        );
        assert!(
            !tmp.path().join(LOCK).exists(),
            "a refused folder is left as it was"
        );
        let run = tmp.path().join("run");
        drop(RunFolder::create(&run, &Manifest::default()).unwrap());
        // A run's config follows its manifest (a folder with a manifest alone never ran).
        std::fs::write(run.join(super::super::CONFIG), "").unwrap();
        let err = RunFolder::create(&run, &Manifest::default()).unwrap_err();
        assert!(err.to_string().contains("--resume"), "{err}");
        let err = RunFolder::resume(&tmp.path().join("nowhere")).unwrap_err();
        assert!(err.to_string().contains("no such folder"), "{err}");
    }
}
