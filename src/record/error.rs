//! What can go wrong reading or writing a run folder.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
}

impl RecordError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        RecordError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn format(path: &Path, message: impl ToString) -> Self {
        RecordError::Format {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}

/// For tests of a full disk without one: `THRONG_FULL_DISK_AT=POINT` makes a new run's first
/// write at `POINT` (`manifest`, `config`) fail as a full disk does, leaving the file it was
/// writing empty. Does nothing otherwise.
pub fn full_disk_at(point: &str, path: &Path) -> Result<(), RecordError> {
    if std::env::var("THRONG_FULL_DISK_AT").is_ok_and(|p| p == point) {
        let _ = std::fs::File::create(path);
        // ENOSPC, as the kernel reports a full disk.
        return Err(RecordError::io(path, std::io::Error::from_raw_os_error(28)));
    }
    Ok(())
}
