//! What the server may do to a run: pause it (the SIGTERM path: the step finishes, a
//! checkpoint is written, the run exits resumable), resume it (a child `throng run --resume`,
//! whose output the page shows), delete it (finished or failed, once its name is confirmed).

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
    #[error("to delete the run, confirm with its name, {expected:?}")]
    Unconfirmed { expected: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Sends the run's writer SIGTERM: it finishes its step, writes a checkpoint and exits
/// paused, as when its terminal gets Ctrl-C.
pub fn pause(read: &Read) -> Result<(), ControlError> {
    let status = read.status();
    let (RunStatus::Running, Writer::Here(pid)) = (status, read.writer) else {
        return Err(ControlError::NotRunning(status));
    };
    signal_term(pid).map_err(|source| ControlError::Io {
        what: format!("signalling pid {pid}"),
        source,
    })
}

#[cfg(unix)]
fn signal_term(pid: u32) -> std::io::Result<()> {
    let pid = i32::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) with a pid read from the run's lock, checked alive just before.
    if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn signal_term(_pid: u32) -> std::io::Result<()> {
    Err(std::io::Error::other("pausing needs signals (Unix)"))
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

/// Deletes a finished or failed run that nobody writes, once `confirm` is its name.
pub fn delete(read: &Read, confirm: &str, child_running: bool) -> Result<PathBuf, ControlError> {
    let status = read.status();
    if child_running
        || read.writer != Writer::None
        || !matches!(status, RunStatus::Finished | RunStatus::Failed)
    {
        return Err(ControlError::NotDeletable(status));
    }
    let name = read
        .manifest
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    if confirm != name || name.is_empty() {
        return Err(ControlError::Unconfirmed { expected: name });
    }
    std::fs::remove_dir_all(&read.dir).map_err(|source| ControlError::Io {
        what: format!("deleting {}", read.dir.display()),
        source,
    })?;
    Ok(read.dir.clone())
}
