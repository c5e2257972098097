//! The server: its routes, the binding rules (loopback unless asked, controls off with
//! `read_only`), and the guard every request passes ([`super::access`]: the Host header and
//! the token, for reads as for controls).

use super::access::{Access, Refusal};
use super::assets;
use super::control::{self, Child, ControlError};
use super::decisions::{self, Query};
use super::detail::{self, RunDetail};
use super::files;
use super::folders::{self, Read, RunSummary};
use super::json_error::error;
use super::log::Indexes;
use super::panels::Caches;
use super::replay;
use axum::extract::{Path as UrlPath, Query as UrlQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a live page's folder is looked at.
const POLL: Duration = Duration::from_millis(250);

/// The most of a run's config shown.
const CONFIG_MOST: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "{addr} is not a loopback address: serving on it lets other machines read the runs. Pass --public to do so knowingly (every request still needs the token), or bind 127.0.0.1"
    )]
    NotLoopback { addr: SocketAddr },
    #[error(
        "cannot listen on {addr}: {source} (is another server on that port? try --addr 127.0.0.1:0 for a free one)"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a folder: give the folder that holds run folders (default runs/)")]
    NoRoot(PathBuf),
    #[error("{0} is not a run folder: give the folder `throng run` wrote")]
    NoRun(PathBuf),
    #[error("the server stopped: {0}")]
    Io(#[from] std::io::Error),
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The folder whose run folders are listed.
    pub root: PathBuf,
    /// Serve this run folder alone (a run's own page, `run --serve`): nothing beside it is
    /// listed or reachable. Its id is the one a server of `root` gives it.
    pub only: Option<PathBuf>,
    pub addr: SocketAddr,
    /// Allow a non-loopback `addr`.
    pub public: bool,
    /// Names besides this machine's loopback ones that requests may give as their Host.
    pub allowed_hosts: Vec<String>,
    /// No control actions at all.
    pub read_only: bool,
    /// The token every request needs (a random one when `None`).
    pub token: Option<String>,
    /// The `throng` binary a resume runs.
    pub exe: PathBuf,
}

struct App {
    root: PathBuf,
    only: Option<PathBuf>,
    access: Access,
    read_only: bool,
    exe: PathBuf,
    index: Mutex<BTreeMap<String, PathBuf>>,
    logs: Indexes,
    children: Mutex<HashMap<String, Arc<Child>>>,
    caches: Caches,
}

/// A bound server, not yet serving.
pub struct Server {
    app: Arc<App>,
    listener: std::net::TcpListener,
}

impl Server {
    /// Checks the binding rules and binds `options.addr`.
    pub fn bind(options: ServeOptions) -> Result<Self, ServeError> {
        let listener = listen(options.addr, options.public)?;
        Self::on(listener, options)
    }

    /// Serves on `listener`, bound beforehand by [`listen`] (`options.addr` is not used).
    pub fn on(listener: std::net::TcpListener, options: ServeOptions) -> Result<Self, ServeError> {
        if !options.root.is_dir() {
            return Err(ServeError::NoRoot(options.root));
        }
        if let Some(run) = &options.only
            && !folders::is_run(run)
        {
            return Err(ServeError::NoRun(run.clone()));
        }
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let token = options.token.unwrap_or_else(|| {
            let bytes: [u8; 24] = rand::random();
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        });
        let app = App {
            index: Mutex::default(),
            access: Access::new(token, bound, options.public, &options.allowed_hosts),
            root: options.root,
            only: options.only,
            read_only: options.read_only,
            exe: options.exe,
            logs: Indexes::default(),
            children: Mutex::default(),
            caches: Caches::default(),
        };
        *app.index.lock().unwrap_or_else(|p| p.into_inner()) = app.scan();
        Ok(Server {
            app: Arc::new(app),
            listener,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn token(&self) -> &str {
        self.app.access.token()
    }

    /// The index page's address, with the token (as Jupyter prints it).
    pub fn url(&self) -> String {
        let addr = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        format!("http://{addr}/?token={}", self.token())
    }

    /// The address of the page of the run in `dir`, with the token.
    pub(crate) fn run_url(&self, dir: &Path) -> String {
        let addr = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let id = folders::id_of(&self.app.root, dir);
        format!("http://{addr}/runs/{id}?token={}", self.token())
    }

    /// Serves until `stop` resolves (on a runtime of its own; call from a plain thread).
    pub fn serve_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        Ok(serve_on(
            self.listener,
            router(self.app),
            "throng-serve",
            Default::default(),
            stop,
        )?)
    }

    /// Serves until Ctrl-C.
    pub fn serve(self) -> Result<(), ServeError> {
        self.serve_until(ctrl_c())
    }
}

/// Serves `app` on `listener` until `stop` resolves, on a runtime of its own whose threads
/// are named `threads` (call from a plain thread): `throng serve`'s pages and `throng api`.
pub(crate) fn serve_on(
    listener: std::net::TcpListener,
    app: Router,
    threads: &str,
    limits: super::connections::ConnectionLimits,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name(threads)
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        super::connections::serve(listener, app, limits, stop).await
    })
}

