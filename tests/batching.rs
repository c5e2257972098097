//! Continuous batching: a sequence's output does not depend on who shares its batch, on the
//! prefix cache, on memory pressure, or on which thread submitted it; with the KV cache in f32
//! and in `auto`'s f16 alike.

mod common;

use common::TinyLlama;
use serde_json::json;
use throng::engine::{
    Client, Engine, EngineConfig, EngineHandle, Fill, Message, Queue, Request, RequestError,
    Response,
};
use throng::model::{KvFormat, WeightFormat};

fn requests(n: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let r = Request::chat(vec![
                Message::system("You are agent in a market. Reply with your move."),
                Message::user(format!("Agent {i}, state {}: what now?", "x".repeat(i % 7))),
            ])
            .with_max_tokens(12 + i % 9);
            if i % 3 == 0 {
                r.with_schema(json!({"type": "object", "properties": {"bid": {"type": "integer", "minimum": 0, "maximum": 99}},
                                     "required": ["bid"], "additionalProperties": false}))
            } else {
                r
            }
        })
        .collect()
}

fn tokens(results: Vec<Result<Response, RequestError>>) -> Vec<Vec<u32>> {
    results.into_iter().map(|r| r.unwrap().token_ids).collect()
}

fn engine(dir: &std::path::Path, cfg: EngineConfig) -> Engine {
    common::engine(dir.to_str().unwrap(), cfg)
}

/// An engine of `weights` whose KV cache is in `kv`, whatever `cfg` says.
fn engine_with(
    dir: &std::path::Path,
    cfg: EngineConfig,
    weights: WeightFormat,
    kv: KvFormat,
) -> Engine {
    let cfg = EngineConfig {
        kv_format: kv,
        ..cfg
    };
    common::engine_with(dir.to_str().unwrap(), cfg, weights)
}

/// The KV formats every engine property is held to: what `auto` picks, and f32.
const KV_FORMATS: [KvFormat; 2] = [KvFormat::Auto, KvFormat::F32];

#[test]
fn greedy_outputs_do_not_depend_on_who_shares_the_batch() {
    for weights in common::CPU_FORMATS {
        for kv in KV_FORMATS {
            outputs_do_not_depend_on_who_shares_the_batch(weights, kv);
        }
    }
}

fn outputs_do_not_depend_on_who_shares_the_batch(weights: WeightFormat, kv: KvFormat) {
    let dir = common::tiny_model(&TinyLlama::default());
    let n = 32;
    let engine = |dir: &std::path::Path, cfg| engine_with(dir, cfg, weights, kv);
    let all_at_once = tokens(engine(dir.path(), EngineConfig::default()).generate(requests(n)));

    let mut alone = engine(dir.path(), EngineConfig::default());
    let one_at_a_time: Vec<Vec<u32>> = requests(n)
        .into_iter()
        .map(|r| tokens(alone.generate(vec![r])).remove(0))
        .collect();
    assert_eq!(one_at_a_time, all_at_once);

    // Staggered: a few requests arrive every step while others are mid-decode, and a small
    // token budget splits prompts into chunks.
    let mut staggered = engine(
        dir.path(),
        EngineConfig {
            max_batch_tokens: Some(40),
            ..EngineConfig::default()
        },
    );
    let mut arrivals = Staggered {
        pending: requests(n).into_iter().enumerate().collect(),
        done: vec![None; n],
    };
    staggered.run(usize::MAX, &mut arrivals).unwrap();
    let staggered: Vec<Vec<u32>> = arrivals.done.into_iter().map(Option::unwrap).collect();
    assert_eq!(staggered, all_at_once, "{weights:?}, KV {kv:?}");
}

/// Three more requests before every step, whatever is running.
struct Staggered {
    pending: std::collections::VecDeque<(usize, Request)>,
    done: Vec<Option<Vec<u32>>>,
}

impl Client for Staggered {
    type Key = usize;
    type Error = RequestError;

    fn fill(&mut self, queue: &mut Queue<'_, usize>) -> Result<Fill, RequestError> {
        for (i, r) in self.pending.drain(..self.pending.len().min(3)) {
            queue.submit(i, r).map_err(|refused| refused.error)?;
        }
        Ok(if self.pending.is_empty() {
            Fill::Done
        } else {
            Fill::More
        })
    }

