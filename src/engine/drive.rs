//! The one loop that drives the engine: queue what the caller has ready, step, hand back what
//! finished, until the caller has nothing more and nothing is in flight.
//!
//! Callers differ only in where requests come from (a list, a channel, agents' turns prepared
//! a wave at a time, a file read as room frees up) and where results go; they say so through a
//! [`Client`], and know their requests by keys of their own, so the engine never learns what
//! a request is for.

use super::llm_engine::Engine;
use super::request::{Request, RequestError, Response};
use super::sequence::SeqId;
use std::collections::HashMap;
use std::convert::Infallible;

/// Whether a client may queue more requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// More may come: the loop asks again before the next step.
    More,
    /// None will: the loop ends once the requests in flight finish.
    Done,
}

/// Where [`Engine::run`] gets requests and where it sends what becomes of them.
pub trait Client {
    /// What the caller knows a request by (its index, its reply channel, an agent's turn).
    type Key;
    /// Ends the run; the requests still in flight are dropped unanswered.
    type Error;

    /// Queues what is ready, called before every step. With nothing in flight
    /// ([`Queue::idle`]) it must queue something, wait for something, or say [`Fill::Done`]:
    /// otherwise the loop spins.
    fn fill(&mut self, queue: &mut Queue<'_, Self::Key>) -> Result<Fill, Self::Error>;

    /// New text of a request in flight, for streaming; a request's texts join to its
    /// response's text. The key is the caller's to update (a stream writer, say).
    fn text(&mut self, _key: &mut Self::Key, _text: &str) -> Result<(), Self::Error> {
        Ok(())
    }

    /// A step ended: `engine` counts it (its tokens, its steps) before any request it ended
    /// is answered by [`Client::finished`], so that what a caller reads on its answer
    /// includes the step that made it.
    fn step_counted(&mut self, _engine: &Engine) -> Result<(), Self::Error> {
        Ok(())
    }

    /// A request queued earlier finished or failed.
    fn finished(
        &mut self,
        key: Self::Key,
        result: Result<Response, RequestError>,
    ) -> Result<(), Self::Error>;

    /// A step ended, after the [`Client::finished`] calls of the `finished` requests it ended.
    fn stepped(&mut self, _finished: usize) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// A request the engine would not take, with the caller's key back.
#[derive(Debug)]
pub struct Refused<K> {
    pub key: K,
    pub error: RequestError,
}

/// The engine as [`Client::fill`] sees it: room to fill and a way to queue.
pub struct Queue<'a, K> {
    engine: &'a mut Engine,
    keys: &'a mut HashMap<SeqId, K>,
    window: usize,
}

impl<K> Queue<'_, K> {
    /// The engine, to prepare prompts with its tokenizer and chat template.
    pub fn engine(&self) -> &Engine {
        self.engine
    }

    /// Requests that may be queued before the window is full.
    pub fn room(&self) -> usize {
        self.window.saturating_sub(self.keys.len())
    }

    /// Whether nothing is in flight: the loop steps only after something is queued.
    pub fn idle(&self) -> bool {
        !self.engine.has_work()
    }

    /// Validates `request` and queues it under `key`. A refusal (a bad schema, a prompt too
    /// long) is the caller's to report; nothing of it runs.
    pub fn submit(&mut self, key: K, request: Request) -> Result<(), Refused<K>> {
        match self.engine.submit(request) {
            Ok(id) => {
                self.keys.insert(id, key);
                Ok(())
            }
            Err(error) => Err(Refused { key, error }),
        }
    }

    /// Cancels every request in flight whose key `cancel` picks (its reader went away): it
    /// leaves the batch before the next step, its blocks freed, and is never answered, its
    /// key handed back to be dropped. Returns those keys. The others' replies do not change (batch
    /// invariance).
    pub fn cancel_where(&mut self, mut cancel: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut ids: Vec<SeqId> = self
            .keys
            .iter()
            .filter(|(_, key)| cancel(key))
            .map(|(&id, _)| id)
            .collect();
        // In arrival order, so that blocks are freed in the same order on every run.
        ids.sort_unstable();
        ids.iter()
            .filter_map(|id| {
                let cancelled = self.engine.cancel(*id);
                debug_assert!(cancelled, "invariant: every key is of a request in flight");
                // Handed back after the engine let go of the request: a key whose drop tells
                // its caller (a closed channel) says so once the blocks are free.
                self.keys.remove(id)
            })
            .collect()
    }

