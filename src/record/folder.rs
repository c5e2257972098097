//! A run folder held by one process: a new or empty folder for a new run, or an existing run
//! folder to resume, never anything else; locked for as long as the run writes it, so that
//! two runs never write one folder. The lock is the operating system's (`flock`), so a killed
//! process leaves nothing that blocks a later `--resume`; a process that lets go of it removes
//! the lock file, so that a run that ended leaves no pid behind for a watcher to mistake. A
//! watcher tells a live writer from a killed one by trying the lock ([`holder`]), never by
//! the pid the file names, which another process may have by now.

use super::names::CONFIG_ORIGINAL;
use super::{MANIFEST, Manifest, RecordError};
use crate::host::Program;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The lock file, inside the run folder while a process holds it; it names the writer's
/// process id and machine.
pub const LOCK: &str = ".throng.lock";

/// How long taking a lock waits while it is held, before taking the holder for a writer: a
/// watcher (`throng serve`) holds it for an instant when it tries it.
const WATCHED: Duration = Duration::from_millis(500);
/// The manifest's temporary copy, renamed into place once written.
const MANIFEST_TMP: &str = "manifest.json.tmp";

#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error(
        "{dir} already holds files that are not a throng run ({example}, ...): give --out a new or empty folder"
    )]
    Foreign { dir: PathBuf, example: String },
    #[error(
        "{dir} already holds a run: continue it with `{}`, or give --out a new or empty folder",
        program.resume_command(dir)
    )]
    HoldsRun { dir: PathBuf, program: Program },
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
        program.report_command(dir)
    )]
    Busy {
        dir: PathBuf,
        pid: String,
        program: Program,
    },
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
    /// Dropping it releases the folder.
    _lock: FolderLock,
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

