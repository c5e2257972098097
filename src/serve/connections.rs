//! The connections a server holds: its accept loop, with the limits a server on a network
//! needs. `throng serve` and `throng api` both run it.
//!
//! A connection that sends no complete request head for `idle_timeout` is closed: one idle
//! between keep-alive requests, one that never sends a byte, and one that sends its headers a
//! byte at a time (slowloris) alike, since hyper's header timer starts as soon as a connection
//! waits for a request. At most `max_connections` are held (and never more than the process's
//! open-file limit leaves room for); at the cap a new connection takes the place of the one
//! idle longest, so that idle sockets, however many, never lock a client out. Only when every
//! held connection has a request in flight is a new one closed at once.

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tower_service::Service;

/// Limits on the connections a server holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a connection may wait between requests, or take to send a request's head,
    /// before it is closed.
    pub idle_timeout: Duration,
    /// Connections held at once (lowered to what the open-file limit leaves room for).
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}

/// Open files kept free for what is not a connection: model and store files, the run
/// folder's files, the engine's threads.
const FILES_KEPT: usize = 64;

/// Connections this process can hold: `wanted`, or fewer where the open-file limit (raised
/// to its hard limit first, as servers do) leaves less room.
fn connection_room(wanted: usize) -> usize {
    let files = open_file_limit();
    wanted.min(files.saturating_sub(FILES_KEPT)).max(1)
}

/// The open-file limit, raised to the hard limit where the soft one is lower.
fn open_file_limit() -> usize {
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return usize::MAX;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    }
}

/// What the accept loop knows of a held connection.
struct Held {
    /// Requests whose response has not been sent in full.
    busy: Arc<AtomicUsize>,
    /// When it last finished a response (or opened).
    idle_since: Arc<Mutex<Instant>>,
    /// Closes it at once.
    close: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct Table {
    next: u64,
    held: HashMap<u64, Held>,
}

impl Table {
    /// Closes the connection idle longest, if any is idle.
    fn evict_idlest(&mut self) -> bool {
        let idlest = self
            .held
            .iter()
            .filter(|(_, h)| h.busy.load(Ordering::SeqCst) == 0 && h.close.is_some())
            .min_by_key(|(_, h)| *h.idle_since.lock().unwrap_or_else(|e| e.into_inner()))
            .map(|(&id, _)| id);
        match idlest.and_then(|id| self.held.get_mut(&id)?.close.take()) {
            Some(close) => {
                let _ = close.send(());
                true
            }
            None => false,
        }
    }

    /// Connections not yet told to close.
    fn open(&self) -> usize {
        self.held.values().filter(|h| h.close.is_some()).count()
    }
}

/// Serves `app` on `listener` under `limits` until `stop` resolves; then finishes the
/// requests in flight and returns.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cap = connection_room(limits.max_connections);
    let table = Arc::new(Mutex::new(Table::default()));
    let (shutdown, shutting_down) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            () = &mut stop => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of files or memory for a moment, or a connection reset before it was
                // taken: wait a little rather than spin, and go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (id, busy, idle_since, closed) = {
            let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
            if t.open() >= cap && !t.evict_idlest() {
                // Every held connection is answering a request: this one waits its turn
                // as a refused connection, which clients retry.
                drop(stream);
                continue;
            }
            let busy = Arc::new(AtomicUsize::new(0));
            let idle_since = Arc::new(Mutex::new(Instant::now()));
            let (close, closed) = oneshot::channel();
            let id = t.next;
            t.next += 1;
            t.held.insert(
                id,
                Held {
                    busy: Arc::clone(&busy),
                    idle_since: Arc::clone(&idle_since),
                    close: Some(close),
                },
            );
            (id, busy, idle_since, closed)
        };
        let app = app.clone();
        let table = Arc::clone(&table);
        let mut shutting_down = shutting_down.clone();
        tasks.spawn(async move {
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let mut app = app.clone();
                let guard = Busy::start(Arc::clone(&busy), Arc::clone(&idle_since));
                async move {
                    let response = app.call(request.map(Body::new)).await?;
                    // The connection is busy until the whole body is sent (a stream too).
                    Ok::<_, std::convert::Infallible>(
                        response.map(|body| Body::new(Tracked { body, _busy: guard })),
                    )
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.idle_timeout)
                .keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = closed => {}
                _ = shutting_down.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            table
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .held
                .remove(&id);
        });
    }
    drop(listener);
    let _ = shutdown.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// A request in flight on a connection; dropped with its response's body.
struct Busy {
    busy: Arc<AtomicUsize>,
    idle_since: Arc<Mutex<Instant>>,
}

impl Busy {
    fn start(busy: Arc<AtomicUsize>, idle_since: Arc<Mutex<Instant>>) -> Self {
        busy.fetch_add(1, Ordering::SeqCst);
        Self { busy, idle_since }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds its request's [`Busy`] until it is sent or dropped.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_for_connections_stays_below_the_open_file_limit() {
        let files = open_file_limit();
        assert!(connection_room(usize::MAX) <= files.saturating_sub(FILES_KEPT).max(1));
        assert_eq!(connection_room(1), 1);
    }
}