/// Resolves at Ctrl-C: a server's `stop` when it serves until the user ends it.
pub async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

/// Binds `addr` under the binding rules (loopback unless `public`): a run with `--serve` takes
/// its port before it writes its folder, so that a busy port refuses the run and leaves nothing
/// behind.
pub fn listen(addr: SocketAddr, public: bool) -> Result<std::net::TcpListener, ServeError> {
    if !addr.ip().is_loopback() && !public {
        return Err(ServeError::NotLoopback { addr });
    }
    std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index_page))
        .route("/runs/{id}", get(run_page))
        .route("/runs/{id}/files/{*name}", get(run_file))
        .route("/assets/{*file}", get(asset))
        .route("/api/server", get(server_info))
        .route("/api/runs", get(runs))
        .route("/api/events", get(index_events))
        .route("/api/runs/{id}", get(run_detail))
        .route("/api/runs/{id}/events", get(run_events))
        .route("/api/runs/{id}/decisions", get(run_decisions))
        .route("/api/runs/{id}/prompts/{hash}", get(run_prompt))
        .route("/api/runs/{id}/steps/{n}", get(run_step))
        .route("/api/runs/{id}/config", get(run_config))
        .route("/api/runs/{id}/pause", post(pause))
        .route("/api/runs/{id}/resume", post(resume))
        .route("/api/runs/{id}/delete", post(delete))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such page") })
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard))
        .with_state(app)
}

/// Every request: its Host must name this server; anything but a page's shell and its
/// assets (which hold no run's data) needs the token; a control action must come from this
/// server's own pages. Every answer is never sniffed and sends no Referer on.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let open = path == "/"
        || path.starts_with("/assets/")
        || path
            .strip_prefix("/runs/")
            .is_some_and(|id| !id.is_empty() && !id.contains('/'));
    let headers = request.headers();
    let checked = app
        .access
        .check_host(headers)
        .and_then(|()| match open {
            true => Ok(()),
            false => app.access.check_token(headers),
        })
        .and_then(|()| match request.method() == Method::GET {
            true => Ok(()),
            false => app.access.check_origin(headers),
        });
    let mut response = match checked {
        Ok(()) => next.run(request).await,
        Err(Refusal(status, words)) => error(status, words),
    };
    let h = response.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Blocking work (reading run folders) off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Runs `f` on the folder of run `id` off the async workers, or answers 404 for an id the
/// index never gave.
async fn on_run(
    app: Arc<App>,
    id: String,
    f: impl FnOnce(&App, String, PathBuf) -> Response + Send + 'static,
) -> Response {
    blocking(move || match app.dir(&id) {
        Some(dir) => f(&app, id, dir),
        None => error(StatusCode::NOT_FOUND, "no such run"),
    })
    .await
}

impl App {
    /// The run folders served: every one under the root, or the one run alone.
    fn scan(&self) -> BTreeMap<String, PathBuf> {
        match &self.only {
            Some(run) if folders::is_run(run) => {
                BTreeMap::from([(folders::id_of(&self.root, run), run.clone())])
            }
            Some(_) => BTreeMap::new(),
            None => folders::scan(&self.root),
        }
    }

    /// The folder of run `id`, looking again when it is not known yet. Only ids the index
    /// gave are looked up: a client's string never becomes a path.
    fn dir(&self, id: &str) -> Option<PathBuf> {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = index.get(id) {
            return Some(dir.clone());
        }
        *index = self.scan();
        index.get(id).cloned()
    }

    fn summaries(&self) -> Vec<RunSummary> {
        let found = self.scan();
        let mut list: Vec<RunSummary> = found
            .values()
            .map(|dir| Read::of(dir).summary(&self.root))
            .collect();
        *self.index.lock().unwrap_or_else(|p| p.into_inner()) = found;
        // Newest first.
        list.sort_by(|a, b| b.started.cmp(&a.started).then(a.path.cmp(&b.path)));
        list
    }

