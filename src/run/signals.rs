//! Signals and panics during a run: a Ctrl-C or SIGTERM pauses it after the current step (or
//! at once), and a panic out of the scenario's code marks it failed (or paused) before it
//! goes on to the caller.

use crate::host::Program;
use crate::record::{self, Manifest, Status};
use crate::sim::scenario::Halt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Ctrl-C, and the SIGTERM a batch system sends before a job's time limit: finish the step,
/// checkpoint, exit 0. A second signal, or a step still running `timeout` after the first
/// (a step that cannot finish), stops the run at once: the run in `dir` is marked paused,
/// its records end at the last checkpoint, and the process exits 130. Ranks other than 0
/// wait a little longer, so that rank 0 stops (and marks the folder) first.
pub(crate) fn stop_on_signal(
    rank: usize,
    dir: &Path,
    timeout: Duration,
    program: Program,
) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let dir = dir.to_path_buf();
    let installed = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            stop_at_once(rank, &dir, "a second signal", &program);
        }
        eprintln!(
            "\nthrong: rank {rank}: stopping after the current step; send the signal again, or \
             wait {} s, to stop at once",
            timeout.as_secs()
        );
        let dir = dir.clone();
        let program = program.clone();
        let wait = match rank {
            0 => timeout,
            _ => timeout.saturating_add(Duration::from_secs(10)),
        };
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            let why = format!(
                "the step did not finish within {} s of the signal",
                timeout.as_secs()
            );
            stop_at_once(rank, &dir, &why, &program);
        });
    });
    if let Err(e) = installed {
        eprintln!("throng: warning: cannot catch Ctrl-C/SIGTERM ({e}); a signal will kill the run");
    }
    stop
}

/// Ends the process in the middle of a step, leaving the run in `dir` paused (see
/// [`stop_on_signal`]).
fn stop_at_once(rank: usize, dir: &Path, why: &str, program: &Program) -> ! {
    let resume = program.resume_command(dir);
    match record::pause_at_once(dir) {
        Ok(m) if m.status == Status::Finished => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the run had finished, but its report \
             was not written: {}",
            program.report_command(dir)
        ),
        Ok(_) => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the step in progress is lost, the \
             steps before it are kept (the run is paused at its last checkpoint); resume with: \
             {resume}"
        ),
        Err(e) => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the run could not be marked paused \
             ({e}), but its records end at the last checkpoint; resume with: {resume}"
        ),
    }
    std::process::exit(130);
}

/// Ends a run that a panic stopped: a [`Halt`] from the scenario's code, or a bug's. Rank 0
/// marks the run failed in its manifest with the panic's message (paused, resumable, after a
/// Ctrl-C that landed in the scenario's code), so that the manifest does not say `running`;
/// then the panic goes on to whoever called the run, a [`Halt`] with the run's folder set.
pub(crate) fn halted(root: bool, dir: &Path, mut payload: Box<dyn std::any::Any + Send>) -> ! {
    let (message, interrupted) = if let Some(halt) = payload.downcast_mut::<Halt>() {
        halt.dir = Some(dir.to_path_buf());
        (halt.message.clone(), halt.interrupted)
    } else {
        let what = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        (
            format!("throng failed inside the run ({what}); please report this"),
            false,
        )
    };
    if root {
        let path = dir.join(record::MANIFEST);
        let marked = record::read_json::<Manifest>(&path).and_then(|mut manifest| {
            if interrupted {
                manifest.status = Status::Paused;
            } else {
                manifest.status = Status::Failed;
                manifest.error = Some(message);
            }
            record::write_json_atomic(&path, &manifest)
        });
        if let Err(e) = marked {
            eprintln!(
                "throng: warning: the stopped run could not be marked so in its manifest: {e}"
            );
        }
    }
    std::panic::resume_unwind(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run folder holding a manifest that says `running`.
    fn running() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let manifest = Manifest {
            status: Status::Running,
            steps_done: 3,
            ..Manifest::default()
        };
        record::write_json_atomic(&dir.path().join(record::MANIFEST), &manifest).unwrap();
        dir
    }

    fn halt(interrupted: bool) -> Box<dyn std::any::Any + Send> {
        Box::new(Halt {
            message: "the scenario's `resolve` raised KeyError: 'pot'".into(),
            interrupted,
            detail: Box::new(42u32),
            dir: None,
        })
    }

    // Guards against a run stopped by its scenario's exception left `running` with no word of
    // why, and against the embedding program losing its exception or the run's folder.
    #[test]
    fn a_halted_run_is_marked_failed_and_the_halt_goes_on_with_its_folder() {
        let dir = running();
        let payload = std::panic::catch_unwind(|| halted(true, dir.path(), halt(false)))
            .expect_err("halted unwinds");
        let halt = payload
            .downcast::<Halt>()
            .expect("the same payload goes on");
        assert_eq!(halt.dir.as_deref(), Some(dir.path()));
        assert_eq!(*halt.detail.downcast::<u32>().unwrap(), 42);
        let manifest: Manifest = record::read_json(&dir.path().join(record::MANIFEST)).unwrap();
        assert_eq!(manifest.status, Status::Failed);
        assert_eq!(manifest.steps_done, 3);
        assert!(manifest.error.unwrap().contains("raised KeyError: 'pot'"));
    }

    // Guards against a Ctrl-C in the scenario's code leaving the run `running` (or calling it
    // failed): it resumes from its last checkpoint like any paused run.
    #[test]
    fn a_run_halted_by_a_ctrl_c_is_marked_paused() {
        let dir = running();
        let _ = std::panic::catch_unwind(|| halted(true, dir.path(), halt(true)));
        let manifest: Manifest = record::read_json(&dir.path().join(record::MANIFEST)).unwrap();
        assert_eq!((manifest.status, manifest.error), (Status::Paused, None));
    }

    // Guards against a bug's panic in a run leaving its manifest `running`.
    #[test]
    fn a_run_stopped_by_a_panic_is_marked_failed_with_its_message() {
        let dir = running();
        let payload: Box<dyn std::any::Any + Send> = Box::new(String::from("index out of bounds"));
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            halted(true, dir.path(), payload)
        }));
        let manifest: Manifest = record::read_json(&dir.path().join(record::MANIFEST)).unwrap();
        assert_eq!(manifest.status, Status::Failed);
        assert!(manifest.error.unwrap().contains("index out of bounds"));
    }
}