/// The lock of a run folder, held while this lives. Dropped, it removes the lock file (while
/// still holding it), then lets go.
#[derive(Debug)]
pub struct FolderLock {
    path: PathBuf,
    file: File,
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        // Only the file this lock is of: see `lock` for a process that opened it meanwhile.
        if same_file(&self.path, &self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether `path` is still the file `file` was opened from.
#[cfg(unix)]
fn same_file(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(path: &Path, _: &File) -> bool {
    path.is_file()
}

/// One try at the lock, with the lock file just opened.
enum Attempt {
    Held(FolderLock),
    /// Another process holds it.
    Busy(File),
    /// The file was removed (its holder let go) between its opening and our lock.
    Stale,
}

fn attempt(path: &Path, mut file: File) -> Result<Attempt, FolderError> {
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(Attempt::Busy(file)),
        Err(std::fs::TryLockError::Error(e)) => return Err(RecordError::io(path, e).into()),
    }
    // The holder before us removes the file as it lets go: one opened before that is no
    // longer the folder's lock file once we hold it, and another process may hold the new one.
    if !same_file(path, &file) {
        return Ok(Attempt::Stale);
    }
    file.set_len(0)
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .and_then(|_| write!(file, "{}\n{}\n", std::process::id(), host()))
        .and_then(|_| file.flush())
        .map_err(|e| RecordError::io(path, e))?;
    Ok(Attempt::Held(FolderLock {
        path: path.to_path_buf(),
        file,
    }))
}

fn lock(dir: &Path) -> Result<FolderLock, FolderError> {
    let path = dir.join(LOCK);
    let started = Instant::now();
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| RecordError::io(&path, e))?;
        match attempt(&path, file)? {
            Attempt::Held(lock) => return Ok(lock),
            Attempt::Stale => {}
            Attempt::Busy(_) if started.elapsed() < WATCHED => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Attempt::Busy(mut file) => {
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
        }
    }
}

/// The lock file of the run folder `dir` as a watcher sees it: whom it names, and whether
/// they hold the lock now; `None` without a lock file. A file that nobody holds was left by
/// a process killed before it could remove it: the pid it names may be another process's by
/// now. The lock is tried, not taken: held for an instant, and shared, so that no writer ever
/// waits on a watcher for long, and the file is opened as [`super::open::regular`] opens a
/// run folder's files, so that it never blocks.
pub fn lock_state(dir: &Path) -> std::io::Result<Option<(LockHolder, bool)>> {
    let mut file = match super::open::regular(dir, LOCK) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let held = match file.try_lock_shared() {
        // Released as the file closes.
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    };
    let mut text = String::new();
    (&mut file).take(4096).read_to_string(&mut text)?;
    Ok(Some((LockHolder::parse(&text), held)))
}

/// Who holds the lock of the run folder `dir` now (see [`lock_state`]).
pub fn holder(dir: &Path) -> std::io::Result<Option<LockHolder>> {
    Ok(lock_state(dir)?.and_then(|(holder, held)| held.then_some(holder)))
}

impl RunFolder {
    /// Takes `dir` for a new run: it must not exist, or be empty (or hold only what a start
    /// that never ran left: see [`never_started`]), and lie outside every other run's folder.
    /// The manifest (status `running`) is written before anything else, so that the folder is
    /// recognisably a run from its first moment; if it cannot be written (a full disk), what
    /// this start made is removed again and the folder is left as it was.
    pub fn create(dir: &Path, manifest: &Manifest, program: &Program) -> Result<Self, FolderError> {
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
            program: program.clone(),
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
    pub(crate) fn abandon(self) {
        for name in [
            MANIFEST_TMP,
            MANIFEST,
            super::CONFIG,
            CONFIG_ORIGINAL,
            super::names::STORE,
        ] {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        let _ = std::fs::remove_dir_all(self.dir.join(super::names::INPUTS));
        // Removes the lock file as it lets go.
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
            super::names::INPUTS,
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
/// the folder meanwhile; refused while a run holds it. `None` for a folder that is no run
/// (neither a manifest nor a lock file). `program` is named in the refusal, to run later.
pub fn lock_for_report(dir: &Path, program: &Program) -> Result<Option<FolderLock>, FolderError> {
    if !dir.join(LOCK).is_file() && !dir.join(MANIFEST).is_file() {
        return Ok(None);
    }
    match lock(dir) {
        Ok(file) => Ok(Some(file)),
        Err(FolderError::Locked { dir, pid }) => Err(FolderError::Busy {
            dir,
            pid,
            program: program.clone(),
        }),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throng() -> Program {
        Program::Command("throng".into())
    }

    // Two runs into one folder once both wrote it, leaving a corrupt mix of both.
    #[test]
    fn a_second_writer_is_refused_and_the_lock_dies_with_its_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let first = RunFolder::create(&dir, &Manifest::default(), &throng()).unwrap();
        for err in [
            RunFolder::resume(&dir).unwrap_err(),
            RunFolder::create(&dir, &Manifest::default(), &throng()).unwrap_err(),
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
        let err = RunFolder::create(tmp.path(), &Manifest::default(), &throng()).unwrap_err();
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
        drop(RunFolder::create(&run, &Manifest::default(), &throng()).unwrap());
        // A run's config follows its manifest (a folder with a manifest alone never ran).
        std::fs::write(run.join(super::super::CONFIG), "").unwrap();
        let err = RunFolder::create(&run, &Manifest::default(), &throng()).unwrap_err();
        assert!(err.to_string().contains("--resume"), "{err}");
        let err = RunFolder::resume(&tmp.path().join("nowhere")).unwrap_err();
        assert!(err.to_string().contains("no such folder"), "{err}");
    }

    // A run that ended kept `.throng.lock` with its pid, which a watcher took for a live
    // writer once the pid was reused: a run that ends leaves no lock file behind.
    #[test]
    fn a_run_that_ends_leaves_no_pid_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        drop(RunFolder::create(&dir, &Manifest::default(), &throng()).unwrap());
        assert!(!dir.join(LOCK).exists(), "after a new run");
        drop(RunFolder::resume(&dir).unwrap());
        assert!(!dir.join(LOCK).exists(), "after a resumed run");
    }

    // A writer that opened the lock file just before its holder removed it (as every holder
    // does when it lets go) would hold a file that is no longer the folder's lock, beside a
    // second writer holding the new one: it opens the folder's file again instead.
    #[test]
    fn a_writer_that_opened_the_lock_before_its_holder_removed_it_is_still_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let first = RunFolder::create(&dir, &Manifest::default(), &throng()).unwrap();
        let stale = File::open(dir.join(LOCK)).unwrap();
        drop(first);
        let second = RunFolder::resume(&dir).unwrap();
        // The stale file is free to lock, but it is not the folder's lock any more.
        assert!(matches!(
            attempt(&dir.join(LOCK), stale).unwrap(),
            Attempt::Stale
        ));
        let err = RunFolder::resume(&dir).unwrap_err().to_string();
        assert!(err.contains("another throng"), "{err}");
        drop(second);
    }

    // A watcher tries the lock to tell a live writer from a killed one; a writer starting at
    // that instant once took it for another writer and refused to start.
    #[test]
    fn a_watcher_trying_the_lock_never_turns_a_writer_away() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        drop(RunFolder::create(&dir, &Manifest::default(), &throng()).unwrap());
        std::fs::write(dir.join(LOCK), "1\n").unwrap();
        let watcher = File::open(dir.join(LOCK)).unwrap();
        watcher.try_lock_shared().unwrap();
        let let_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(watcher);
        });
        let folder = RunFolder::resume(&dir).unwrap();
        let_go.join().unwrap();
        assert_eq!(
            holder(&dir).unwrap().and_then(|h| h.pid),
            Some(std::process::id())
        );
        drop(folder);
        assert_eq!(holder(&dir).unwrap(), None);
    }

    // A killed run's lock file names a pid that another process may have by now: only a held
    // lock is a writer.
    #[test]
    fn a_lock_file_nobody_holds_names_no_holder() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(LOCK), format!("{}\n", std::process::id())).unwrap();
        assert_eq!(holder(tmp.path()).unwrap(), None);
        assert_eq!(holder(&tmp.path().join("nowhere")).unwrap(), None);
    }
}
