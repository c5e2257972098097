//! The run folders under a root, each with an id and a one-line summary.
//!
//! A folder is a run when it holds a manifest (or the lock or temporary manifest a start
//! leaves before it): one that cannot be read shows as `damaged`, with why, and never stops
//! the index. Ids are the first hex digits of the SHA-256 of the folder's path under the
//! root, so that a bookmark outlives a restart of the server. Every file of a run folder is
//! opened as [`open::regular`] opens it: a link, a FIFO or a device is never read.

use crate::record::{self, MANIFEST, Manifest, STEPS, Status, StepRecord, open};
use crate::record::{LOCK, host};
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

/// The most of a manifest or a step log read (a file larger is damaged, not read whole).
const MOST: u64 = 256 << 20;

/// One run in the index.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: String,
    /// The folder under the root, for display only.
    pub path: String,
    /// The folder's own name: what tells runs of one config apart, and what Delete asks for.
    pub folder: String,
    /// The config's name (every run of a config has it).
    pub name: String,
    pub scenario: String,
    /// The policy that decides (`scripted`, `llm`, or `mixed` under policy groups).
    pub policy: Option<String>,
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
    /// Of those, the LLM policy's and the scripted rules' apart, when the steps say.
    pub model_decisions_per_second: Option<f64>,
    pub scripted_decisions_per_second: Option<f64>,
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
    /// Its writer holds its lock (here, or its folder changed lately).
    Running,
    /// Stopped on request after a finished step; `--resume` continues it.
    Paused,
    /// The manifest says running, but nobody holds its lock: killed. `--resume` continues it.
    Interrupted,
    Finished,
    Failed,
    /// Its manifest or step log cannot be read.
    Damaged,
}

/// The writer of a run folder: the holder of its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// A process of this machine with that pid holds the lock.
    Here(u32),
    /// Another machine's process (a shared file system): it holds the lock, or the folder
    /// changed lately.
    Elsewhere,
    None,
}

/// A run folder read once: its manifest and steps, or why they cannot be read.
pub struct Read {
    pub dir: PathBuf,
    pub manifest: Result<Manifest, Damage>,
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

    /// The folder's own name.
    pub fn folder(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn summary(&self, root: &Path) -> RunSummary {
        let path = display_path(root, &self.dir);
        let status = self.status();
        let mut s = RunSummary {
            id: id_of(root, &self.dir),
            folder: self.folder(),
            name: self.folder(),
            path,
            scenario: String::new(),
            policy: None,
            status,
            damage: self.manifest.as_ref().err().map(Damage::to_string),
            steps_done: 0,
            planned_steps: 0,
            eta_seconds: None,
            model: None,
            device: None,
            ranks: self.steps.last().map_or(1, |s| s.ranks),
            decisions_per_second: None,
            model_decisions_per_second: None,
            scripted_decisions_per_second: None,
            started: None,
            disk_bytes: disk_bytes(&self.dir),
            report: listing(&self.dir, "").iter().any(|f| f == "report.html"),
        };
        if let Ok(m) = &self.manifest {
            s.name = m.name.clone();
            s.scenario = m.scenario.clone();
            s.policy = Some(m.policy.clone()).filter(|p| !p.is_empty());
            s.steps_done = m.steps_done.max(self.steps.len());
            s.planned_steps = m.planned_steps();
            s.model = m.model.clone();
            s.device = m.device.clone();
            let (decisions, seconds) = self
                .steps
                .iter()
                .fold((0, 0.0), |(d, t), s| (d + s.decisions, t + s.seconds));
            s.decisions_per_second = (seconds > 0.0).then(|| decisions as f64 / seconds);
            let split = self.steps.iter().try_fold((0, 0), |(m, k), s| {
                s.split().map(|(sm, sk)| (m + sm, k + sk))
            });
            if let Some((model, scripted)) = split.filter(|_| seconds > 0.0) {
                s.model_decisions_per_second = Some(model as f64 / seconds);
                s.scripted_decisions_per_second = Some(scripted as f64 / seconds);
            }
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

/// Why a run folder's manifest or step log cannot be read: the folder shows as damaged, with
/// this, and the listing goes on. (Messages, not sources: a listing is read again and again,
/// and shown as text.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("no manifest.json: a start that never wrote one (a full disk?), or not a run")]
    NoManifest,
    #[error("manifest.json cannot be read: {0}")]
    ManifestUnreadable(String),
    #[error("manifest.json cannot be read ({0}): the folder is damaged")]
    ManifestDamaged(String),
    #[error("steps.csv cannot be read: {0}")]
    StepsUnreadable(String),
    #[error("steps.csv is damaged ({0})")]
    StepsDamaged(String),
}

/// The run's manifest, or why it cannot be read.
pub(crate) fn read_manifest(dir: &Path) -> Result<Manifest, Damage> {
    match open::read(dir, MANIFEST, MOST) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| Damage::ManifestDamaged(e.to_string()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Damage::NoManifest),
        Err(e) => Err(Damage::ManifestUnreadable(e.to_string())),
    }
}

/// `steps.csv` up to its last whole line: a line being appended is not yet a step.
pub(crate) fn read_steps_lenient(dir: &Path) -> Result<Vec<StepRecord>, Damage> {
    let bytes = match open::read(dir, STEPS, MOST) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Damage::StepsUnreadable(e.to_string())),
    };
    let whole = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    csv::Reader::from_reader(whole)
        .deserialize()
        .collect::<Result<Vec<StepRecord>, _>>()
        .map_err(|e| Damage::StepsDamaged(e.to_string()))
}

/// The writer of `dir`: whoever holds its lock (see [`record::lock_state`]). A lock file
/// that nobody holds names a writer that was killed (its pid may be another process's by
/// now), unless it names another machine, whose lock a shared file system may not show: that
/// one counts as writing while the folder changes.
pub fn writer(dir: &Path) -> Writer {
    let Ok(Some((holder, held))) = record::lock_state(dir) else {
        return Writer::None;
    };
    let here = holder.host.is_none() || holder.host.as_deref() == Some(host().as_str());
    match (held, here, holder.pid) {
        (true, true, Some(pid)) => Writer::Here(pid),
        // Held, with its pid not written yet, or by another machine's process.
        (true, ..) => Writer::Elsewhere,
        (false, true, _) => Writer::None,
        (false, false, _) => {
            let changed = [MANIFEST, STEPS]
                .iter()
                .filter_map(|f| {
                    std::fs::symlink_metadata(dir.join(f))
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
    }
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

/// The bytes of every file under `dir` (links not followed).
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

/// The names of the regular files in `sub` (a folder of `dir`, `""` for `dir` itself), in no
/// order: none when `sub` is a link, or no folder.
pub fn listing(dir: &Path, sub: &str) -> Vec<String> {
    let path = if sub.is_empty() {
        dir.to_path_buf()
    } else {
        dir.join(sub)
    };
    if !sub.is_empty() && !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(&path) else {
        return Vec::new();
    };
    entries
        .flatten()
        // The entry's own type: a link is a link here, whatever it points at.
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect()
}

/// Whether `dir` is a run folder (or what a start of one left).
pub(crate) fn is_run(dir: &Path) -> bool {
    [MANIFEST, "manifest.json.tmp", LOCK]
        .iter()
        .any(|f| std::fs::symlink_metadata(dir.join(f)).is_ok())
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
    .map(|f| match std::fs::symlink_metadata(dir.join(f)) {
        Ok(m) => (m.len(), m.modified().ok()),
        Err(_) => (u64::MAX, None),
    })
    .collect()
}
