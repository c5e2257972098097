//! `throng api`: the engine behind an OpenAI-compatible API (see [`crate::api`]).

use super::{EngineArgs, ModelArgs};
use crate::api::{ApiOptions, ApiServer, ConnectionLimits, Served};
use crate::engine::EngineHandle;
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;

/// The address served when none is given.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8000";

#[derive(clap::Args, Clone, Debug)]
pub struct ApiArgs {
    /// A model to serve: a preset (`throng models`), a model folder, a GGUF file or a Hugging
    /// Face repo id. Repeat it to serve several, each with its own engine (the KV memory split
    /// evenly); a request's `model` chooses.
    #[arg(long = "model", default_value = crate::model::DEFAULT_MODEL)]
    pub models: Vec<String>,
    /// The name requests give as `model`, one per --model in order (default: what --model
    /// says).
    #[arg(long = "served-name", value_name = "NAME")]
    pub served_names: Vec<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
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
    /// Keep every reply in a decision store in this folder (created; or one an earlier
    /// `throng api --store` wrote, added to), for a later `--reuse`.
    #[arg(long, value_name = "DIR")]
    pub store: Option<std::path::PathBuf>,
    /// Answer a request whose complete input an earlier run or server (its folder) already
    /// answered with that reply, without the model; repeatable.
    #[arg(long, value_name = "DIR")]
    pub reuse: Vec<std::path::PathBuf>,
    /// Close a connection that sends no complete request head for this long: idle between
    /// requests, silent, or sending its headers too slowly. In seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: u64,
    /// Connections held at once (fewer where the open-file limit leaves less room); at the
    /// cap a new connection takes the place of the one idle longest.
    #[arg(long, default_value_t = 1024, value_parser = super::numbers::at_least_one())]
    pub max_connections: usize,
}

pub fn run(args: ApiArgs) -> Result<()> {
    if !args.served_names.is_empty() && args.served_names.len() != args.models.len() {
        bail!(
            "--served-name is given {} times for {} --model: give one name per model, in order",
            args.served_names.len(),
            args.models.len()
        );
    }
    // Several engines on one device share its KV memory evenly.
    let kv_memory = match (args.engine.kv_memory, args.models.len()) {
        (kv, 1) => kv,
        (total, n) => {
            let total = match total {
                Some(b) => b.as_u64(),
                None => {
                    let device = crate::run::parse_device(&args.engine.device)?;
                    crate::engine::default_kv_memory(&device) as u64
                }
            };
            Some(bytesize::ByteSize(
                crate::run::kv_shares(total, &vec![1; n])[0],
            ))
        }
    };
    let mut served = Vec::with_capacity(args.models.len());
    let mut described = Vec::new();
    for (i, model) in args.models.iter().enumerate() {
        let settings = ModelArgs {
            model: model.clone(),
            engine: EngineArgs {
                kv_memory,
                ..args.engine.clone()
            },
        };
        let (engine, weights) = settings
            .settings()
            .load_engine_described()
            .with_context(|| format!("--model {model}"))?;
        let encoder = engine.prompt_encoder().clone();
        let (handle, _thread) = EngineHandle::spawn(engine);
        let name = args.served_names.get(i).unwrap_or(model).clone();
        described.push(format!("  {name}: {model} ({weights})"));
        served.push(Served {
            name,
            handle,
            encoder,
            max_seqs: args.engine.max_seqs,
        });
    }
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
            queue: args
                .queue
                .unwrap_or(4 * args.engine.max_seqs * args.models.len()),
            max_tokens: args.max_tokens,
            store: args.store.clone(),
            reuse: args.reuse.clone(),
            connections: ConnectionLimits {
                idle_timeout: std::time::Duration::from_secs(args.idle_timeout),
                max_connections: args.max_connections,
            },
        },
        served,
    )?;
    for warning in server.warnings() {
        eprintln!("throng api: warning: {warning}");
    }
    out!(
        "throng api: serving\n{}\nat\n  base_url={}\n  api_key={}\n(Ctrl-C stops the server)",
        described.join("\n"),
        server.base_url(),
        server.key()
    )?;
    server.serve()?;
    Ok(())
}
