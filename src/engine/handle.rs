//! A thread-safe way into the engine for callers that act asynchronously (agents, an HTTP
//! server): an actor owns the engine on its own thread, and cloneable handles send it
//! messages over a channel: requests, each with a [`Sink`] for its text and result,
//! announcements of the next round of calls, and questions about its status. Requests from
//! every thread join the same continuous batch.

use super::drive::{Client, Fill, Queue, Refused};
use super::llm_engine::Engine;
use super::request::{Request, RequestError, Response};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

/// Where one request's text and result go. Implemented by the HTTP server over a tokio
/// channel; the engine never sees tokio.
pub trait Sink: Send + 'static {
    /// New text of the reply (its deltas join to the reply's text).
    fn text(&mut self, delta: &str);
    /// The request ended (a refusal at submit included).
    fn done(self: Box<Self>, result: Result<Response, RequestError>);
    /// Whether the reader went away: the request is then dropped, waiting or running, and
    /// its blocks freed before the next step. The sink is dropped without a `done`.
    fn cancelled(&self) -> bool;
}

/// What the engine is doing and has done, as of its last step (published between steps, so
/// that asking never waits for one).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct EngineStatus {
    /// Requests queued and not admitted to the batch yet.
    pub waiting: usize,
    /// Requests in the batch.
    pub running: usize,
    /// Requests dropped because their reader went away.
    pub cancelled: u64,
    /// Requests the engine ended, answered or failed (refusals at submit not counted).
    pub finished: u64,
    /// The engine's totals over its life (see [`super::EngineTotals`]): steps, sampled
    /// tokens, prompt tokens queued, and of them found in the prefix cache.
    pub steps: u64,
    /// Tokens the model sampled.
    pub generated_tokens: u64,
    /// Tokens a grammar forced, appended without sampling (a reply's tokens are both kinds).
    pub forced_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// What a handle tells the actor.
enum Msg {
    Submit(Request, Box<dyn Sink>),
    ExpectCalls(Vec<String>),
}

/// The engine's status as the actor last published it, and whether the actor still runs.
#[derive(Default)]
struct Published {
    status: Mutex<EngineStatus>,
    running: AtomicBool,
}

/// Marks the actor stopped when it ends, by returning or by a panic.
struct Running(Arc<Published>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::SeqCst);
    }
}

fn stopped() -> RequestError {
    RequestError::Engine("the engine thread stopped".into())
}

/// A cloneable handle to an engine running on its own thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    published: Arc<Published>,
}

/// A submitted request's future response.
pub struct Pending(mpsc::Receiver<Result<Response, RequestError>>);

impl Pending {
    /// Blocks until the response is ready.
    pub fn wait(self) -> Result<Response, RequestError> {
        self.0.recv().unwrap_or_else(|_| Err(stopped()))
    }
}

/// The sink behind [`EngineHandle::submit`]: the result down a channel, the text ignored.
struct Reply(mpsc::Sender<Result<Response, RequestError>>);

impl Sink for Reply {
    fn text(&mut self, _delta: &str) {}

    fn done(self: Box<Self>, result: Result<Response, RequestError>) {
        // A caller that stopped waiting is no error of the engine's.
        let _ = self.0.send(result);
    }

    /// A std channel cannot tell that its `Pending` was dropped, so the request runs to its
    /// end, as it always has.
    fn cancelled(&self) -> bool {
        false
    }
}

impl EngineHandle {
    /// Moves `engine` onto its own thread. The thread ends, handing the engine back through
    /// the join handle, once every handle is dropped and its work is done.
    pub fn spawn(engine: Engine) -> (EngineHandle, JoinHandle<Engine>) {
        let (tx, rx) = mpsc::channel();
        let published = Arc::new(Published::default());
        published.running.store(true, Ordering::SeqCst);
        let running = Running(Arc::clone(&published));
        let thread = std::thread::Builder::new()
            .name("throng-engine".into())
            .spawn(move || serve(engine, rx, running))
            .expect("invariant: the OS can start a thread");
        (EngineHandle { tx, published }, thread)
    }

    /// Queues `request`; its text and result go to `sink`.
    pub fn send(&self, request: Request, sink: Box<dyn Sink>) {
        if let Err(mpsc::SendError(Msg::Submit(_, sink))) = self.tx.send(Msg::Submit(request, sink))
        {
            sink.done(Err(stopped()));
        }
    }

    /// Queues `request`; the response arrives through the returned [`Pending`].
    pub fn submit(&self, request: Request) -> Pending {
        let (reply, rx) = mpsc::channel();
        self.send(request, Box::new(Reply(reply)));
        Pending(rx)
    }

