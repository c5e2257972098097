//! `throng serve`: the live pages of run folders.

use crate::serve::{ServeOptions, Server};
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The address served when none is given.
pub const DEFAULT_ADDR: &str = crate::run::DEFAULT_LIVE_ADDR;

#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// The folder whose run folders are listed (they may be written by other processes, or
    /// other machines on a shared file system).
    #[arg(default_value = "runs")]
    pub dir: PathBuf,
    /// Where to listen; port 0 picks a free one.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: SocketAddr,
    /// Allow an address other machines can reach (every request still needs the token).
    #[arg(long)]
    pub public: bool,
    /// A name the server is reached by (with --public), besides this machine's: requests
    /// naming any other host are refused, as a page of another site would send them.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_host: Vec<String>,
    /// No controls: pages only.
    #[arg(long)]
    pub read_only: bool,
}

fn exe() -> Result<PathBuf> {
    std::env::current_exe().context("finding the throng binary, which a resume runs")
}

pub fn run(args: ServeArgs) -> Result<()> {
    let server = Server::bind(ServeOptions {
        root: args.dir.clone(),
        only: None,
        addr: args.addr,
        public: args.public,
        allowed_hosts: args.allow_host.clone(),
        read_only: args.read_only,
        token: None,
        exe: exe()?,
    })?;
    out!(
        "throng serve: the runs under {} at\n  {}\n{}(Ctrl-C stops the server, not the runs)",
        args.dir.display(),
        server.url(),
        if args.read_only {
            "Every page needs the token in that address; read-only: no controls. "
        } else {
            "Every page and control (pause, resume, delete) needs the token in that address. "
        }
    )?;
    server.serve()?;
    Ok(())
}
