//! The run folders under a root, each with an id and a one-line summary.
//!
//! A folder is a run when it holds a manifest (or the lock or temporary manifest a start
//! leaves before it): one that cannot be read shows as `damaged`, with why, and never stops
//! the index. Ids are the first hex digits of the SHA-256 of the folder's path under the
//! root, so that a bookmark outlives a restart of the server.

use crate::record::{self, MANIFEST, Manifest, STEPS, Status, StepRecord};
use crate::record::{LOCK, LockHolder, host};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How deep under the root run folders are looked for (`runs/<name>`, `runs/<study>/<name>`).
const DEPTH: usize = 3;

/// A run whose manifest says `running` but whose writer is not on this machine counts as
/// running while its folder changed this recently.
const FRESH: Duration = Duration::from_secs(120);

/// One run in the index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: String,
    /// The folder under the root, for display only.
    pub path: String,
    pub name: String,
    pub scenario: String,
    pub status: RunStatus,
    /// Why the folder cannot be read, when `status` is `damaged`.
    pub damage: Option<String>,
    pub steps_done: usize,
    pub planned_steps: usize,
    pub eta_seconds: Option<f64>,
    pub model: Option<String>,
    pub device: Option<String>,
    pub ranks: usize,
    pub decisions_per_second: Option<f64>,
    /// When it started (RFC 3339, UTC).
    pub started: Option<String>,
    pub disk_bytes: u64,
    /// Whether `report.html` is there.
    pub report: bool,
}

/// What a run is doing, as the index shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Its writer is alive (here, or its folder changed lately).
    Running,
    /// Stopped on request after a finished step; `--resume` continues it.
    Paused,
    /// The manifest says running, but no writer is alive: killed. `--resume` continues it.
    Interrupted,
    Finished,
    Failed,
    /// Its manifest or step log cannot be read.
    Damaged,
}

/// The writer of a run folder, from the pid its lock holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// A process of this machine with that pid is alive.
    Here(u32),
    /// None here; the folder changed lately (another machine on a shared file system).
    Elsewhere,
    None,
}

/// A run folder read once: its manifest and steps, or why they cannot be read.
pub struct Read {
    pub dir: PathBuf,
    pub manifest: Result<Manifest, String>,
    pub steps: Vec<StepRecord>,
    pub writer: Writer,
}

impl Read {
    pub fn of(dir: &Path) -> Self {
        let manifest = read_manifest(dir);
        let steps = match &manifest {
            Ok(_) => read_steps_lenient(dir),
            Err(_) => Ok(Vec::new()),
        };
        let (manifest, steps) = match steps {
            Ok(steps) => (manifest, steps),
            Err(e) => (Err(e), Vec::new()),
        };
        Read {
            dir: dir.to_path_buf(),
            writer: writer(dir),
            manifest,
            steps,
        }
    }

    pub fn status(&self) -> RunStatus {
        match &self.manifest {
            Err(_) => RunStatus::Damaged,
            Ok(m) => match m.status {
                Status::Running if self.writer == Writer::None => RunStatus::Interrupted,
                Status::Running => RunStatus::Running,
                Status::Paused => RunStatus::Paused,
                Status::Finished => RunStatus::Finished,
                Status::Failed => RunStatus::Failed,
            },
        }
    }

    pub fn summary(&self, root: &Path) -> RunSummary {
        let path = display_path(root, &self.dir);
        let status = self.status();
        let mut s = RunSummary {
            id: id_of(root, &self.dir),
            name: self
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            path,
            scenario: String::new(),
            status,
            damage: self.manifest.as_ref().err().cloned(),
            steps_done: 0,
            planned_steps: 0,
            eta_seconds: None,
            model: None,
            device: None,
            ranks: self.steps.last().map_or(1, |s| s.ranks),
            decisions_per_second: None,
            started: None,
            disk_bytes: disk_bytes(&self.dir),
            report: self.dir.join("report.html").is_file(),
        };
        if let Ok(m) = &self.manifest {
            s.name = m.name.clone();
            s.scenario = m.scenario.clone();
            s.steps_done = m.steps_done.max(self.steps.len());
            s.planned_steps = m.planned_steps();
            s.model = m.model.clone();
            s.device = m.device.clone();
            let (decisions, seconds) = self
                .steps
                .iter()
                .fold((0, 0.0), |(d, t), s| (d + s.decisions, t + s.seconds));
            s.decisions_per_second = (seconds > 0.0).then(|| decisions as f64 / seconds);
            s.started = jiff::Timestamp::from_second(m.started_unix as i64)
                .ok()
                .map(|t| t.to_string());
            if status == RunStatus::Running {
                s.eta_seconds = eta(&self.steps, s.planned_steps);
            }
        }
        s
    }
}

