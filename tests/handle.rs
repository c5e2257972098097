//! The engine on its own thread, reached through handles as the HTTP server reaches it: each
//! request's text and result go to its own sink; a sink whose reader went away cancels its
//! request, waiting, running or still in the channel; the actor answers status between steps
//! and passes on announcements of the next round of calls.

mod common;

use common::TinyLlama;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use throng::engine::{
    Engine, EngineConfig, EngineHandle, KvPolicy, Message, Prompt, Request, RequestError, Response,
    SamplingParams, Sink,
};

fn engine(dir: &std::path::Path, cfg: EngineConfig) -> Engine {
    common::engine(dir.to_str().unwrap(), cfg)
}

/// Joins a request's deltas and sends them with its result.
struct Collect {
    index: usize,
    text: String,
    out: mpsc::Sender<(usize, String, Result<Response, RequestError>)>,
}

impl Sink for Collect {
    fn text(&mut self, delta: &str) {
        self.text.push_str(delta);
    }

    fn done(self: Box<Self>, result: Result<Response, RequestError>) {
        let _ = self.out.send((self.index, self.text, result));
    }

    fn cancelled(&self) -> bool {
        false
    }
}

/// A reader that goes away after its first delta (or before anything, if `gone`), as an
/// HTTP client closing its connection. The actor dropping it closes `dropped`.
struct Leaves {
    gone: bool,
    answered: Arc<AtomicBool>,
    _dropped: mpsc::Sender<()>,
}

impl Leaves {
    /// The sink, whether it was answered, and what ends once the actor lets go of it.
    fn new(gone: bool) -> (Box<Self>, Arc<AtomicBool>, mpsc::Receiver<()>) {
        let answered = Arc::new(AtomicBool::new(false));
        let (tx, dropped) = mpsc::channel();
        let sink = Box::new(Leaves {
            gone,
            answered: Arc::clone(&answered),
            _dropped: tx,
        });
        (sink, answered, dropped)
    }
}

impl Sink for Leaves {
    fn text(&mut self, _delta: &str) {
        self.gone = true;
    }

    fn done(self: Box<Self>, _result: Result<Response, RequestError>) {
        self.answered.store(true, Ordering::SeqCst);
    }

    fn cancelled(&self) -> bool {
        self.gone
    }
}

/// A reply that streams from the first step (a grammar forces its opening) and takes far
/// more steps than that to finish.
fn long_request() -> Request {
    Request::chat(vec![Message::user("why?")])
        .with_schema(
            json!({"type": "object", "properties": {"reason": {"type": "string", "minLength": 300}},
                            "required": ["reason"]}),
        )
        .with_max_tokens(400)
}

fn short_request() -> Request {
    Request::chat(vec![Message::user("hi")]).with_max_tokens(4)
}

#[test]
fn a_dropped_sink_cancels_its_request_and_frees_its_blocks() {
    let dir = common::tiny_model(&TinyLlama::default());
    let (handle, thread) = EngineHandle::spawn(engine(dir.path(), EngineConfig::default()));
    let (sink, answered, dropped) = Leaves::new(false);
    handle.send(long_request(), sink);
    // Ends once the actor drops the sink: after cancelling its request (or answering it).
    assert!(dropped.recv().is_err());
    let status = handle.status().unwrap();
    assert_eq!(
        (
            status.running,
            status.waiting,
            status.cancelled,
            status.finished
        ),
        (0, 0, 1, 0),
        "{status:?}"
    );
    assert!(!answered.load(Ordering::SeqCst));
    assert!(
        status.generated_tokens < 300,
        "it stopped long before its end: {status:?}"
    );
    // The engine goes on serving.
    handle.generate(short_request()).unwrap();
    assert_eq!(handle.status().unwrap().finished, 1);
    drop(handle);
    let engine = thread.join().unwrap();
    assert_eq!(engine.num_free_kv_blocks(), engine.num_kv_blocks());
}

#[test]
fn a_request_whose_reader_left_before_the_engine_took_it_never_runs() {
    let dir = common::tiny_model(&TinyLlama::default());
    let (handle, thread) = EngineHandle::spawn(engine(dir.path(), EngineConfig::default()));
    let (sink, answered, dropped) = Leaves::new(true);
    handle.send(long_request(), sink);
    assert!(dropped.recv().is_err());
    let status = handle.status().unwrap();
    assert_eq!(
        (status.cancelled, status.steps, status.prompt_tokens),
        (1, 0, 0),
        "{status:?}"
    );
    assert!(!answered.load(Ordering::SeqCst));
    drop(handle);
    thread.join().unwrap();
}

