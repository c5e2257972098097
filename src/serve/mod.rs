//! `throng serve`: a web view of run folders, live while they are written, with guarded
//! controls (pause, resume, delete).
//!
//! The server only reads run folders, as `throng report` does, so it follows runs of this
//! process (`throng run --serve`), of other processes, and of other machines on a shared file
//! system alike. Runs are addressed by an id the index gives them; no path a client sends ever
//! reaches the file system. Pages and their chart library are compiled into the binary.
//!
//! - [`folders`]: finding run folders under a root, their ids, and one line per run.
//! - [`detail`]: one run's page data: its steps, panels, ranks, report files and records.
//! - [`panels`]: each measure's lines over the steps, by arm, replicate and group level.
//! - [`log`]: the decision log searched by step and read a page at a time.
//! - [`decisions`]: a page of a step's decisions, filtered, and the prompts kept.
//! - [`replay`]: one step of a run's state and aggregates, as summaries.
//! - [`files`]: the report files and records served, and the policy they are served under.
//! - [`control`]: pause (the SIGTERM path), resume (a child `throng run --resume`), delete.
//! - [`access`]: who may ask: the Host header and the token.
//! - [`http`]: the routes and the binding rules; `json_error`: the body of a refusal.

pub mod access;
mod assets;
pub mod connections;
pub mod control;
pub mod decisions;
pub mod detail;
pub mod files;
pub mod folders;
pub mod http;
mod json_error;
pub mod log;
pub mod panels;
pub mod replay;

pub use http::{ServeError, ServeOptions, Server, listen};