    fn child(&self, id: &str) -> Option<Arc<Child>> {
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn detail(&self, id: &str, dir: &Path) -> RunDetail {
        let read = Read::of(dir);
        detail::detail(
            &read,
            &self.root,
            self.child(id).map(|c| c.view()),
            self.read_only,
            &self.caches,
        )
    }

    /// Refuses control actions on a read-only server.
    fn refused(&self) -> Option<Response> {
        self.read_only.then(|| {
            error(
                StatusCode::FORBIDDEN,
                "this server is read-only (--read-only): controls are off",
            )
        })
    }
}

#[derive(Deserialize)]
struct PageQuery {
    token: Option<String>,
}

/// A page's shell: with the right token in its address, it sets the cookie that the page's
/// requests carry.
fn page(app: &App, name: &str, q: &PageQuery) -> Response {
    let mut r = assets::page(name);
    if q.token.as_deref().is_some_and(|t| app.access.is_token(t)) {
        r.headers_mut()
            .insert(header::SET_COOKIE, app.access.cookie());
    }
    r
}

async fn index_page(State(app): State<Arc<App>>, UrlQuery(q): UrlQuery<PageQuery>) -> Response {
    page(&app, "index.html", &q)
}

async fn run_page(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    UrlQuery(q): UrlQuery<PageQuery>,
    headers: HeaderMap,
) -> Response {
    // Whether a run exists is told only to those with the token; the shell holds no data.
    let authorized = app.access.check_token(&headers).is_ok()
        || q.token.as_deref().is_some_and(|t| app.access.is_token(t));
    if authorized && {
        let app = Arc::clone(&app);
        blocking(move || app.dir(&id)).await.is_none()
    } {
        return error(
            StatusCode::NOT_FOUND,
            "no run with that id under this server's folder",
        );
    }
    page(&app, "run.html", &q)
}

async fn asset(UrlPath(file): UrlPath<String>) -> Response {
    assets::file(&file)
}

async fn run_file(
    State(app): State<Arc<App>>,
    UrlPath((id, name)): UrlPath<(String, String)>,
) -> Response {
    on_run(app, id, move |_, _, dir| files::serve(&dir, &name)).await
}

async fn server_info(State(app): State<Arc<App>>) -> Response {
    Json(json!({
        "read_only": app.read_only,
        "root": app.only.as_ref().unwrap_or(&app.root).display().to_string(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

async fn runs(State(app): State<Arc<App>>) -> Response {
    let list = blocking(move || app.summaries()).await;
    Json(json!({ "runs": list })).into_response()
}

fn sse(stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

async fn index_events(State(app): State<Arc<App>>) -> Response {
    // The list at once, then again whenever it changes (looked at every second).
    let stream = futures_util::stream::unfold((app, None::<String>), |(app, last)| async move {
        loop {
            if last.is_some() {
                tokio::time::sleep(POLL * 4).await;
            }
            let a = Arc::clone(&app);
            let list = blocking(move || a.summaries()).await;
            let data = json!({ "runs": list }).to_string();
            if last.as_deref() != Some(data.as_str()) {
                let event = Event::default().event("runs").data(data.clone());
                return Some((Ok(event), (app, Some(data))));
            }
        }
    });
    sse(stream)
}

async fn run_detail(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    on_run(app, id, |app, id, dir| {
        Json(app.detail(&id, &dir)).into_response()
    })
    .await
}

async fn run_events(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    let Some(dir) = ({
        let (app, id) = (Arc::clone(&app), id.clone());
        blocking(move || app.dir(&id)).await
    }) else {
        return error(StatusCode::NOT_FOUND, "no such run");
    };
    type Seen = Option<(Vec<(u64, Option<std::time::SystemTime>)>, String)>;
    let stream = futures_util::stream::unfold(
        (app, id, dir, None::<Seen>, false),
        |(app, id, dir, seen, gone)| async move {
            if gone {
                return None;
            }
            let mut seen = seen.flatten();
            loop {
                let (a, i, d) = (Arc::clone(&app), id.clone(), dir.clone());
                let looked = blocking(move || {
                    if !d.is_dir() {
                        return None;
                    }
                    let fp = folders::fingerprint(&d);
                    let child = a.child(&i).map(|c| c.view());
                    let writer = format!("{:?}{:?}", folders::writer(&d), child);
                    Some((fp, writer, a, i, d))
                })
                .await;
                let Some((fp, writer, a, i, d)) = looked else {
                    let event = Event::default().event("gone").data("{}");
                    return Some((Ok(event), (app, id, dir, None, true)));
                };
                let changed = seen.as_ref().is_none_or(|(f, w)| *f != fp || *w != writer);
                if changed {
                    let detail = blocking(move || a.detail(&i, &d)).await;
                    let data = serde_json::to_string(&detail).unwrap_or_default();
                    let event = Event::default().event("run").data(data);
                    seen = Some((fp, writer));
                    return Some((Ok(event), (app, id, dir, Some(seen), false)));
                }
                tokio::time::sleep(POLL).await;
            }
        },
    );
    sse(stream)
}

async fn run_decisions(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    UrlQuery(q): UrlQuery<Query>,
) -> Response {
    on_run(app, id, move |app, id, dir| {
        let manifest = folders::read_manifest(&dir).ok();
        let steps = folders::read_steps_lenient(&dir).unwrap_or_default();
        let mut index = app.logs.take(&id);
        let answer = decisions::answer(&dir, manifest.as_ref(), &steps, &mut index, &q);
        app.logs.put(id, index);
        match answer {
            Ok(a) => Json(a).into_response(),
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        }
    })
    .await
}

async fn run_prompt(
    State(app): State<Arc<App>>,
    UrlPath((id, hash)): UrlPath<(String, String)>,
) -> Response {
    on_run(app, id, move |_, _, dir| {
        match decisions::prompt(&dir, &hash) {
            Some(text) => Json(json!({ "hash": hash, "text": text })).into_response(),
            None => error(
                StatusCode::NOT_FOUND,
                "this run did not keep that prompt (scripted decisions have none)",
            ),
        }
    })
    .await
}

async fn run_step(
    State(app): State<Arc<App>>,
    UrlPath((id, n)): UrlPath<(String, usize)>,
) -> Response {
    on_run(app, id, move |app, _, dir| {
        let steps = folders::read_steps_lenient(&dir).unwrap_or_default();
        match replay::step(&dir, &steps, n, &app.caches.sums) {
            Some(view) => Json(view).into_response(),
            None => error(
                StatusCode::NOT_FOUND,
                format!("the run has {} steps so far", steps.len()),
            ),
        }
    })
    .await
}

async fn run_config(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    on_run(app, id, move |_, _, dir| {
        match crate::record::open::read(&dir, crate::record::CONFIG, CONFIG_MOST) {
            Ok(bytes) => Json(json!({
                "name": crate::record::CONFIG,
                "text": String::from_utf8_lossy(&bytes),
            }))
            .into_response(),
            Err(e) => error(
                StatusCode::NOT_FOUND,
                format!("this run's config.toml cannot be read: {e}"),
            ),
        }
    })
    .await
}

fn control_error(e: ControlError) -> Response {
    let status = match e {
        ControlError::Unconfirmed { .. } => StatusCode::BAD_REQUEST,
        ControlError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::CONFLICT,
    };
    error(status, e)
}

async fn pause(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(refusal) = app.refused() {
        return refusal;
    }
    on_run(app, id, move |_, _, dir| {
        match control::pause(&Read::of(&dir)) {
            Ok(()) => (
                StatusCode::ACCEPTED,
                Json(json!({ "ok": true, "message": "pausing: the step in progress finishes, a checkpoint is written, and the run exits resumable" })),
            )
                .into_response(),
            Err(e) => control_error(e),
        }
    })
    .await
}

async fn resume(State(app): State<Arc<App>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(refusal) = app.refused() {
        return refusal;
    }
    on_run(app, id, move |app, id, dir| {
        let running = app.child(&id).is_some_and(|c| c.running());
        match control::resume(&Read::of(&dir), &app.exe, running) {
            Ok(child) => {
                app.children
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, child);
                (
                    StatusCode::ACCEPTED,
                    Json(json!({ "ok": true, "message": "resuming: `throng run --resume` started; its output follows" })),
                )
                    .into_response()
            }
            Err(e) => control_error(e),
        }
    })
    .await
}

#[derive(Deserialize)]
struct Confirm {
    confirm: String,
}

async fn delete(
    State(app): State<Arc<App>>,
    UrlPath(id): UrlPath<String>,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refusal) = app.refused() {
        return refusal;
    }
    let Ok(Confirm { confirm }) = serde_json::from_slice(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "to delete a run, send {\"confirm\": \"<the name of its folder>\"}",
        );
    };
    on_run(app, id, move |app, id, dir| {
        let running = app.child(&id).is_some_and(|c| c.running());
        match control::delete(&Read::of(&dir), &confirm, running) {
            Ok(dir) => {
                app.index
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                Json(json!({ "ok": true, "message": format!("deleted {}", dir.display()) }))
                    .into_response()
            }
            Err(e) => control_error(e),
        }
    })
    .await
}