    /// Submits `request` and waits for its response.
    pub fn generate(&self, request: Request) -> Result<Response, RequestError> {
        self.submit(request).wait()
    }

    /// What the engine is doing, as of its last step: read at once, never queued behind a
    /// step (a server's stats under load took seconds when the engine answered them).
    pub fn status(&self) -> Result<EngineStatus, RequestError> {
        if !self.published.running.load(Ordering::SeqCst) {
            return Err(stopped());
        }
        Ok(*self
            .published
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner()))
    }

    /// Announces the next round of calls by retention key, as [`Engine::expect_calls`] does:
    /// send it before the round's requests. An engine that stopped has no calls to expect.
    pub fn expect_calls(&self, keys: Vec<String>) {
        let _ = self.tx.send(Msg::ExpectCalls(keys));
    }
}

/// The actor's side: messages from the channel, each request's text and result to its sink.
struct Actor {
    rx: mpsc::Receiver<Msg>,
    cancelled: u64,
    finished: u64,
    running: Running,
}

impl Actor {
    fn take(&mut self, queue: &mut Queue<'_, Box<dyn Sink>>, msg: Msg) {
        match msg {
            // Its reader left while it sat in the channel: it never runs.
            Msg::Submit(_, sink) if sink.cancelled() => {
                self.cancelled += 1;
                self.publish(queue.engine());
                drop(sink);
            }
            Msg::Submit(request, sink) => {
                if let Err(Refused { key, error }) = queue.submit(sink, request) {
                    key.done(Err(error));
                }
            }
            Msg::ExpectCalls(keys) => queue.expect_calls(keys),
        }
    }

    /// Publishes what the engine is doing now, for [`EngineHandle::status`].
    fn publish(&self, engine: &Engine) {
        let totals = engine.totals();
        let status = EngineStatus {
            waiting: engine.num_waiting(),
            running: engine.num_running(),
            cancelled: self.cancelled,
            finished: self.finished,
            steps: totals.steps,
            generated_tokens: totals.generated_tokens,
            forced_tokens: totals.forced_tokens,
            prompt_tokens: totals.prompt_tokens,
            cached_tokens: totals.cache.hit_tokens,
        };
        *self
            .running
            .0
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = status;
    }
}

impl Client for Actor {
    type Key = Box<dyn Sink>;
    type Error = Infallible;

    fn fill(&mut self, queue: &mut Queue<'_, Box<dyn Sink>>) -> Result<Fill, Infallible> {
        // Readers that went away since the last step: their requests leave before the next.
        let gone = queue.cancel_where(|sink| sink.cancelled());
        if !gone.is_empty() {
            self.cancelled += gone.len() as u64;
            // Published before the sinks are dropped, which is how their callers learn of it.
            self.publish(queue.engine());
            drop(gone);
        }
        // Block only when there is nothing to run; otherwise take whatever has arrived so it
        // joins the next step.
        if queue.idle() {
            self.publish(queue.engine());
            match self.rx.recv() {
                Ok(msg) => self.take(queue, msg),
                Err(_) => return Ok(Fill::Done),
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(msg) => self.take(queue, msg),
                // Once every handle is gone, the requests in flight still finish, their
                // readers still asked before each step whether they left; the first fill
                // with nothing in flight ends the run in `recv` above.
                Err(mpsc::TryRecvError::Empty | mpsc::TryRecvError::Disconnected) => {
                    self.publish(queue.engine());
                    return Ok(Fill::More);
                }
            }
        }
    }

    fn text(&mut self, sink: &mut Box<dyn Sink>, text: &str) -> Result<(), Infallible> {
        sink.text(text);
        Ok(())
    }

    // Every step, not only those that end a request: a status read under load is a step old
    // at most.
    fn step_counted(&mut self, engine: &Engine) -> Result<(), Infallible> {
        self.publish(engine);
        Ok(())
    }

    fn finished(
        &mut self,
        sink: Box<dyn Sink>,
        result: Result<Response, RequestError>,
    ) -> Result<(), Infallible> {
        self.finished += 1;
        // Published before the caller hears of it, so that a status read on its answer
        // counts it finished (out of the batch it is since `step_counted`).
        self.running
            .0
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finished = self.finished;
        sink.done(result);
        Ok(())
    }
}

fn serve(mut engine: Engine, rx: mpsc::Receiver<Msg>, running: Running) -> Engine {
    let mut actor = Actor {
        rx,
        cancelled: 0,
        finished: 0,
        running,
    };
    let Ok(()) = engine.run(usize::MAX, &mut actor);
    engine
}
