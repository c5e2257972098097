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

#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error(
        "{dir} already holds files that are not a throng run ({example}, ...): give --out a new or empty folder"
    )]
    Foreign { dir: PathBuf, example: String },
    #[error(
        "{dir} already holds a run: continue it with `throng run --resume {dir}`, or give --out a new or empty folder"
    )]
    HoldsRun { dir: PathBuf },
    #[error("another throng (pid {pid}) is writing {dir}: wait for it to finish, or stop it first")]
    Locked { dir: PathBuf, pid: String },
    #[error("cannot resume {dir}: no such folder (give the folder that `throng run` wrote)")]
    Missing { dir: PathBuf },
    #[error("cannot resume {dir}: it is not a throng run folder (it has no manifest.json)")]
    NotARun { dir: PathBuf },
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// A run folder this process holds the lock of.
#[derive(Debug)]
pub struct RunFolder {
    dir: PathBuf,
    /// Held open for the lock's sake; dropping it releases the folder.
    _lock: File,
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
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(FolderError::Locked {
                dir: dir.to_path_buf(),
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.to_string()
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(RecordError::io(&path, e).into()),
    }
    file.set_len(0)
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .and_then(|_| write!(file, "{}", std::process::id()))
        .and_then(|_| file.flush())
        .map_err(|e| RecordError::io(&path, e))?;
    Ok(file)
}

impl RunFolder {
    /// Takes `dir` for a new run: it must not exist, or be empty. The manifest (status
    /// `running`) is written before anything else, so that the folder is recognisably a run
    /// from its first moment.
    pub fn create(dir: &Path, manifest: &Manifest) -> Result<Self, FolderError> {
        std::fs::create_dir_all(dir).map_err(|e| RecordError::io(dir, e))?;
        let holds_run = || FolderError::HoldsRun {
            dir: dir.to_path_buf(),
        };
        if dir.join(MANIFEST).exists() {
            // Held by a run still writing it, or an old run to resume.
            lock(dir)?;
            return Err(holds_run());
        }
        // Checked before the lock file is made, so a refused folder is left as it was.
        let entries = std::fs::read_dir(dir).map_err(|e| RecordError::io(dir, e))?;
        let mut foreign: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name != LOCK)
            .collect();
        if !foreign.is_empty() {
            foreign.sort();
            return Err(FolderError::Foreign {
                dir: dir.to_path_buf(),
                example: foreign.swap_remove(0),
            });
        }
        let file = lock(dir)?;
        if dir.join(MANIFEST).exists() {
            // Another run took the folder between our look and our lock.
            return Err(holds_run());
        }
        super::write_json_atomic(&dir.join(MANIFEST), manifest)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: file,
        })
    }

    /// Takes the run folder `dir` to resume it.
    pub fn resume(dir: &Path) -> Result<Self, FolderError> {
        if !dir.is_dir() {
            return Err(FolderError::Missing {
                dir: dir.to_path_buf(),
            });
        }
        if !dir.join(MANIFEST).is_file() {
            return Err(FolderError::NotARun {
                dir: dir.to_path_buf(),
            });
        }
        let file = lock(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: file,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
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
        let err = RunFolder::create(&run, &Manifest::default()).unwrap_err();
        assert!(err.to_string().contains("--resume"), "{err}");
        let err = RunFolder::resume(&tmp.path().join("nowhere")).unwrap_err();
        assert!(err.to_string().contains("no such folder"), "{err}");
    }
}
