//! A thread-safe way into the engine for agents that act asynchronously: an actor owns the
//! engine on its own thread, and cloneable handles send it requests over a channel, each with
//! its own reply channel. Requests from every thread join the same continuous batch.

use super::llm_engine::Engine;
use super::request::{Request, RequestError, Response};
use super::sequence::SeqId;
use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;

type Reply = mpsc::Sender<Result<Response, RequestError>>;

/// A cloneable handle to an engine running on its own thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<(Request, Reply)>,
}

/// A submitted request's future response.
pub struct Pending(mpsc::Receiver<Result<Response, RequestError>>);

impl Pending {
    /// Blocks until the response is ready.
    pub fn wait(self) -> Result<Response, RequestError> {
        self.0
            .recv()
            .unwrap_or_else(|_| Err(RequestError::Engine("the engine thread stopped".into())))
    }
}

impl EngineHandle {
    /// Moves `engine` onto its own thread. The thread ends, handing the engine back through
    /// the join handle, once every handle is dropped and its work is done.
    pub fn spawn(engine: Engine) -> (EngineHandle, JoinHandle<Engine>) {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("throng-engine".into())
            .spawn(move || serve(engine, rx))
            .expect("invariant: the OS can start a thread");
        (EngineHandle { tx }, thread)
    }

    /// Queues `request`; the response arrives through the returned [`Pending`].
    pub fn submit(&self, request: Request) -> Pending {
        let (reply, rx) = mpsc::channel();
        if let Err(mpsc::SendError((_, reply))) = self.tx.send((request, reply)) {
            let _ = reply.send(Err(RequestError::Engine(
                "the engine thread stopped".into(),
            )));
        }
        Pending(rx)
    }

    /// Submits `request` and waits for its response.
    pub fn generate(&self, request: Request) -> Result<Response, RequestError> {
        self.submit(request).wait()
    }
}

fn serve(mut engine: Engine, rx: mpsc::Receiver<(Request, Reply)>) -> Engine {
    let mut replies: HashMap<SeqId, Reply> = HashMap::new();
    let mut open = true;
    while open || engine.has_work() {
        // Block only when there is nothing to run; otherwise take whatever has arrived so it
        // joins the next step.
        if !engine.has_work() {
            match rx.recv() {
                Ok(msg) => accept(&mut engine, &mut replies, msg),
                Err(_) => open = false,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(msg) => accept(&mut engine, &mut replies, msg),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if engine.has_work() {
            for (id, result) in engine.step().finished {
                if let Some(reply) = replies.remove(&id) {
                    let _ = reply.send(result);
                }
            }
        }
    }
    engine
}

fn accept(
    engine: &mut Engine,
    replies: &mut HashMap<SeqId, Reply>,
    (request, reply): (Request, Reply),
) {
    match engine.submit(&request) {
        Ok(id) => {
            replies.insert(id, reply);
        }
        Err(e) => {
            let _ = reply.send(Err(e));
        }
    }
}