    fn finished(
        &mut self,
        i: usize,
        r: Result<Response, RequestError>,
    ) -> Result<(), RequestError> {
        self.done[i] = Some(r?.token_ids);
        Ok(())
    }
}

#[test]
fn prefix_caching_changes_nothing_but_the_work_done() {
    for weights in common::CPU_FORMATS {
        for kv in KV_FORMATS {
            prefix_caching_changes_nothing(weights, kv);
        }
    }
}

fn prefix_caching_changes_nothing(weights: WeightFormat, kv: KvFormat) {
    let dir = common::tiny_model(&TinyLlama::default());
    let engine = |dir: &std::path::Path, cfg| engine_with(dir, cfg, weights, kv);
    let without = engine(
        dir.path(),
        EngineConfig {
            prefix_caching: false,
            ..EngineConfig::default()
        },
    )
    .generate(requests(24));
    let mut cached_engine = engine(dir.path(), EngineConfig::default());
    let with = cached_engine.generate(requests(24));
    assert_eq!(tokens(with), tokens(without), "{weights:?}, KV {kv:?}");
    assert!(
        cached_engine.totals().prefix_hit_rate() > 0.3,
        "{:?}",
        cached_engine.totals().cache
    );
}

#[test]
fn the_second_of_two_requests_sharing_a_100_token_prefix_reuses_it() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut engine = engine(dir.path(), EngineConfig::default());
    let prefix: Vec<u32> = (0..100).map(|i| (i * 13 % 250) as u32).collect();
    let req = |tail: u32| {
        Request::new(throng::engine::Prompt::Tokens(
            [prefix.clone(), vec![tail, tail + 1, tail + 2]].concat(),
        ))
        .with_max_tokens(4)
    };
    let results = engine.generate(vec![req(1), req(7)]);
    let (first, second) = (results[0].as_ref().unwrap(), results[1].as_ref().unwrap());
    assert_eq!(first.cached_tokens, 0);
    assert!(
        second.cached_tokens >= 96,
        "cached {}",
        second.cached_tokens
    );
}

#[test]
fn a_kv_cache_too_small_for_everyone_still_finishes_everyone_identically() {
    for weights in common::CPU_FORMATS {
        for kv in KV_FORMATS {
            preemption_changes_nothing(weights, kv);
        }
    }
}

fn preemption_changes_nothing(weights: WeightFormat, kv: KvFormat) {
    let spec = TinyLlama::default();
    let dir = common::tiny_model(&spec);
    let engine = |dir: &std::path::Path, cfg| engine_with(dir, cfg, weights, kv);
    let roomy = tokens(engine(dir.path(), EngineConfig::default()).generate(requests(16)));
    // Room for 12 blocks of 16 tokens: prompts take 7, so one or two sequences at a time.
    // `auto` keeps keys and values in 2 bytes on the CPU (f16, or bf16 for bf16 weights).
    let element_bytes = if kv == KvFormat::F32 { 4 } else { 2 };
    let block_bytes = 2
        * spec.num_layers
        * 16
        * spec.num_kv_heads
        * (spec.hidden_size / spec.num_heads)
        * element_bytes;
    let mut tight = engine(
        dir.path(),
        EngineConfig {
            kv_memory: Some(12 * block_bytes),
            ..EngineConfig::default()
        },
    );
    assert_eq!(tight.num_kv_blocks(), 12);
    let squeezed = tokens(tight.generate(requests(16)));
    assert_eq!(squeezed, roomy, "{weights:?}, KV {kv:?}");
    assert!(
        tight.totals().preemptions > 0,
        "the small cache forces preemption"
    );
}

#[test]
fn bad_requests_fail_alone() {
    let dir = common::tiny_model(&TinyLlama {
        max_position_embeddings: 128,
        ..TinyLlama::default()
    });
    let mut engine = engine(dir.path(), EngineConfig::default());
    let mut batch = requests(3);
    batch.insert(1, Request::chat(vec![]));
    batch.insert(2, Request::chat(vec![Message::user("y".repeat(500))]));
    let results = engine.generate(batch);
    assert!(matches!(
        results[1],
        Err(throng::engine::RequestError::EmptyMessages)
    ));
    assert!(matches!(
        results[2],
        Err(throng::engine::RequestError::PromptTooLong { .. })
    ));
    assert!(results[0].is_ok() && results[3].is_ok() && results[4].is_ok());
}

