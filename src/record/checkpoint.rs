//! Checkpoints: compact binary files (postcard) behind a header with the payload's length
//! and SHA-256, so that a truncated or corrupted one is detected before anything is loaded
//! and never read as garbage. The newest is `checkpoint.bin`; the one before it stays as
//! `checkpoint.prev.bin`, to fall back to when the newest is damaged.

use super::RecordError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

pub(crate) const CHECKPOINT: &str = "checkpoint.bin";
pub(crate) const PREVIOUS: &str = "checkpoint.prev.bin";
const MAGIC: &[u8; 8] = b"THRONGCK";
/// Bumped when the payload's layout changes; an older checkpoint is refused by name.
const FORMAT: u32 = 2;
const HEADER: usize = 8 + 4 + 8 + 32;

/// Writes `value` as the newest checkpoint in `dir`, keeping the last one as the previous.
/// A crash at any point leaves a readable newest or previous checkpoint.
pub fn write<T: Serialize>(dir: &Path, value: &T) -> Result<(), RecordError> {
    let path = dir.join(CHECKPOINT);
    let payload = postcard::to_stdvec(value).map_err(|e| RecordError::format(&path, e))?;
    let tmp = dir.join("checkpoint.bin.tmp");
    {
        let mut file = std::fs::File::create(&tmp).map_err(|e| RecordError::io(&tmp, e))?;
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT.to_le_bytes());
        header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        header.extend_from_slice(&Sha256::digest(&payload));
        file.write_all(&header)
            .and_then(|_| file.write_all(&payload))
            .and_then(|_| file.sync_all())
            .map_err(|e| RecordError::io(&tmp, e))?;
    }
    if path.exists() {
        std::fs::rename(&path, dir.join(PREVIOUS)).map_err(|e| RecordError::io(&path, e))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| RecordError::io(&path, e))
}

/// Why a checkpoint file cannot be used.
#[derive(Debug, thiserror::Error)]
enum Damage {
    #[error("not a throng checkpoint (no header)")]
    NoHeader,
    #[error(
        "checkpoint format {0}, this throng reads format {FORMAT}: resume it with the throng version that wrote it"
    )]
    Format(u32),
    #[error("truncated: {found} of {expected} payload bytes")]
    Truncated { found: usize, expected: usize },
    #[error("corrupt: its checksum does not match")]
    Checksum,
    /// Whole and checksummed, yet not the layout this build reads.
    #[error("{0}")]
    Payload(#[from] postcard::Error),
}

fn check(bytes: &[u8]) -> Result<&[u8], Damage> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(Damage::NoHeader);
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(Damage::Format(format));
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes")) as usize;
    let payload = &bytes[HEADER..];
    if payload.len() != len {
        return Err(Damage::Truncated {
            found: payload.len(),
            expected: len,
        });
    }
    if Sha256::digest(payload).as_slice() != &bytes[20..52] {
        return Err(Damage::Checksum);
    }
    Ok(payload)
}

/// A checkpoint read back, and what had to be skipped to get it.
#[derive(Debug)]
pub struct Loaded<T> {
    pub value: T,
    pub path: PathBuf,
    /// Set when the newest checkpoint was damaged and the previous one was used.
    pub warning: Option<String>,
}

/// The newest usable checkpoint in `dir`: `checkpoint.bin`, else (with a warning)
/// `checkpoint.prev.bin`. `Ok(None)` when the folder has none at all.
pub fn read<T: DeserializeOwned>(dir: &Path) -> Result<Option<Loaded<T>>, RecordError> {
    let mut problems = Vec::new();
    for name in [CHECKPOINT, PREVIOUS] {
        let path = dir.join(name);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(RecordError::io(&path, e)),
        };
        match check(&bytes).and_then(|p| Ok(postcard::from_bytes::<T>(p)?)) {
            Ok(value) => {
                let warning = (!problems.is_empty()).then(|| {
                    format!(
                        "{}; resuming from the previous checkpoint {}",
                        problems.join("; "),
                        path.display()
                    )
                });
                return Ok(Some(Loaded {
                    value,
                    path,
                    warning,
                }));
            }
            Err(problem) => problems.push(format!("{}: {problem}", path.display())),
        }
    }
    if problems.is_empty() {
        Ok(None)
    } else {
        Err(RecordError::Format {
            path: dir.join(CHECKPOINT),
            message: format!("no usable checkpoint: {}", problems.join("; ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_floats_exactly_and_falls_back_past_damage() {
        let dir = tempfile::tempdir().unwrap();
        let a = vec![995.0647041673974_f64, 0.1 + 0.2, f64::MIN_POSITIVE];
        write(dir.path(), &a).unwrap();
        let b = vec![1.0_f64];
        write(dir.path(), &b).unwrap();
        let got: Loaded<Vec<f64>> = read(dir.path()).unwrap().unwrap();
        assert_eq!((got.value, got.warning), (b, None));
        // Truncate the newest: the previous one is used, with a warning naming the damage.
        let newest = dir.path().join(CHECKPOINT);
        let len = std::fs::metadata(&newest).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&newest)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let got: Loaded<Vec<f64>> = read(dir.path()).unwrap().unwrap();
        assert_eq!(got.value, a);
        assert!(got.warning.unwrap().contains("truncated"));
        // Corrupt both: refused, never garbage.
        let mut bytes = std::fs::read(dir.path().join(PREVIOUS)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(dir.path().join(PREVIOUS), bytes).unwrap();
        let err = read::<Vec<f64>>(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("checksum") && err.contains("truncated"),
            "{err}"
        );
    }
}
