//! `throng api`: the engine behind an OpenAI-compatible API (see [`crate::api`]).

use super::ModelArgs;
use crate::api::{ApiOptions, ApiServer, Served};
use crate::engine::EngineHandle;
use anyhow::Result;
use std::net::SocketAddr;

/// The address served when none is given.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8000";

#[derive(clap::Args, Clone, Debug)]
pub struct ApiArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The name requests give as `model` (default: what --model says).
    #[arg(long)]
    pub served_name: Option<String>,
    /// Where to listen; port 0 picks a free one.
    #[arg(long, default_value = DEFAULT_ADDR)]
    pub addr: SocketAddr,
    /// Allow an address other machines can reach (needs --api-key).
    #[arg(long)]
    pub public: bool,
    /// The key clients send (`api_key=`; default: the environment's THRONG_API_KEY, else a
    /// random one, printed).
    #[arg(long)]
    pub api_key: Option<String>,
    /// A name the server is reached by (with --public), besides this machine's.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_host: Vec<String>,
    /// Sequences admitted (running or waiting) before a request is answered 429 with
    /// Retry-After (default: 4 times --max-seqs).
    #[arg(long, value_parser = super::numbers::at_least_one())]
    pub queue: Option<usize>,
    /// The most tokens a reply may have, and what a request without max_tokens gets.
    #[arg(long, default_value_t = 4096, value_parser = super::numbers::at_least_one())]
    pub max_tokens: usize,
}

pub fn run(args: ApiArgs) -> Result<()> {
    let (engine, described) = args.model.load_engine_described()?;
    let (handle, _thread) = EngineHandle::spawn(engine);
    let name = args
        .served_name
        .clone()
        .unwrap_or_else(|| args.model.model.clone());
    let server = ApiServer::bind(
        ApiOptions {
            addr: args.addr,
            public: args.public,
            key: args
                .api_key
                .clone()
                .or_else(|| std::env::var("THRONG_API_KEY").ok())
                .filter(|k| !k.is_empty()),
            allowed_hosts: args.allow_host.clone(),
            queue: args.queue.unwrap_or(4 * args.model.max_seqs),
            max_tokens: args.max_tokens,
        },
        vec![Served {
            name: name.clone(),
            handle,
            max_seqs: args.model.max_seqs,
        }],
    )?;
    out!(
        "throng api: {name} ({described}) at\n  base_url={}\n  api_key={}\n(Ctrl-C stops the server)",
        server.base_url(),
        server.key()
    )?;
    server.serve()?;
    Ok(())
}
