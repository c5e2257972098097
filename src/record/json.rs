//! The folder's JSON files (the manifest, above all): written atomically, and held back once a
//! process stops at once.

use super::error::RecordError;
use super::manifest::{Manifest, Status};
use super::names::MANIFEST;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Held while this process writes a JSON file, so that a run stopped at once (from a thread
/// of its own, see [`pause_at_once`]) never writes the manifest while the run writes it.
static JSON_WRITES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn hold_json_writes() -> std::sync::MutexGuard<'static, ()> {
    JSON_WRITES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `value` as pretty JSON atomically (a crash leaves the old file or the new one).
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), RecordError> {
    let _held = hold_json_writes();
    write_json_via(path, &path.with_extension("json.tmp"), value)
}

fn write_json_via<T: Serialize>(path: &Path, tmp: &Path, value: &T) -> Result<(), RecordError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| RecordError::format(path, e))?;
    let written = std::fs::write(tmp, text)
        .map_err(|e| RecordError::io(tmp, e))
        .and_then(|()| std::fs::rename(tmp, path).map_err(|e| RecordError::io(path, e)));
    if written.is_err() {
        // A full disk leaves a cut-short copy: remove it, the old file is still whole.
        let _ = std::fs::remove_file(tmp);
    }
    written
}

/// For a process about to exit in the middle of a step (a second signal, or a step that did
/// not finish in time): marks the run in `dir` paused if its manifest says it is running,
/// and holds back every later JSON write of this process, so that nothing written after
/// contradicts it. The records end at the last checkpoint, as after a kill, and `--resume`
/// continues from there. Returns the manifest as the folder now has it.
///
/// The manifest is written through a file of this process's own (`manifest.json.<pid>.tmp`),
/// since another rank of the job may mark the same folder at the same moment.
pub fn pause_at_once(dir: &Path) -> Result<Manifest, RecordError> {
    let held = hold_json_writes();
    // Whatever happens next, this process writes no more JSON.
    std::mem::forget(held);
    let path = dir.join(MANIFEST);
    let mut manifest: Manifest = read_json(&path)?;
    if manifest.status == Status::Running {
        manifest.status = Status::Paused;
        let tmp = dir.join(format!("{MANIFEST}.{}.tmp", std::process::id()));
        write_json_via(&path, &tmp, &manifest)?;
    }
    Ok(manifest)
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|e| RecordError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| RecordError::format(path, e))
}
