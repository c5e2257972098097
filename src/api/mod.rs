//! `throng api`: the engine behind an OpenAI-compatible HTTP API, so that simulations written
//! for OpenAI's clients (AgentScope, Concordia, OASIS, mesa-llm through LiteLLM) run on throng
//! with only their `base_url` changed, and keep throng's guarantees: every structured reply
//! satisfies its schema (a keyword that cannot be enforced is refused, never ignored),
//! requests from every connection join one continuous batch, and the same request gives the
//! same bits at any concurrency.
//!
//! The server owns no model code: each served model is an [`EngineHandle`](crate::engine::EngineHandle) (the engine on its
//! own thread), and a request becomes one engine request per choice whose text comes back
//! through a [`Sink`](crate::engine::Sink). A client that goes away drops its sink's receiver,
//! and the engine drops its sequences before the next step.

mod app;
mod call_text;
mod chat;
mod error;
mod http;
mod memo;
mod rounds;
mod schema;
mod seeds;
mod store;
mod tool_stream;
mod tools;

pub use app::Served;
pub use error::ApiFailure;

use app::App;
pub use schema::{Unenforceable, check as check_schema};
pub use store::StoreError;

use crate::serve::access::Access;
pub use crate::serve::connections::ConnectionLimits;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// How the server is set up.
pub struct ApiOptions {
    pub addr: SocketAddr,
    /// Bind an address other than loopback (needs `key`).
    pub public: bool,
    /// The API key clients send as `Authorization: Bearer`; a random one when none is given.
    pub key: Option<String>,
    /// Names, besides this machine's addresses, that requests may give in their Host header.
    pub allowed_hosts: Vec<String>,
    /// Sequences admitted (running or waiting) before a request is answered 429.
    pub queue: usize,
    /// The most tokens a reply may have, and what one without `max_tokens` gets.
    pub max_tokens: usize,
    /// Where to keep every reply (a decision store), if anywhere.
    pub store: Option<PathBuf>,
    /// Earlier stores (runs' or servers') whose replies answer requests of the same input.
    pub reuse: Vec<PathBuf>,
    /// The idle timeout and the cap on connections held.
    pub connections: ConnectionLimits,
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "{addr} is not a loopback address: serving the API beyond this machine needs --public \
         and an API key (--api-key or THRONG_API_KEY)"
    )]
    NotLoopback { addr: SocketAddr },
    #[error(
        "--public needs an API key (--api-key or THRONG_API_KEY): anyone who can reach {addr} could use the model"
    )]
    PublicWithoutKey { addr: SocketAddr },
    #[error(
        "cannot listen on {addr}: {source} (is another server on that port? pick another with --addr)"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("no model to serve")]
    NoModel,
    #[error("two models are served as {0:?}: give each its own name")]
    DuplicateName(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A bound server, not yet serving.
pub struct ApiServer {
    app: Arc<App>,
    listener: std::net::TcpListener,
    connections: ConnectionLimits,
    warnings: Vec<String>,
}

impl ApiServer {
    /// Checks the binding rules and binds `options.addr`.
    pub fn bind(options: ApiOptions, models: Vec<Served>) -> Result<Self, ApiError> {
        if !options.addr.ip().is_loopback() && !options.public {
            return Err(ApiError::NotLoopback { addr: options.addr });
        }
        let listener =
            std::net::TcpListener::bind(options.addr).map_err(|source| ApiError::Bind {
                addr: options.addr,
                source,
            })?;
        Self::on(listener, options, models)
    }

    /// Serves on `listener`, bound beforehand (`options.addr` is not used).
    pub fn on(
        listener: std::net::TcpListener,
        options: ApiOptions,
        models: Vec<Served>,
    ) -> Result<Self, ApiError> {
        let bound = listener.local_addr()?;
        if options.public && options.key.is_none() {
            return Err(ApiError::PublicWithoutKey { addr: bound });
        }
        if models.is_empty() {
            return Err(ApiError::NoModel);
        }
        for (i, m) in models.iter().enumerate() {
            if models[..i].iter().any(|o| o.name == m.name) {
                return Err(ApiError::DuplicateName(m.name.clone()));
            }
        }
        let identities: Vec<(&str, &crate::engine::ModelIdentity)> = models
            .iter()
            .map(|m| (m.name.as_str(), m.encoder.identity()))
            .collect();
        store::check_sources(&options.reuse, options.store.as_deref())?;
        let (sources, warnings) = match options.reuse.is_empty() {
            true => (None, Vec::new()),
            false => {
                let opened = store::open_sources(&options.reuse, &identities)?;
                (Some(std::sync::Mutex::new(opened.reuse)), opened.warnings)
            }
        };
        let recorder = match &options.store {
            Some(dir) => Some(store::Recorder::open(dir, &identities)?),
            None => None,
        };
        listener.set_nonblocking(true)?;
        let key = options.key.unwrap_or_else(|| {
            let bytes: [u8; 24] = rand::random();
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        });
        let app = App {
            rounds: models.iter().map(|_| rounds::Rounds::default()).collect(),
            models,
            access: Access::new(key, bound, options.public, &options.allowed_hosts)
                .named("throng api"),
            queue: options.queue.max(1),
            max_tokens: options.max_tokens.max(1),
            admitted: Arc::default(),
            seeds: seeds::Seeds::default(),
            finished: Arc::default(),
            started: std::time::Instant::now(),
            memo: memo::Memo::default(),
            recorder,
            sources,
            reused: AtomicU64::new(0),
            spliced: AtomicU64::new(0),
        };
        Ok(ApiServer {
            app: Arc::new(app),
            listener,
            connections: options.connections,
            warnings,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The `base_url` clients give: `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        let addr = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        format!("http://{addr}/v1")
    }

    /// What was left out of the `--reuse` stores (missing, damaged, another model's).
    pub(crate) fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The API key clients send.
    pub fn key(&self) -> &str {
        self.app.access.token()
    }

    /// Serves until `stop` resolves (on a runtime of its own; call from a plain thread).
    pub fn serve_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ApiError> {
        let app = http::router(self.app);
        Ok(crate::serve::http::serve_on(
            self.listener,
            app,
            "throng-api",
            self.connections,
            stop,
        )?)
    }

    /// Serves until Ctrl-C.
    pub fn serve(self) -> Result<(), ApiError> {
        self.serve_until(crate::serve::http::ctrl_c())
    }
}
