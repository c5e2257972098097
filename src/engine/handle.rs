//! A thread-safe way into the engine for agents that act asynchronously: an actor owns the
//! engine on its own thread, and cloneable handles send it requests over a channel, each with
//! its own reply channel. Requests from every thread join the same continuous batch.

use super::drive::{Client, Fill, Queue, Refused};
use super::llm_engine::Engine;
use super::request::{Request, RequestError, Response};
use std::convert::Infallible;
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

/// The actor's side: requests from the channel, answers down each one's reply channel.
struct Actor(mpsc::Receiver<(Request, Reply)>);

impl Client for Actor {
    type Key = Reply;
    type Error = Infallible;

    fn fill(&mut self, queue: &mut Queue<'_, Reply>) -> Result<Fill, Infallible> {
        let accept = |queue: &mut Queue<'_, Reply>, (request, reply): (Request, Reply)| {
            if let Err(Refused { key, error }) = queue.submit(reply, request) {
                let _ = key.send(Err(error));
            }
        };
        // Block only when there is nothing to run; otherwise take whatever has arrived so it
        // joins the next step.
        if queue.idle() {
            match self.0.recv() {
                Ok(msg) => accept(queue, msg),
                Err(_) => return Ok(Fill::Done),
            }
        }
        loop {
            match self.0.try_recv() {
                Ok(msg) => accept(queue, msg),
                Err(mpsc::TryRecvError::Empty) => return Ok(Fill::More),
                Err(mpsc::TryRecvError::Disconnected) => return Ok(Fill::Done),
            }
        }
    }

    fn finished(
        &mut self,
        reply: Reply,
        result: Result<Response, RequestError>,
    ) -> Result<(), Infallible> {
        // A caller that stopped waiting is no error of the engine's.
        let _ = reply.send(result);
        Ok(())
    }
}

fn serve(mut engine: Engine, rx: mpsc::Receiver<(Request, Reply)>) -> Engine {
    let Ok(()) = engine.run(usize::MAX, &mut Actor(rx));
    engine
}
