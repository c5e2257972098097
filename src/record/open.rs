//! Opening a run folder's files to read them, as every watcher of run folders must: regular
//! files only, never through a symbolic link, and never waiting. A run folder may hold anything
//! its owner (or anyone who can write it) put there: a link to a file outside it would be read
//! and served as the run's, and a FIFO would block an open, and the thread that made it,
//! until something writes into it.

use std::fs::File;
use std::io;
use std::path::{Component, Path};

/// Opens `name` (a path inside `dir`, such as `figures/fig1.svg`) for reading. Every part of
/// `name` is opened without following a link, and the file must be a regular one: a link, a
/// FIFO, a device or a folder is refused with an error that says so. `dir` itself is opened
/// as given.
pub fn regular(dir: &Path, name: &str) -> io::Result<File> {
    let parts: Vec<&std::ffi::OsStr> = Path::new(name)
        .components()
        .map(|c| match c {
            Component::Normal(part) => Ok(part),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is not a plain path inside the run folder"),
            )),
        })
        .collect::<io::Result<_>>()?;
    if parts.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file named"));
    }
    let file = open_parts(dir, &parts, name)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name} is not a regular file (a FIFO, a device or a folder): a run folder's \
                 records are plain files, so it is not read; remove it"
            ),
        ));
    }
    Ok(file)
}

fn link(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{name} is reached through a symbolic link: a run folder's files are read from \
             inside it only; put the file itself there"
        ),
    )
}

#[cfg(unix)]
fn open_parts(dir: &Path, parts: &[&std::ffi::OsStr], name: &str) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let mut at = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for (i, part) in parts.iter().enumerate() {
        // NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; on a
        // regular file it changes nothing.
        let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        if i + 1 < parts.len() {
            flags |= OFlags::DIRECTORY;
        }
        at = match rustix::fs::openat(&at, *part, flags, Mode::empty()) {
            Ok(fd) => fd,
            // A link where NOFOLLOW was asked: ELOOP (or ENOTDIR for a link to a folder).
            Err(e) if e == rustix::io::Errno::LOOP => return Err(link(name)),
            Err(e) if e == rustix::io::Errno::NOTDIR => {
                let so_far: std::path::PathBuf = parts[..=i].iter().collect();
                let is_link = std::fs::symlink_metadata(dir.join(&so_far))
                    .is_ok_and(|m| m.file_type().is_symlink());
                return Err(if is_link { link(name) } else { e.into() });
            }
            Err(e) => return Err(e.into()),
        };
    }
    Ok(File::from(at))
}

#[cfg(not(unix))]
fn open_parts(dir: &Path, parts: &[&std::ffi::OsStr], name: &str) -> io::Result<File> {
    let mut path = dir.to_path_buf();
    for part in parts {
        path.push(part);
        if std::fs::symlink_metadata(&path)?.file_type().is_symlink() {
            return Err(link(name));
        }
    }
    File::open(path)
}

/// The whole of `name` in `dir` (see [`regular`]), at most `most` bytes of it: a file larger
/// than that is refused rather than read into memory.
pub fn read(dir: &Path, name: &str, most: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let file = regular(dir, name)?;
    let len = file.metadata()?.len();
    if len > most {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is {len} bytes, more than the {most} read whole"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(most).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_fifos_and_folders_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir_all(dir.join("figures")).unwrap();
        std::fs::write(dir.join("figures/a.svg"), "svg").unwrap();
        std::fs::write(tmp.path().join("outside.txt"), "outside").unwrap();
        assert_eq!(read(&dir, "figures/a.svg", 100).unwrap(), b"svg");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(tmp.path().join("outside.txt"), dir.join("l.txt")).unwrap();
            std::os::unix::fs::symlink(tmp.path(), dir.join("up")).unwrap();
            for name in ["l.txt", "up/outside.txt"] {
                let e = regular(&dir, name).unwrap_err().to_string();
                assert!(e.contains("symbolic link"), "{name}: {e}");
            }
            let fifo =
                std::ffi::CString::new(dir.join("p").as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
            let e = regular(&dir, "p").unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{e}");
        }
        let e = regular(&dir, "figures").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        for name in ["../outside.txt", "/etc/passwd", ""] {
            assert!(regular(&dir, name).is_err(), "{name}");
        }
        assert!(read(&dir, "figures/a.svg", 2).is_err());
    }
}