    /// Announces the next round of calls (see [`Engine::expect_calls`]), between steps: for
    /// a client that learns of a round while requests run.
    pub fn expect_calls<S: AsRef<str>>(&mut self, keys: impl IntoIterator<Item = S>) {
        self.engine.expect_calls(keys);
    }
}

impl Engine {
    /// Runs `client`'s requests in one continuous batch, at most `window` in flight, until it
    /// has no more and every queued one has finished. A client's error ends the run at once.
    pub fn run<C: Client>(&mut self, window: usize, client: &mut C) -> Result<(), C::Error> {
        let mut keys: HashMap<SeqId, C::Key> = HashMap::new();
        let result = self.drive(window, client, &mut keys);
        if result.is_err() {
            // Otherwise the next run would step them and find no key for their results.
            self.abandon();
        }
        result
    }

    fn drive<C: Client>(
        &mut self,
        window: usize,
        client: &mut C,
        keys: &mut HashMap<SeqId, C::Key>,
    ) -> Result<(), C::Error> {
        let mut open = true;
        while open || self.has_work() {
            if open {
                let mut queue = Queue {
                    engine: self,
                    keys,
                    window,
                };
                open = client.fill(&mut queue)? == Fill::More;
            }
            if !self.has_work() {
                continue;
            }
            let out = self.step();
            for (id, text) in &out.deltas {
                let key = keys
                    .get_mut(id)
                    .expect("invariant: every streaming id was queued by this run");
                client.text(key, text)?;
            }
            let finished = out.finished.len();
            client.step_counted(self)?;
            for (id, result) in out.finished {
                let key = keys
                    .remove(&id)
                    .expect("invariant: every finished id was queued by this run");
                client.finished(key, result)?;
            }
            client.stepped(finished)?;
        }
        Ok(())
    }

    /// Runs `requests` to completion, all in one continuous batch; one result per request, in
    /// order. A refused request does not stop the others.
    pub fn generate(&mut self, requests: Vec<Request>) -> Vec<Result<Response, RequestError>> {
        self.generate_with(requests, |_, _| {})
    }

    /// As [`Engine::generate`], calling `on_text(request_index, new_text)` as text arrives.
    pub(crate) fn generate_with(
        &mut self,
        requests: Vec<Request>,
        on_text: impl FnMut(usize, &str),
    ) -> Vec<Result<Response, RequestError>> {
        let mut all = All {
            results: (0..requests.len()).map(|_| None).collect(),
            requests: Some(requests),
            on_text,
        };
        let Ok(()) = self.run(usize::MAX, &mut all);
        all.results
            .into_iter()
            .map(|r| r.expect("invariant: every request finishes, fails or is refused"))
            .collect()
    }
}

/// A list of requests, all queued at once, their results kept in order.
struct All<F> {
    requests: Option<Vec<Request>>,
    results: Vec<Option<Result<Response, RequestError>>>,
    on_text: F,
}

impl<F: FnMut(usize, &str)> Client for All<F> {
    type Key = usize;
    type Error = Infallible;

    fn fill(&mut self, queue: &mut Queue<'_, usize>) -> Result<Fill, Infallible> {
        for (i, request) in self.requests.take().into_iter().flatten().enumerate() {
            if let Err(refused) = queue.submit(i, request) {
                self.results[i] = Some(Err(refused.error));
            }
        }
        Ok(Fill::Done)
    }

    fn text(&mut self, &mut i: &mut usize, text: &str) -> Result<(), Infallible> {
        (self.on_text)(i, text);
        Ok(())
    }

    fn finished(
        &mut self,
        i: usize,
        result: Result<Response, RequestError>,
    ) -> Result<(), Infallible> {
        self.results[i] = Some(result);
        Ok(())
    }
}
