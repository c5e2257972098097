//! What the server may do to a run: pause it (the SIGTERM path: the step finishes, a
//! checkpoint is written, the run exits resumable), resume it (a child `throng run --resume`,
//! whose output the page shows), delete it (finished or failed, once its folder's name is
//! confirmed).

use super::folders::{Read, RunStatus, Writer};
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Lines of a child's output kept for the page.
const KEPT_LINES: usize = 400;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("the run is {0:?}, not running on this machine: only a running run can be paused")]
    NotRunning(RunStatus),
    #[error(
        "the run is {0:?}: only a paused, interrupted or failed run can be resumed, and only once at a time"
    )]
    NotResumable(RunStatus),
    #[error(
        "the run is {0:?}: only a finished or failed run that nobody is writing can be deleted"
    )]
    NotDeletable(RunStatus),
    #[error(
        "to delete the run, confirm with the name of its folder, {expected:?} (the config's name is every run's of that config)"
    )]
    Unconfirmed { expected: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Sends the run's writer SIGTERM: it finishes its step, writes a checkpoint and exits
/// paused, as when its terminal gets Ctrl-C. Only the process that holds the run's lock is
/// signalled, never one that merely has the pid a killed run's lock file names.
pub fn pause(read: &Read) -> Result<(), ControlError> {
    let status = read.status();
    let (RunStatus::Running, Writer::Here(pid)) = (status, read.writer) else {
        return Err(ControlError::NotRunning(status));
    };
    signal_writer(&read.dir, pid)
}

/// SIGTERM to `pid` while it holds the lock of `dir`. A handle on the process is taken first
/// and the lock tried after: if the holder is still `pid` then, the handle is the holder's
/// (a pid is given to a new process only once its old one ended, and a handle on an ended
/// process reaches nothing).
#[cfg(unix)]
fn signal_writer(dir: &std::path::Path, pid: u32) -> Result<(), ControlError> {
    let gone = || ControlError::NotRunning(RunStatus::Interrupted);
    let pid_t = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(gone)?;
    let target = Target::of(pid_t).map_err(|_| gone())?;
    match crate::record::holder(dir) {
        Ok(Some(h)) if h.pid == Some(pid) => {}
        _ => return Err(gone()),
    }
    match target.terminate() {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(gone()),
        Err(source) => Err(ControlError::Io {
            what: format!("signalling pid {pid}"),
            source,
        }),
    }
}

/// A process to signal: through a handle (a pidfd) where the kernel gives them (Linux 5.3
/// on), else by its pid.
#[cfg(unix)]
enum Target {
    #[cfg(target_os = "linux")]
    Handle(std::os::fd::OwnedFd),
    Pid(libc::pid_t),
}

#[cfg(unix)]
impl Target {
    fn of(pid: libc::pid_t) -> std::io::Result<Self> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::FromRawFd;
            // SAFETY: pidfd_open(2) takes a pid and flags, and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if fd >= 0 {
                // SAFETY: a descriptor the kernel just opened for this process alone.
                return Ok(Target::Handle(unsafe {
                    std::os::fd::OwnedFd::from_raw_fd(fd as i32)
                }));
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Err(e);
            }
            // No pidfds in this kernel: the lock, then the pid.
        }
        Ok(Target::Pid(pid))
    }

    fn terminate(&self) -> std::io::Result<()> {
        let sent = match self {
            #[cfg(target_os = "linux")]
            Target::Handle(fd) => {
                use std::os::fd::AsRawFd;
                // SAFETY: pidfd_send_signal(2) with a descriptor this value owns, no siginfo.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGTERM,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                }
            }
            // SAFETY: kill(2) with the pid of the process that held the lock just now.
            Target::Pid(pid) => libc::c_long::from(unsafe { libc::kill(*pid, libc::SIGTERM) }),
        };
        if sent == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

#[cfg(not(unix))]
fn signal_writer(_dir: &std::path::Path, _pid: u32) -> Result<(), ControlError> {
    Err(ControlError::Io {
        what: "pausing".into(),
        source: std::io::Error::other("pausing needs signals (Unix)"),
    })
}

/// A child `throng run --resume`, as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ChildView {
    pub running: bool,
    pub output: Vec<String>,
    pub exit: Option<i32>,
}

/// A resume the server started, shared with the threads that read its output.
#[derive(Debug, Default)]
pub struct Child {
    state: Mutex<ChildState>,
}

#[derive(Debug, Default)]
struct ChildState {
    running: bool,
    output: VecDeque<String>,
    exit: Option<i32>,
}

impl Child {
    pub fn view(&self) -> ChildView {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        ChildView {
            running: s.running,
            output: s.output.iter().cloned().collect(),
            exit: s.exit,
        }
    }

    pub fn running(&self) -> bool {
        self.state.lock().map(|s| s.running).unwrap_or(false)
    }

    fn push(&self, line: String) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.output.len() == KEPT_LINES {
            s.output.pop_front();
        }
        s.output.push_back(line);
    }
}

/// Starts `exe run --resume DIR` for a paused, interrupted or failed run; its output lines
/// go into the returned [`Child`] as they come.
pub fn resume(read: &Read, exe: &Path, running: bool) -> Result<Arc<Child>, ControlError> {
    let status = read.status();
    if running
        || !matches!(
            status,
            RunStatus::Paused | RunStatus::Interrupted | RunStatus::Failed
        )
    {
        return Err(ControlError::NotResumable(status));
    }
    let mut child = Command::new(exe)
        .arg("run")
        .arg("--resume")
        .arg(&read.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ControlError::Io {
            what: format!("starting {} run --resume", exe.display()),
            source,
        })?;
    let shared = Arc::new(Child::default());
    shared
        .state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .running = true;
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            // Progress bars redraw with carriage returns: each redraw is a line here.
            for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                for part in String::from_utf8_lossy(&line).split('\r') {
                    if !part.trim().is_empty() {
                        shared.push(part.to_string());
                    }
                }
            }
        })
    })
    .collect();
    let waiter = Arc::clone(&shared);
    std::thread::spawn(move || {
        let status = child.wait();
        for r in readers {
            let _ = r.join();
        }
        let mut s = waiter.state.lock().unwrap_or_else(|p| p.into_inner());
        s.running = false;
        s.exit = status.ok().and_then(|s| s.code());
    });
    Ok(shared)
}

/// Deletes a finished or failed run that nobody writes, once `confirm` is its folder's name
/// (runs of one config share the config's name; their folders' names tell them apart).
pub fn delete(read: &Read, confirm: &str, child_running: bool) -> Result<PathBuf, ControlError> {
    let status = read.status();
    if child_running
        || read.writer != Writer::None
        || !matches!(status, RunStatus::Finished | RunStatus::Failed)
    {
        return Err(ControlError::NotDeletable(status));
    }
    let name = read.folder();
    if confirm != name || name.is_empty() {
        return Err(ControlError::Unconfirmed { expected: name });
    }
    std::fs::remove_dir_all(&read.dir).map_err(|source| ControlError::Io {
        what: format!("deleting {}", read.dir.display()),
        source,
    })?;
    Ok(read.dir.clone())
}
