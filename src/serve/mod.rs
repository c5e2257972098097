//! `throng serve`: a web view of run folders, live while they are written, with guarded
//! controls (pause, resume, delete).
//!
//! The server only reads run folders, as `throng report` does, so it follows runs of this
//! process (`throng run --serve`), of other processes, and of other machines on a shared file
//! system alike. Runs are addressed by an id the index gives them; no path a client sends ever
//! reaches the file system. Pages and their chart library are compiled into the binary.
//!
//! - [`folders`]: finding run folders under a root, their ids, and one line per run.
//! - [`detail`]: one run's page data: its steps, headline series, ranks and report files.
//! - [`decisions`]: the sampled decision log of a step, filtered, and the prompts kept.
//! - [`replay`]: one step of a run's state and aggregates, as summaries.
//! - [`control`]: pause (the SIGTERM path), resume (a child `throng run --resume`), delete.
//! - [`http`]: the routes, the token, and the binding rules.

mod assets;
pub mod control;
pub mod decisions;
pub mod detail;
pub mod folders;
pub mod http;
pub mod replay;

pub use http::{ServeError, ServeOptions, Server};