/// Seconds left: the steps left at the pace of the last few (their whole wall time,
/// records included).
fn eta(steps: &[StepRecord], planned: usize) -> Option<f64> {
    let recent = &steps[steps.len().saturating_sub(5)..];
    if recent.is_empty() {
        return None;
    }
    let per = recent
        .iter()
        .map(|s| s.seconds + s.record_seconds)
        .sum::<f64>()
        / recent.len() as f64;
    Some(per * planned.saturating_sub(steps.len()) as f64)
}

fn read_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| format!("manifest.json cannot be read ({e}): the folder is damaged")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(
            "no manifest.json: a start that never wrote one (a full disk?), or not a run"
                .to_string(),
        ),
        Err(e) => Err(format!("manifest.json cannot be read: {e}")),
    }
}

/// `steps.csv` up to its last whole line: a line being appended is not yet a step.
pub fn read_steps_lenient(dir: &Path) -> Result<Vec<StepRecord>, String> {
    let path = dir.join(STEPS);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("steps.csv cannot be read: {e}")),
    };
    let whole = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    csv::Reader::from_reader(whole)
        .deserialize()
        .collect::<Result<Vec<StepRecord>, _>>()
        .map_err(|e| format!("steps.csv is damaged ({e})"))
}

/// The writer of `dir`, from the pid and host its lock names (see [`crate::record::folder`]).
pub fn writer(dir: &Path) -> Writer {
    let Ok(lock) = std::fs::read_to_string(dir.join(LOCK)) else {
        return Writer::None;
    };
    let holder = LockHolder::parse(&lock);
    if holder.host.is_none() || holder.host.as_deref() == Some(host().as_str()) {
        return match holder.pid {
            Some(pid) if alive(pid) => Writer::Here(pid),
            _ => Writer::None,
        };
    }
    // Another machine's writer (a shared file system): alive while the folder changes.
    let changed = [MANIFEST, STEPS]
        .iter()
        .filter_map(|f| {
            std::fs::metadata(dir.join(f))
                .and_then(|m| m.modified())
                .ok()
        })
        .max();
    match changed {
        Some(t) if SystemTime::now().duration_since(t).unwrap_or_default() < FRESH => {
            Writer::Elsewhere
        }
        _ => Writer::None,
    }
}

#[cfg(unix)]
fn alive(pid: u32) -> bool {
    // Signal 0 checks that the process exists (EPERM: it exists, owned by another user).
    let pid = match i32::try_from(pid) {
        Ok(p) if p > 0 => p,
        _ => return false,
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(not(unix))]
fn alive(_pid: u32) -> bool {
    false
}

/// The id of `dir` under `root`.
pub fn id_of(root: &Path, dir: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    let digest = Sha256::digest(rel.to_string_lossy().as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

fn display_path(root: &Path, dir: &Path) -> String {
    dir.strip_prefix(root)
        .map(|rel| root.join(rel))
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string()
}

/// The bytes of every file under `dir`.
pub fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

/// Whether `dir` is a run folder (or what a start of one left).
fn is_run(dir: &Path) -> bool {
    [MANIFEST, "manifest.json.tmp", LOCK]
        .iter()
        .any(|f| dir.join(f).exists())
}

/// Every run folder under `root` (not inside another run), by id.
pub fn scan(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        if depth > 0 && is_run(&dir) {
            found.insert(id_of(root, &dir), dir);
            continue;
        }
        if depth == DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            // Symbolic links are not followed: the index stays under the root.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// A cheap fingerprint of what a page shows of `dir`: the sizes and times of the files a
/// step changes. The server rebuilds a page only when it changes.
pub fn fingerprint(dir: &Path) -> Vec<(u64, Option<SystemTime>)> {
    [
        MANIFEST,
        STEPS,
        record::AGGREGATES,
        record::DECISIONS,
        "report.html",
        LOCK,
    ]
    .iter()
    .map(|f| match std::fs::metadata(dir.join(f)) {
        Ok(m) => (m.len(), m.modified().ok()),
        Err(_) => (u64::MAX, None),
    })
    .collect()
}