#[test]
fn requests_from_many_threads_join_one_batch_and_get_their_own_replies() {
    let dir = common::tiny_model(&TinyLlama::default());
    let expected = tokens(engine(dir.path(), EngineConfig::default()).generate(requests(16)));
    let (handle, thread) = EngineHandle::spawn(engine(dir.path(), EngineConfig::default()));
    let got: Vec<Vec<u32>> = std::thread::scope(|s| {
        let workers: Vec<_> = requests(16)
            .into_iter()
            .map(|r| {
                let h = handle.clone();
                s.spawn(move || h.generate(r).unwrap().token_ids)
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(got, expected);
    drop(handle);
    let engine = thread.join().unwrap();
    assert!(
        engine.totals().steps < 16 * 12,
        "the threads' requests were batched together"
    );
}

/// Queues `requests` at once and records every streamed delta beside each result.
struct Recorder {
    requests: Option<Vec<Request>>,
    streamed: Vec<String>,
    results: Vec<Option<Result<Response, RequestError>>>,
}

impl Client for Recorder {
    type Key = usize;
    type Error = RequestError;

    fn fill(&mut self, queue: &mut Queue<'_, usize>) -> Result<Fill, RequestError> {
        for (i, r) in self.requests.take().into_iter().flatten().enumerate() {
            queue.submit(i, r).map_err(|refused| refused.error)?;
        }
        Ok(Fill::Done)
    }

    fn text(&mut self, &mut i: &mut usize, text: &str) -> Result<(), RequestError> {
        self.streamed[i].push_str(text);
        Ok(())
    }

    fn finished(
        &mut self,
        i: usize,
        r: Result<Response, RequestError>,
    ) -> Result<(), RequestError> {
        self.results[i] = Some(r);
        Ok(())
    }
}

/// Each request's streamed text (its deltas joined) and its result.
fn streamed_results(
    engine: &mut Engine,
    requests: Vec<Request>,
) -> Vec<(String, Result<Response, RequestError>)> {
    let n = requests.len();
    let mut recorder = Recorder {
        requests: Some(requests),
        streamed: vec![String::new(); n],
        results: vec![None; n],
    };
    engine.run(usize::MAX, &mut recorder).unwrap();
    recorder
        .streamed
        .into_iter()
        .zip(recorder.results.into_iter().map(Option::unwrap))
        .collect()
}

/// Each request's streamed text and its response.
fn streamed(engine: &mut Engine, requests: Vec<Request>) -> Vec<(String, Response)> {
    streamed_results(engine, requests)
        .into_iter()
        .map(|(streamed, r)| (streamed, r.unwrap()))
        .collect()
}

#[test]
fn streamed_text_of_a_constrained_reply_equals_its_text() {
    // A grammar forces a reply's opening (`{"bid": `) at submit, before any step: a stream
    // must carry it as the response does, whether the reply completes or runs out of tokens.
    let dir = common::tiny_model(&TinyLlama::default());
    let mut engine = engine(dir.path(), EngineConfig::default());
    let mut batch = requests(9);
    batch.push(
        Request::chat(vec![Message::user("why?")])
            .with_schema(json!({"type": "object", "properties": {"reason": {"type": "string", "minLength": 40}},
                                "required": ["reason"]}))
            .with_max_tokens(20),
    );
    let got = streamed(&mut engine, batch);
    assert!(
        got.iter().any(|(_, r)| r.value.is_some()),
        "a reply completed its schema"
    );
    assert_eq!(got[9].1.finish_reason, throng::engine::FinishReason::Length);
    for (i, (streamed, r)) in got.iter().enumerate() {
        assert_eq!(streamed, &r.text, "request {i}");
    }
}

#[test]
fn a_stop_string_is_never_streamed() {
    let dir = common::tiny_model(&TinyLlama {
        tie_word_embeddings: false,
        ..TinyLlama::default()
    });
    let mut engine = engine(dir.path(), EngineConfig::default());
    let plain: Vec<Request> = (0..12u64)
        .map(|i| {
            // Sampled, seeded: the greedy tiny model repeats one character.
            Request::chat(vec![Message::user(format!("Agent {i}, tell me a story."))])
                .with_max_tokens(48)
                .with_sampling(throng::engine::SamplingParams {
                    temperature: 1.0,
                    seed: i,
                    ..Default::default()
                })
        })
        .collect();
    // Stops the model's own replies contain: 1 to 4 characters from the middle of each.
    let mut cases = Vec::new();
    for (i, r) in engine.generate(plain.clone()).into_iter().enumerate() {
        let text = r.unwrap().text;
        // Random bytes: the stop is taken where no byte is invalid UTF-8.
        let chars: Vec<char> = text.chars().collect();
        let len = 1 + i % 4;
        let Some(stop) = (chars.len() / 3..chars.len().saturating_sub(len))
            .map(|at| chars[at..at + len].iter().collect::<String>())
            .find(|stop| !stop.contains('\u{fffd}'))
        else {
            continue;
        };
        let cut = text.find(&stop).unwrap();
        // A second, longer stop that never comes widens what must be held back.
        let mut request = plain[i].clone();
        request.stop = vec![stop.clone(), "\u{1}a stop that never comes".into()];
        cases.push((request, stop, text[..cut].to_string()));
    }
    assert!(cases.len() >= 8, "the replies give stops: {}", cases.len());
    let (stopped, stops): (Vec<Request>, Vec<(String, String)>) = cases
        .into_iter()
        .map(|(request, stop, text)| (request, (stop, text)))
        .unzip();
    let got = streamed(&mut engine, stopped);
    for ((streamed, r), (stop, text)) in got.iter().zip(&stops) {
        assert_eq!(r.finish_reason, throng::engine::FinishReason::Stop);
        assert_eq!(&r.text, text, "the reply is cut before {stop:?}");
        assert!(
            !streamed.contains(stop.as_str()),
            "{stop:?} streamed in {streamed:?}"
        );
        assert_eq!(streamed, &r.text);
    }
    // A constrained reply ignores its stop strings (cut, its JSON would not parse): even
    // one inside the opening the grammar forces at submit is generated and streamed.
    let forced_stop = requests(1).remove(0).with_max_tokens(8);
    let forced_stop = Request {
        stop: vec!["bid".into()],
        ..forced_stop
    };
    let (streamed, r) = streamed_results(&mut engine, vec![forced_stop]).remove(0);
    let r = r.unwrap();
    assert!(r.text.contains("bid"), "{r:?}");
    assert_eq!(streamed, r.text);
}

/// Queues every request at once, then before each step cancels those `cancel` picks (by
/// the fill's number, the request's index and its text so far); records what each gets.
struct Cancelling<F> {
    requests: Option<Vec<Request>>,
    cancel: F,
    fills: usize,
    cancelled: Vec<bool>,
    streamed: Vec<String>,
    results: Vec<Option<Result<Response, RequestError>>>,
    /// Text or a result delivered for a request after it was cancelled.
    late: Vec<usize>,
}

impl<F: FnMut(usize, usize, &str) -> bool> Cancelling<F> {
    fn new(requests: Vec<Request>, cancel: F) -> Self {
        let n = requests.len();
        Self {
            requests: Some(requests),
            cancel,
            fills: 0,
            cancelled: vec![false; n],
            streamed: vec![String::new(); n],
            results: vec![None; n],
            late: Vec::new(),
        }
    }
}

impl<F: FnMut(usize, usize, &str) -> bool> Client for Cancelling<F> {
    type Key = usize;
    type Error = RequestError;

    fn fill(&mut self, queue: &mut Queue<'_, usize>) -> Result<Fill, RequestError> {
        let fill = self.fills;
        self.fills += 1;
        for (i, r) in self.requests.take().into_iter().flatten().enumerate() {
            queue.submit(i, r).map_err(|refused| refused.error)?;
        }
        if fill > 0 {
            let mut picked = Vec::new();
            let mut gone = queue.cancel_where(|&i| {
                let pick = (self.cancel)(fill, i, &self.streamed[i]);
                if pick {
                    picked.push(i);
                }
                pick
            });
            gone.sort_unstable();
            picked.sort_unstable();
            assert_eq!(gone, picked);
            for i in picked {
                self.cancelled[i] = true;
            }
        }
        // Asked before every step while anything runs, so that a cancellation can come late.
        Ok(if queue.idle() { Fill::Done } else { Fill::More })
    }

    fn text(&mut self, &mut i: &mut usize, text: &str) -> Result<(), RequestError> {
        if self.cancelled[i] {
            self.late.push(i);
        }
        self.streamed[i].push_str(text);
        Ok(())
    }

    fn finished(
        &mut self,
        i: usize,
        r: Result<Response, RequestError>,
    ) -> Result<(), RequestError> {
        if self.cancelled[i] {
            self.late.push(i);
        }
        self.results[i] = Some(r);
        Ok(())
    }
}

#[test]
fn a_cancelled_request_is_never_stepped_or_answered() {
    let dir = common::tiny_model(&TinyLlama::default());
    // Two run at once: requests 2 and 3 wait.
    let mut engine = engine(
        dir.path(),
        EngineConfig {
            max_seqs: 2,
            ..EngineConfig::default()
        },
    );
    let batch: Vec<Request> = (0..4)
        .map(|i| Request::chat(vec![Message::user(format!("Agent {i}?"))]).with_max_tokens(24))
        .collect();
    let prompt_of_1 = engine.prompt_tokens(&batch[1].prompt).unwrap().len();
    // 3 while it waits, 1 once it has streamed something.
    let mut client = Cancelling::new(batch, |_, i, streamed: &str| {
        i == 3 || (i == 1 && !streamed.is_empty())
    });
    engine.run(usize::MAX, &mut client).unwrap();
    assert_eq!(client.cancelled, [false, true, false, true]);
    assert!(
        client.late.is_empty(),
        "answered after cancel: {:?}",
        client.late
    );
    assert!(client.results[1].is_none() && client.results[3].is_none());
    assert!(client.streamed[3].is_empty());
    let answered: Vec<Response> = [0, 2]
        .map(|i| client.results[i].take().unwrap().unwrap())
        .into();
    // The waiting one was never admitted: no prompt tokens but the others' were looked up.
    let admitted: usize = answered.iter().map(|r| r.prompt_tokens).sum::<usize>() + prompt_of_1;
    assert_eq!(engine.totals().cache.queried_tokens, admitted as u64);
    assert_eq!(engine.num_free_kv_blocks(), engine.num_kv_blocks());
}

#[test]
fn cancelling_requests_changes_no_other_reply_in_their_batch() {
    let spec = TinyLlama::default();
    let dir = common::tiny_model(&spec);
    // (request, fill before whose step it is cancelled): waiting, mid-prefill or decoding.
    let plan = [(1, 1), (2, 3), (5, 6), (11, 9)];
    let keep: Vec<usize> = (0..16).filter(|i| plan.iter().all(|p| p.0 != *i)).collect();
    let alone = tokens(
        engine(dir.path(), EngineConfig::default()).generate(
            requests(16)
                .into_iter()
                .enumerate()
                .filter(|(i, _)| keep.contains(i))
                .map(|(_, r)| r)
                .collect(),
        ),
    );
    // 12 blocks of 16 tokens (f16 keys and values), where requests preempt each other, and a
    // small token budget, where prompts run in chunks.
    let block_bytes =
        2 * spec.num_layers * 16 * spec.num_kv_heads * (spec.hidden_size / spec.num_heads) * 2;
    let configs = [
        EngineConfig::default(),
        EngineConfig {
            kv_memory: Some(12 * block_bytes),
            ..EngineConfig::default()
        },
        EngineConfig {
            max_batch_tokens: Some(40),
            ..EngineConfig::default()
        },
    ];
    for cfg in configs {
        let mut engine = engine(dir.path(), cfg.clone());
        let mut client =
            Cancelling::new(requests(16), |fill, i, _: &str| plan.contains(&(i, fill)));
        engine.run(usize::MAX, &mut client).unwrap();
        let cancelled: Vec<usize> = (0..16).filter(|&i| client.cancelled[i]).collect();
        assert_eq!(cancelled, [1, 2, 5, 11], "{cfg:?}");
        assert!(client.late.is_empty(), "{cfg:?}: {:?}", client.late);
        let kept = tokens(
            keep.iter()
                .map(|&i| client.results[i].take().unwrap())
                .collect(),
        );
        assert_eq!(kept, alone, "{cfg:?}");
        assert_eq!(engine.num_free_kv_blocks(), engine.num_kv_blocks());
        if cfg.kv_memory.is_some() {
            assert!(engine.totals().preemptions > 0, "the small cache preempts");
        }
    }
}