#[test]
fn streamed_deltas_through_a_sink_join_to_the_reply() {
    let dir = common::tiny_model(&TinyLlama {
        tie_word_embeddings: false,
        ..TinyLlama::default()
    });
    // Constrained (text forced at submit), sampled, with a stop string, cut by max_tokens.
    let schema =
        json!({"type": "object", "properties": {"bid": {"type": "integer"}}, "required": ["bid"]});
    let requests: Vec<Request> = (0..12u64)
        .map(|i| {
            let r = Request::chat(vec![Message::user(format!("Agent {i}, your move?"))])
                .with_max_tokens(8 + i as usize * 3)
                .with_sampling(SamplingParams {
                    temperature: 1.0,
                    seed: i,
                    ..SamplingParams::default()
                });
            match i % 3 {
                0 => r.with_schema(schema.clone()),
                1 => Request {
                    stop: vec!["e".into(), "\n\n".into()],
                    ..r
                },
                _ => r,
            }
        })
        .collect();
    let expected = engine(dir.path(), EngineConfig::default()).generate(requests.clone());
    let (handle, thread) = EngineHandle::spawn(engine(dir.path(), EngineConfig::default()));
    let (out, results) = mpsc::channel();
    for (index, r) in requests.into_iter().enumerate() {
        let sink = Collect {
            index,
            text: String::new(),
            out: out.clone(),
        };
        handle.send(r, Box::new(sink));
    }
    drop(out);
    let mut got: Vec<_> = results.iter().collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got.len(), expected.len());
    for ((i, streamed, result), expected) in got.into_iter().zip(expected) {
        let r = result.unwrap();
        assert_eq!(streamed, r.text, "request {i}");
        assert_eq!(r.token_ids, expected.unwrap().token_ids, "request {i}");
    }
    let status = handle.status().unwrap();
    assert_eq!((status.finished, status.running), (12, 0), "{status:?}");
    drop(handle);
    thread.join().unwrap();
}

#[test]
fn a_refused_request_is_answered_through_its_sink() {
    let dir = common::tiny_model(&TinyLlama::default());
    let (handle, thread) = EngineHandle::spawn(engine(dir.path(), EngineConfig::default()));
    let (out, results) = mpsc::channel();
    let sink = Collect {
        index: 0,
        text: String::new(),
        out,
    };
    handle.send(Request::chat(vec![]), Box::new(sink));
    let (_, _, result) = results.recv().unwrap();
    assert_eq!(result.unwrap_err(), RequestError::EmptyMessages);
    drop(handle);
    thread.join().unwrap();
}

/// Callers once per round, in the same order, each prompt its previous prompt and reply
/// followed by new tokens, through a handle or in process; prompt tokens found in the cache
/// and every reply.
fn rounds(engine: Engine, through_handle: bool, announce: bool) -> (u64, Vec<Vec<u32>>) {
    const CALLERS: usize = 8;
    let tokens = |seed: usize, n: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((seed * 131 + i * 17) % 250) as u32)
            .collect()
    };
    let key = |c: usize| format!("caller {c}");
    let mut contexts: Vec<Vec<u32>> = (0..CALLERS).map(|_| tokens(0, 32)).collect();
    let mut replies = Vec::new();
    let mut run_round = |round: usize, send: &mut dyn FnMut(Vec<Request>) -> Vec<Vec<u32>>| {
        let requests = contexts
            .iter_mut()
            .enumerate()
            .map(|(c, ctx)| {
                ctx.extend(tokens(1 + round * CALLERS + c, 16));
                Request::new(Prompt::Tokens(ctx.clone()))
                    .with_max_tokens(8)
                    .with_retention_key(key(c))
            })
            .collect();
        let got = send(requests);
        for (ctx, reply) in contexts.iter_mut().zip(&got) {
            ctx.extend(reply);
        }
        replies.extend(got);
    };
    let keys: Vec<String> = (0..CALLERS).map(key).collect();
    if through_handle {
        let (handle, thread) = EngineHandle::spawn(engine);
        for round in 0..4 {
            if announce {
                handle.expect_calls(keys.clone());
            }
            run_round(round, &mut |requests| {
                let pending: Vec<_> = requests.into_iter().map(|r| handle.submit(r)).collect();
                pending
                    .into_iter()
                    .map(|p| p.wait().unwrap().token_ids)
                    .collect()
            });
        }
        let cached = handle.status().unwrap().cached_tokens;
        drop(handle);
        thread.join().unwrap();
        (cached, replies)
    } else {
        let mut engine = engine;
        for round in 0..4 {
            if announce {
                engine.expect_calls(&keys);
            }
            run_round(round, &mut |requests| {
                engine
                    .generate(requests)
                    .into_iter()
                    .map(|r| r.unwrap().token_ids)
                    .collect()
            });
        }
        (engine.totals().cache.hit_tokens, replies)
    }
}

#[test]
fn calls_announced_through_a_handle_keep_what_they_keep_in_process() {
    // A cache too small for every caller's history, callers one at a time (as
    // tests/kv_retention.rs): announcing them keeps histories that LRU order evicts.
    let spec = TinyLlama::default();
    let dir = common::tiny_model(&spec);
    let block_bytes =
        2 * spec.num_layers * 16 * spec.num_kv_heads * (spec.hidden_size / spec.num_heads) * 2;
    let tight = || {
        engine(
            dir.path(),
            EngineConfig {
                kv_memory: Some(24 * block_bytes),
                kv_policy: KvPolicy::NextCall,
                max_seqs: 1,
                ..EngineConfig::default()
            },
        )
    };
    let (in_process, replies) = rounds(tight(), false, true);
    let (through_handle, handle_replies) = rounds(tight(), true, true);
    let (unannounced, _) = rounds(tight(), true, false);
    assert_eq!(handle_replies, replies);
    assert_eq!(through_handle, in_process);
    assert!(
        through_handle > unannounced,
        "announced {through_handle} cached prompt tokens, unannounced {unannounced}"
    );
}
