//! Opening the files of a model: regular files only, opened so that nothing can block.
//!
//! A named pipe (FIFO) where `config.json` should be made `throng generate` wait forever in
//! `open(2)`; a folder named `model.safetensors` was reported as a missing shard. Every file
//! of a model is opened here with `O_NONBLOCK` (which a FIFO honours at open, and a regular
//! file ignores), and the opened file's own metadata decides: a regular file is read, anything
//! else is refused by name and kind.

use super::ModelError;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Opens `path` for reading when it is a regular file (or a symbolic link to one): a FIFO,
/// a folder, a socket or a device is refused with [`ModelError::NotARegularModelFile`], and a
/// missing file is an [`ModelError::Io`] of kind `NotFound`.
pub(crate) fn open_regular(path: &Path) -> Result<File, ModelError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| ModelError::io(path, e))?;
    // The opened file's metadata, not the path's: nothing can be swapped in between.
    let meta = file.metadata().map_err(|e| ModelError::io(path, e))?;
    if !meta.is_file() {
        return Err(ModelError::NotARegularModelFile {
            path: path.to_path_buf(),
            kind: file_kind(&meta.file_type()),
        });
    }
    Ok(file)
}

/// The bytes of the regular file `path` (see [`open_regular`]).
pub(crate) fn read_regular(path: &Path) -> Result<Vec<u8>, ModelError> {
    let mut bytes = Vec::new();
    open_regular(path)?
        .read_to_end(&mut bytes)
        .map_err(|e| ModelError::io(path, e))?;
    Ok(bytes)
}

/// The text of the regular file `path` (see [`open_regular`]).
pub(crate) fn read_regular_text(path: &Path) -> Result<String, ModelError> {
    String::from_utf8(read_regular(path)?).map_err(|e| {
        ModelError::corrupt(
            path,
            format!(
                "not UTF-8 text (byte {} is not): the file is damaged, download it again",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// The text of the optional file `path`: `None` when nothing is there; an error when
/// something is there that is not a readable regular file.
pub(crate) fn read_optional_text(path: &Path) -> Result<Option<String>, ModelError> {
    match read_regular_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(ModelError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether `e` says that the file is not there.
pub(crate) fn is_not_found(e: &ModelError) -> bool {
    matches!(e, ModelError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// What kind of file system entry a file that is not a regular file is.
pub(crate) fn file_kind(kind: &std::fs::FileType) -> String {
    if kind.is_dir() {
        return "a folder".into();
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a named pipe (FIFO)".into();
        }
        if kind.is_socket() {
            return "a socket".into();
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device".into();
        }
    }
    "not a regular file".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_and_a_folder_is_refused_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_regular_text(&file).unwrap(), "{}");
        let err = read_regular_text(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is a folder, not a regular file"), "{err}");
        assert_eq!(
            read_optional_text(&dir.path().join("absent.json")).unwrap(),
            None
        );
    }

    // A FIFO named config.json made the loader wait forever in open(2).
    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the entry.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_optional_text(&fifo).unwrap_err().to_string();
        assert!(
            err.contains("config.json") && err.contains("named pipe (FIFO)"),
            "{err}"
        );
    }
}
