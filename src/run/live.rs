//! `throng run --serve`: the live page of the run, served while this process runs it.

use super::error::{Context, RunError};
use crate::serve::{ServeOptions, Server};
use std::path::{Path, PathBuf};

/// The address a run's live page is served at when none is given.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8787";

/// Serves the page of the run in `dir`, and nothing beside it, from a thread of its own while
/// this process runs it.
pub(crate) fn serve_run(
    dir: &Path,
    listener: std::net::TcpListener,
    public: bool,
) -> Result<(), RunError> {
    let addr = listener.local_addr()?;
    // The run's id is the one `throng serve` of its parent folder gives it.
    let root = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let exe = std::env::current_exe().context("finding the throng binary, which a resume runs")?;
    let server = Server::on(
        listener,
        ServeOptions {
            root,
            only: Some(dir.to_path_buf()),
            addr,
            public,
            allowed_hosts: Vec::new(),
            read_only: false,
            token: None,
            exe,
        },
    )?;
    eprintln!(
        "throng: this run's live page (it stops with the run; `throng serve` shows it after):\n  {}",
        server.run_url(dir)
    );
    std::thread::Builder::new()
        .name("throng-serve".into())
        .spawn(move || {
            if let Err(e) = server.serve_until(std::future::pending()) {
                eprintln!("throng: the live page stopped: {e}");
            }
        })
        .context("starting the live page's thread")?;
    Ok(())
}
