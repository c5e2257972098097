//! `throng api` over HTTP, in process, on a tiny random model: OpenAI's request and reply
//! shapes, its error objects, the key and Host checks, constrained replies and tool calls,
//! streaming, admission under overload, a client that goes away, and replies that do not
//! depend on how many clients ask at once.

mod common;

use common::TinyLlama;
use common::api::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};
use throng::api::{ApiOptions, ApiServer, Served};
use throng::engine::{EngineConfig, EngineHandle, Message, Request, SamplingParams};

#[test]
fn only_this_hosts_requests_with_the_key_are_answered() {
    let api = start(256);
    let url = format!("{}/models", api.base);
    let status = |r: Result<ureq::Response, ureq::Error>| match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status(ureq::get(&url).call()), 401, "no key");
    assert_eq!(
        status(ureq::get(&url).set("Authorization", "Bearer nope").call()),
        401
    );
    assert_eq!(
        status(
            ureq::get(&url)
                .set("Authorization", &format!("Bearer {KEY}"))
                .set("Host", "evil.example")
                .call()
        ),
        403,
        "a rebound name"
    );
    assert_eq!(
        status(
            ureq::get(&url)
                .set("Authorization", &format!("Bearer {KEY}"))
                .call()
        ),
        200
    );
}

#[test]
fn a_public_server_needs_a_key_and_loopback_is_the_default() {
    let model = common::tiny_model(&TinyLlama::default());
    let engine = common::engine(model.path().to_str().unwrap(), engine_config());
    let encoder = engine.prompt_encoder().clone();
    let (handle, _thread) = EngineHandle::spawn(engine);
    let options = |addr: &str, public: bool| ApiOptions {
        addr: addr.parse().unwrap(),
        public,
        key: None,
        ..options(8)
    };
    let served = || {
        vec![Served {
            name: "tiny".into(),
            handle: handle.clone(),
            encoder: encoder.clone(),
            max_seqs: 8,
        }]
    };
    let e = ApiServer::bind(options("0.0.0.0:0", false), served())
        .err()
        .unwrap();
    assert!(e.to_string().contains("--public"), "{e}");
    let e = ApiServer::bind(options("0.0.0.0:0", true), served())
        .err()
        .unwrap();
    assert!(e.to_string().contains("--api-key"), "{e}");
    let server = ApiServer::bind(options("127.0.0.1:0", false), served()).unwrap();
    assert!(server.key().len() >= 32, "a random key when none is given");
}

#[test]
fn errors_are_openai_error_objects_with_their_status() {
    let api = start(256);
    let mut unknown = chat("hi");
    unknown["frobnicate"] = json!(1);
    let (status, body) = post(&api, "/chat/completions", &unknown);
    assert_eq!(status, 400);
    assert!(error_of(&body).0.contains("frobnicate"), "{body}");

    let mut other = chat("hi");
    other["model"] = json!("gpt-4o");
    let (status, body) = post(&api, "/chat/completions", &other);
    assert_eq!(
        (status, error_of(&body).2),
        (404, Some("model_not_found")),
        "{body}"
    );
    assert!(
        error_of(&body).0.contains("tiny"),
        "names what is served: {body}"
    );

    let mut ignored = chat("hi");
    ignored["frequency_penalty"] = json!(3.0);
    let (status, body) = post(&api, "/chat/completions", &ignored);
    assert_eq!(
        (status, error_of(&body).1),
        (400, Some("frequency_penalty")),
        "{body}"
    );

    let mut image = chat("hi");
    image["messages"][1]["content"] = json!([{"type": "image_url", "image_url": {"url": "x"}}]);
    let (status, body) = post(&api, "/chat/completions", &image);
    assert_eq!(
        (status, error_of(&body).1),
        (400, Some("messages[1].content[0].type")),
        "{body}"
    );

    let mut long = chat(&"word ".repeat(5000));
    long["max_tokens"] = json!(4);
    let (status, body) = post(&api, "/chat/completions", &long);
    assert_eq!(
        (status, error_of(&body).2),
        (400, Some("context_length_exceeded")),
        "{body}"
    );

    // max_tokens above the server's limit is held to it (Concordia asks 5000).
    let mut many = chat("hi");
    many["max_tokens"] = json!(5000);
    let (status, body) = post(&api, "/chat/completions", &many);
    assert_eq!(status, 200, "{body}");
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 1000);

    // Settings for reasoning models, which Concordia sends: accepted at OpenAI's values.
    let mut reasoning = chat("hi");
    reasoning["reasoning_effort"] = json!("minimal");
    reasoning["verbosity"] = json!("low");
    assert_eq!(post(&api, "/chat/completions", &reasoning).0, 200);
    reasoning["reasoning_effort"] = json!("extreme");
    let (status, body) = post(&api, "/chat/completions", &reasoning);
    assert_eq!(
        (status, error_of(&body).1),
        (400, Some("reasoning_effort")),
        "{body}"
    );

    let (status, body) = post(&api, "/nothing", &json!({}));
    assert_eq!(status, 404, "{body}");
    error_of(&body);
}

#[test]
fn models_lists_every_served_model() {
    let api = start(256);
    let (status, body) = get(&api, "/models");
    assert_eq!(status, 200);
    assert_eq!(body["data"][0]["id"], "tiny");
    assert_eq!(get(&api, "/models/tiny").1["id"], "tiny");
    assert_eq!(get(&api, "/models/other").0, 404);
}

#[test]
fn a_completion_over_http_gives_the_engines_own_tokens() {
    let api = start(256);
    let (status, body) = post(&api, "/chat/completions", &chat("what now?"));
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();

    let model = common::tiny_model(&TinyLlama::default());
    let mut engine = common::engine(model.path().to_str().unwrap(), engine_config());
    let direct = engine
        .generate(vec![
            Request::chat(vec![
                Message::system("You are an agent in a market."),
                Message::user("what now?"),
            ])
            .with_max_tokens(16)
            .with_sampling(SamplingParams {
                temperature: 0.8,
                seed: 7,
                ..SamplingParams::default()
            }),
        ])
        .remove(0)
        .unwrap();
    assert_eq!(text, direct.text);
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], direct.prompt_tokens);
    assert_eq!(usage["completion_tokens"], direct.generated_tokens);
    assert_eq!(
        usage["total_tokens"],
        direct.prompt_tokens + direct.generated_tokens
    );
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "tiny");

    // n choices: the first as a request of one with its derived seed.
    let mut three = chat("what now?");
    three["n"] = json!(3);
    let (status, body) = post(&api, "/chat/completions", &three);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"].as_array().unwrap().len(), 3);
    assert_eq!(
        body["usage"]["prompt_tokens"], direct.prompt_tokens,
        "the prompt counted once"
    );
}

#[test]
fn a_request_without_a_seed_draws_anew_when_repeated() {
    let api = start(256);
    let mut body = chat("again?");
    body.as_object_mut().unwrap().remove("seed");
    body["temperature"] = json!(2.0);
    body["max_tokens"] = json!(24);
    let replies: Vec<Value> = (0..3)
        .map(|_| {
            post(&api, "/chat/completions", &body).1["choices"][0]["message"]["content"].clone()
        })
        .collect();
    assert!(
        replies[0] != replies[1] || replies[1] != replies[2],
        "{replies:?}"
    );
}

#[test]
fn a_refused_schema_keyword_is_named_with_its_path() {
    let api = start(256);
    let mut body = chat("tags?");
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}
    }}});
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 400);
    let (message, param, code) = error_of(&reply);
    assert!(
        message.contains("uniqueItems") && message.contains("/properties/tags"),
        "{message}"
    );
    assert_eq!(
        (param, code),
        (Some("response_format"), Some("unsupported_schema_keyword"))
    );
}

fn bid_schema() -> Value {
    json!({"type": "object", "properties": {
        "bid": {"type": "number", "minimum": 1.5, "maximum": 2.25},
        "side": {"enum": ["buy", "sell"]}
    }, "required": ["bid", "side"], "additionalProperties": false})
}

#[test]
fn a_json_schema_reply_satisfies_its_schema_with_float_bounds() {
    let api = start(256);
    let mut body = chat("your bid?");
    body["n"] = json!(8);
    body["temperature"] = json!(1.0);
    body["max_tokens"] = json!(64);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "bid", "strict": true, "schema": bid_schema()}});
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let validator = jsonschema::validator_for(&bid_schema()).unwrap();
    for choice in reply["choices"].as_array().unwrap() {
        if choice["finish_reason"] == "stop" {
            let value: Value =
                serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
            assert!(validator.is_valid(&value), "{value}");
        }
    }
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "post", "description": "Post a message",
         "parameters": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 20}},
                        "required": ["text"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "follow",
         "parameters": {"type": "object", "properties": {"user": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["user"], "additionalProperties": false}}}
    ])
}

#[test]
fn a_tool_choice_required_reply_is_a_tool_call_valid_against_its_parameters() {
    let api = start(256);
    let mut body = chat("act");
    body["tools"] = tools();
    body["tool_choice"] = json!("required");
    body["n"] = json!(6);
    body["max_tokens"] = json!(80);
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let schemas: Vec<Value> = tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["parameters"].clone())
        .collect();
    let mut calls = 0;
    for choice in reply["choices"].as_array().unwrap() {
        if choice["finish_reason"] == "length" {
            continue;
        }
        assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
        assert!(choice["message"]["content"].is_null());
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        let name = call["function"]["name"].as_str().unwrap();
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        let schema = &schemas[if name == "post" { 0 } else { 1 }];
        assert!(
            jsonschema::validator_for(schema)
                .unwrap()
                .is_valid(&arguments),
            "{name} {arguments}"
        );
        calls += 1;
    }
    assert!(calls > 0, "{reply}");

    // A named function: only that one is called.
    body["tool_choice"] = json!({"type": "function", "function": {"name": "follow"}});
    let (_, reply) = post(&api, "/chat/completions", &body);
    for choice in reply["choices"].as_array().unwrap() {
        if choice["finish_reason"] == "tool_calls" {
            assert_eq!(
                choice["message"]["tool_calls"][0]["function"]["name"],
                "follow"
            );
        }
    }

    // Tool calls and results in the history are accepted and answered.
    body["tool_choice"] = json!("auto");
    body["n"] = json!(1);
    body["messages"] = json!([
        {"role": "user", "content": "act"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "follow", "arguments": "{\"user\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "followed"}
    ]);
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert!(
        choice["message"]["tool_calls"].is_array() || choice["message"]["content"].is_string(),
        "{choice}"
    );
}

/// The `data:` payloads of a streamed reply.
fn events(api: &Api, body: &Value) -> Vec<Value> {
    let response = ureq::post(&format!("{}/chat/completions", api.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .send_json(body.clone())
        .unwrap();
    assert!(response.content_type().contains("event-stream"));
    let mut out = Vec::new();
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            if data == "[DONE]" {
                out.push(Value::Null);
            } else {
                out.push(serde_json::from_str(data).unwrap());
            }
        }
    }
    out
}

#[test]
fn streamed_chunks_join_to_the_unstreamed_reply_and_end_with_usage() {
    let api = start(256);
    for format in [None, Some(bid_schema())] {
        let mut body = chat("stream it");
        body["max_tokens"] = json!(40);
        body["stop"] = json!(["zz"]);
        if let Some(schema) = &format {
            body["response_format"] =
                json!({"type": "json_schema", "json_schema": {"name": "bid", "schema": schema}});
        }
        let (_, whole) = post(&api, "/chat/completions", &body);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let events = events(&api, &body);
        assert_eq!(events.last(), Some(&Value::Null), "ends with [DONE]");
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(
            text,
            whole["choices"][0]["message"]["content"].as_str().unwrap()
        );
        let finish = events
            .iter()
            .find_map(|e| e["choices"][0]["finish_reason"].as_str());
        assert_eq!(finish, whole["choices"][0]["finish_reason"].as_str());
        let usage = &events[events.len() - 2];
        assert_eq!(usage["choices"], json!([]));
        // The same counts (the second asking finds the prompt in the prefix cache).
        for count in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(usage["usage"][count], whole["usage"][count], "{count}");
        }
        assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());
    }
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let api = start(2);
    // Two sequences that cannot end before some 800 tokens fill the queue of two.
    let mut long = chat("go on");
    long["n"] = json!(2);
    long["max_tokens"] = json!(900);
    long["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "s", "schema":
        {"type": "object", "properties": {"s": {"type": "string", "minLength": 800}}, "required": ["s"]}}});
    for _attempt in 0..10 {
        let base = api.base.clone();
        let body = long.clone();
        let busy = std::thread::spawn(move || {
            ureq::post(&format!("{base}/chat/completions"))
                .set("Authorization", &format!("Bearer {KEY}"))
                .send_json(body)
                .map(|r| r.status())
                .map_err(|e| e.to_string())
        });
        while get(&api, "/throng/stats").1["admitted"] != 2 && !busy.is_finished() {
            std::thread::yield_now();
        }
        let refused = match ureq::post(&format!("{}/chat/completions", api.base))
            .set("Authorization", &format!("Bearer {KEY}"))
            .send_json(chat("me too"))
        {
            Err(ureq::Error::Status(429, r)) => Some(r),
            Ok(_) => None,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            busy.join().unwrap().unwrap(),
            200,
            "the admitted request finishes"
        );
        // The long request may have ended before the next arrived: then try again.
        if let Some(r) = refused {
            let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
            assert!((1..=60).contains(&wait));
            let body: Value = r.into_json().unwrap();
            assert_eq!(error_of(&body).2, Some("rate_limit_exceeded"));
            return;
        }
    }
    panic!("a request beyond the queue was never refused");
}

#[test]
fn a_client_that_disconnects_frees_its_sequence() {
    let api = start(256);
    let mut body = chat("talk a lot");
    body["max_tokens"] = json!(500);
    body["stream"] = json!(true);
    let text = body.to_string();
    let mut socket = std::net::TcpStream::connect(api.addr).unwrap();
    write!(
        socket,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
        api.addr,
        text.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    let _ = socket.read(&mut first).unwrap();
    drop(socket);
    // Liveness, not speed: the sequence is dropped within a generous deadline.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, stats) = get(&api, "/throng/stats");
        let status = &stats["engines"][0]["status"];
        if stats["admitted"] == 0 && status["running"] == 0 && status["waiting"] == 0 {
            assert_eq!(status["cancelled"], 1, "{stats}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sequence still runs: {stats}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reply's message, without the ids of its tool calls (drawn per completion).
fn message(mut reply: Value) -> Value {
    let mut m = reply["choices"][0]["message"].take();
    if let Some(calls) = m["tool_calls"].as_array_mut() {
        for c in calls {
            c.as_object_mut().unwrap().remove("id");
        }
    }
    m
}

#[test]
fn replies_are_identical_at_1_8_and_64_concurrent_clients() {
    let api = start(1024);
    let bodies: Vec<Value> = (0..64)
        .map(|i| {
            let mut b = chat(&format!("agent {i}: {}", "x".repeat(i % 11)));
            b["seed"] = json!(i);
            b["max_tokens"] = json!(12 + i % 7);
            match i % 3 {
                0 => b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "bid", "schema": bid_schema()}}),
                1 => {
                    b["tools"] = tools();
                    b["tool_choice"] = json!("required");
                    b["max_tokens"] = json!(60);
                }
                _ => {}
            }
            b
        })
        .collect();
    let at = |clients: usize| -> Vec<Value> {
        let chunks: Vec<Vec<(usize, Value)>> = (0..clients)
            .map(|c| {
                bodies
                    .iter()
                    .cloned()
                    .enumerate()
                    .skip(c)
                    .step_by(clients)
                    .collect()
            })
            .collect();
        let mut out = vec![Value::Null; bodies.len()];
        std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|chunk| {
                    let api = &api;
                    s.spawn(move || {
                        chunk
                            .into_iter()
                            .map(|(i, b)| (i, message(post(api, "/chat/completions", &b).1)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for h in handles {
                for (i, m) in h.join().unwrap() {
                    out[i] = m;
                }
            }
        });
        out
    };
    let one = at(1);
    assert!(one.iter().all(|m| m.is_object()), "{one:?}");
    assert_eq!(at(8), one, "8 clients");
    assert_eq!(at(64), one, "64 clients");
}

#[test]
fn an_announced_round_of_callers_reaches_the_engine() {
    let api = start(256);
    let (status, body) = post(
        &api,
        "/throng/expect_calls",
        &json!({"users": ["a", "b", "c"]}),
    );
    assert_eq!((status, &body["expected"]), (200, &json!(3)), "{body}");
    let (status, body) = post(
        &api,
        "/throng/expect_calls",
        &json!({"users": ["a"], "model": "x"}),
    );
    assert_eq!((status, error_of(&body).2), (404, Some("model_not_found")));
    let (status, body) = post(&api, "/throng/expect_calls", &json!({"agents": ["a"]}));
    assert_eq!(status, 400, "{body}");
    // Announced callers are answered as before (an announcement never changes a reply).
    let mut asked = chat("after the announcement");
    asked["user"] = json!("b");
    let (status, reply) = post(&api, "/chat/completions", &asked);
    assert_eq!(status, 200, "{reply}");
}

#[test]
fn each_served_model_answers_the_requests_that_name_it() {
    let dirs = [
        common::tiny_model(&TinyLlama::default()),
        common::tiny_model(&TinyLlama {
            seed: 99,
            tie_word_embeddings: false,
            ..TinyLlama::default()
        }),
    ];
    let served: Vec<Served> = dirs
        .iter()
        .zip(["a", "b"])
        .map(|(dir, name)| {
            let engine = common::engine(dir.path().to_str().unwrap(), engine_config());
            Served {
                name: name.into(),
                encoder: engine.prompt_encoder().clone(),
                handle: EngineHandle::spawn(engine).0,
                max_seqs: 8,
            }
        })
        .collect();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let options = ApiOptions {
        max_tokens: 64,
        ..options(64)
    };
    let server = ApiServer::on(listener, options, served).unwrap();
    let base = server.base_url();
    std::thread::spawn(move || server.serve());
    let api = Api {
        base,
        addr,
        _model: None,
        stop: None,
        served: None,
    };
    let (_, models) = get(&api, "/models");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let reply = |name: &str| {
        let mut body = chat("who are you?");
        body["model"] = json!(name);
        body["max_tokens"] = json!(24);
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["model"], name);
        reply["choices"][0]["message"]["content"].clone()
    };
    assert_ne!(reply("a"), reply("b"), "each model its own weights");
    assert_eq!(reply("a"), reply("a"));
}

#[test]
fn served_names_that_do_not_match_the_models_are_refused() {
    let out = common::cli::throng()
        .args(["api", "--model", "a", "--model", "b", "--served-name", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--served-name is given 1 times for 2 --model"),
        "{err}"
    );
}

fn with_turns(mut body: Value, turns: &[Value]) -> Value {
    body["messages"]
        .as_array_mut()
        .unwrap()
        .extend_from_slice(turns);
    body
}

// Issue 31: a reply sent back re-tokenized from its text (split otherwise than the model
// wrote it, its forced tokens included) left the prefix cache at that reply, and every turn
// of a multi-turn agent computed its whole history again.
#[test]
fn a_reply_sent_back_as_history_is_a_cached_prefix_of_the_next_prompt() {
    let tiny = common::tiny_model(&TinyLlama::default());
    // The tiny model's bytes are spelled one way only (and its template trims what a random
    // model writes around its words); SmolLM2's BPE tokenizer splits text otherwise than a
    // model sampling hot may have written it.
    let api = start_on(tiny.path(), options(256)).unwrap();
    reply_sent_back_is_cached(&api, tiny.path(), 0);
    if let Some(smollm2) = common::smollm2() {
        let api = start_on(&smollm2, options(256)).unwrap();
        reply_sent_back_is_cached(&api, &smollm2, 6);
    }
}

fn reply_sent_back_is_cached(api: &Api, model: &std::path::Path, hot: u64) {
    // A constrained reply (its forced tokens), and free replies sampled hot.
    let mut constrained = chat("what do you bid?");
    constrained["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "bid", "schema": bid_schema()}});
    let free = (0..hot).map(|seed| {
        let mut body = chat("describe the market in a sentence");
        body["temperature"] = json!(1.6);
        body["seed"] = json!(seed);
        body
    });
    let firsts: Vec<Value> = std::iter::once(constrained).chain(free).collect();
    for (k, mut first) in firsts.into_iter().enumerate() {
        first["max_tokens"] = json!(40);
        let (status, one) = post(api, "/chat/completions", &first);
        assert_eq!(status, 200, "{one}");
        let reply = one["choices"][0]["message"]["content"].clone();
        let ran = one["usage"]["prompt_tokens"].as_u64().unwrap()
            + one["usage"]["completion_tokens"].as_u64().unwrap()
            - 1;
        let second = with_turns(
            first.clone(),
            &[
                json!({"role": "assistant", "content": reply}),
                json!({"role": "user", "content": "and in the next round?"}),
            ],
        );
        let (status, two) = post(api, "/chat/completions", &second);
        assert_eq!(status, 200, "{two}");
        let cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        // Every whole block (16 tokens) of the prompt and reply that ran is found.
        assert!(
            cached >= ran / 16 * 16,
            "{}: {cached} tokens cached of the {ran} that ran before: {two}",
            model.display()
        );
        assert_eq!(stats(api)["spliced"], k + 1);
        if k > 0 {
            continue;
        }
        // A reply the client changed is history like any other: rendered from its text.
        let edited = with_turns(
            first,
            &[
                json!({"role": "assistant", "content": "{\"price\": 1}"}),
                json!({"role": "user", "content": "and in the next round?"}),
            ],
        );
        let (status, _) = post(api, "/chat/completions", &edited);
        assert_eq!(status, 200);
        assert_eq!(stats(api)["spliced"], k + 1);
    }
}

/// A session of three agents, two turns each (the second repeats the first's reply, one
/// agent calls a tool, one streams), with no seeds given: the replies, token counts and
/// whether each was computed.
fn session(api: &Api) -> Vec<Value> {
    let mut out = Vec::new();
    for agent in 0..3 {
        let mut body = chat(&format!("agent {agent}: what do you do?"));
        body.as_object_mut().unwrap().remove("seed");
        body["user"] = json!(format!("agent-{agent}"));
        if agent == 1 {
            body["tools"] = tools();
            body["tool_choice"] = json!("required");
            body["max_tokens"] = json!(60);
        }
        let (status, one) = post(api, "/chat/completions", &body);
        assert_eq!(status, 200, "{one}");
        let said = message(one.clone());
        out.push(json!([said, one["usage"]["completion_tokens"]]));
        let mut turns = vec![said.clone()];
        if let Some(call) = said["tool_calls"].get(0) {
            turns[0]["tool_calls"][0]["id"] = json!("call-1");
            turns.push(json!({"role": "tool", "tool_call_id": "call-1", "content": "42"}));
            let _ = call;
        }
        turns.push(json!({"role": "user", "content": "and then?"}));
        let mut next = with_turns(body, &turns);
        next.as_object_mut().unwrap().remove("tool_choice");
        next.as_object_mut().unwrap().remove("tools");
        if agent == 2 {
            next["stream"] = json!(true);
            let text: String = events(api, &next)
                .iter()
                .filter_map(|e| {
                    e["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(String::from)
                })
                .collect();
            out.push(json!(text));
        } else {
            let (status, two) = post(api, "/chat/completions", &next);
            assert_eq!(status, 200, "{two}");
            out.push(json!([message(two.clone()), two["usage"]["prompt_tokens"]]));
        }
    }
    out
}

#[test]
fn a_session_replayed_with_reuse_gets_the_same_replies_without_the_model() {
    let model = common::tiny_model(&TinyLlama::default());
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("session");
    let first = {
        let api = start_on(
            model.path(),
            ApiOptions {
                store: Some(store.clone()),
                ..options(256)
            },
        )
        .unwrap();
        session(&api)
        // The server stops here, its last replies written.
    };
    assert!(store.join("decisions.redb").is_file() && store.join("api.json").is_file());
    let api = start_on(
        model.path(),
        ApiOptions {
            reuse: vec![store.clone()],
            ..options(256)
        },
    )
    .unwrap();
    assert_eq!(session(&api), first, "the replay's replies");
    let stats = stats(&api);
    assert_eq!(stats["reused"], 6, "{stats}");
    assert_eq!(
        stats["engines"][0]["status"]["steps"], 0,
        "the model never ran: {stats}"
    );
    // A request the session never made is the model's to answer.
    let (status, _) = post(&api, "/chat/completions", &chat("something new"));
    assert_eq!(status, 200);
    assert!(stats_steps(&api) > 0);
}

fn stats_steps(api: &Api) -> u64 {
    stats(api)["engines"][0]["status"]["steps"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_store_or_source_that_cannot_be_one_is_refused_with_the_fix() {
    let model = common::tiny_model(&TinyLlama::default());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::write(run.join("manifest.json"), "{}").unwrap();
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let refused = |store: Option<&std::path::Path>, reuse: &[&std::path::Path]| {
        let options = ApiOptions {
            store: store.map(|p| p.to_path_buf()),
            reuse: reuse.iter().map(|p| p.to_path_buf()).collect(),
            ..options(8)
        };
        match start_on(model.path(), options) {
            Ok(_) => panic!("served with --store {store:?} --reuse {reuse:?}"),
            Err(e) => e.to_string(),
        }
    };
    for (store, why) in [
        (&file, "it is a file"),
        (&run, "it is a run folder"),
        (&busy, "it holds other files"),
    ] {
        let e = refused(Some(store), &[]);
        assert!(
            e.contains("--store") && e.contains(why) && e.contains("Give a new folder"),
            "{e}"
        );
    }
    assert!(
        !busy.join("decisions.redb").exists(),
        "nothing written into a refused folder"
    );
    for (source, why) in [
        (dir.path().join("nothing"), "there is nothing there"),
        (file.clone(), "it is a file"),
        (empty.clone(), "neither a run folder nor a server's store"),
        (run.clone(), "has no decision store"),
    ] {
        let e = refused(None, &[&source]);
        assert!(
            e.contains("--reuse") && e.contains(why) && e.contains("drop --reuse"),
            "{e}"
        );
    }
    // A store that is written while it is read: refused before either is opened.
    let session = dir.path().join("session");
    drop(
        start_on(
            model.path(),
            ApiOptions {
                store: Some(session.clone()),
                ..options(8)
            },
        )
        .unwrap(),
    );
    let e = refused(Some(&session), &[&session]);
    assert!(e.contains("is also --store"), "{e}");
}

// Issue 31: a request's `user` was a retention key with no round announced, and under
// next-call retention a key does nothing without one: a full cache dropped the least recently
// used histories, which are the next called when agents take turns.
#[test]
fn rounds_learned_from_the_callers_keep_the_histories_called_next() {
    let model = common::tiny_model(&TinyLlama::default());
    let cached_after_two_rounds = |learn: bool| -> u64 {
        let config = EngineConfig {
            // Room for about half of the agents' histories.
            kv_memory: Some(256 << 10),
            ..engine_config()
        };
        let api = start_engine(model.path(), options(64), config).unwrap();
        if !learn {
            // A client that announces its rounds (here: none) is not second-guessed.
            let (status, _) = post(&api, "/throng/expect_calls", &json!({"users": []}));
            assert_eq!(status, 200);
        }
        let mut cached = 0;
        for round in 0..5 {
            for agent in 0..8 {
                let persona = format!("Agent {agent}: ").repeat(20);
                let body = json!({"model": "tiny", "messages": [
                    {"role": "system", "content": persona},
                    {"role": "user", "content": format!("round {round}")}
                ], "max_tokens": 4, "seed": 1, "user": format!("agent-{agent}")});
                let (status, reply) = post(&api, "/chat/completions", &body);
                assert_eq!(status, 200, "{reply}");
                if round >= 2 {
                    cached += reply["usage"]["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap();
                }
            }
        }
        cached
    };
    let (learned, not) = (
        cached_after_two_rounds(true),
        cached_after_two_rounds(false),
    );
    assert!(
        learned > not + 100,
        "{learned} prompt tokens cached with the rounds learned, {not} without"
    );
}

// A grammar's forced tokens ran past `max_tokens`; with stop strings set, the reply's text
// kept them (its token count did not), so the text was longer than the reply.
#[test]
fn a_reply_cut_at_max_tokens_is_cut_there_whatever_the_grammar_forces() {
    let api = start(64);
    let schema = json!({"type": "object", "properties": {
        "a_long_property_name_the_grammar_forces": {"type": "integer"}},
        "required": ["a_long_property_name_the_grammar_forces"], "additionalProperties": false});
    for stop in [None, Some(json!(["zzz"]))] {
        let mut body = chat("what do you bid?");
        body["max_tokens"] = json!(3);
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "bid", "schema": schema}});
        if let Some(stop) = &stop {
            body["stop"] = stop.clone();
        }
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{stop:?}: {reply}");
        assert_eq!(reply["usage"]["completion_tokens"], 3, "{stop:?}: {reply}");
        // The byte tokenizer: three tokens are three characters.
        assert_eq!(choice["message"]["content"], "{\"a", "{stop:?}: {reply}");
    }
}

// Issue 39 A1: a schema with exactly one valid reply answered 500 ("parser stopped ...
// NoExtension"). It is that reply, forced to its end.
#[test]
fn a_schema_with_one_valid_reply_answers_that_reply() {
    let api = start(64);
    let schemas = [
        json!({"type": "object", "properties": {"k": {"const": "v"}}, "required": ["k"],
               "additionalProperties": false}),
        json!({"type": "object", "properties": {"k": {"enum": ["v"]}}, "required": ["k"],
               "additionalProperties": false}),
        json!({"enum": [7]}),
    ];
    for schema in schemas {
        let mut body = chat("answer");
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "one", "schema": schema}});
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 200, "{schema}: {reply}");
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{reply}");
        let value: Value =
            serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
        assert!(jsonschema::is_valid(&schema, &value), "{value}");
    }
}

// Issue 39 A2: a forced call cut by `max_tokens` came back as the content
// `{"name": "note", "arguments`: the tool protocol's text leaked to the client.
#[test]
fn a_forced_call_cut_by_max_tokens_leaks_no_protocol_text() {
    let api = start(64);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "post"}}),
    ] {
        let mut body = chat("act");
        body["tools"] = tools();
        body["tool_choice"] = choice.clone();
        body["max_tokens"] = json!(3);
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{reply}");
        assert_eq!(choice["message"]["content"], Value::Null, "{reply}");
        assert!(choice["message"].get("tool_calls").is_none(), "{reply}");
    }
}

// Issue 39 A3: a tool without `parameters` (no arguments, in OpenAI's reading) got
// unconstrained arguments: 200 tokens of junk.
#[test]
fn a_tool_without_parameters_is_called_with_no_arguments() {
    let api = start(64);
    let mut body = chat("wait");
    body["tools"] = json!([{"type": "function", "function": {"name": "wait"}}]);
    body["tool_choice"] = json!("required");
    body["max_tokens"] = json!(40);
    body["n"] = json!(4);
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    for choice in reply["choices"].as_array().unwrap() {
        assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "wait");
        assert_eq!(call["arguments"], "{}");
    }
}

// Issue 39 A6: `json_schema` without its `schema` was answered as "any JSON" (a bare number).
#[test]
fn a_json_schema_format_without_its_schema_is_refused_naming_it() {
    let api = start(64);
    let mut body = chat("answer");
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x"}});
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 400, "{reply}");
    let (message, param, _) = error_of(&reply);
    assert_eq!(
        param,
        Some("response_format.json_schema.schema"),
        "{message}"
    );
    assert!(message.contains("schema"), "{message}");
}

// Issue 39 A5: `prompt_cache_key` and `safety_identifier` were refused as unknown fields, and
// the legacy `functions` got an error that did not name `tools`.
#[test]
fn openais_newer_fields_are_taken_and_the_legacy_functions_point_to_tools() {
    let api = start(64);
    let mut body = chat("hi");
    body["prompt_cache_key"] = json!("agent-7");
    body["safety_identifier"] = json!("user-123");
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    for field in ["functions", "function_call"] {
        let mut body = chat("hi");
        body[field] = json!([{"name": "f", "parameters": {"type": "object"}}]);
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 400, "{reply}");
        let (message, param, _) = error_of(&reply);
        assert_eq!(param, Some(field));
        assert!(
            message.contains("tools") && message.contains("tool_choice"),
            "{message}"
        );
    }
}

// Issue 39 A7: the stats counted sampled tokens only (+220 where clients got 671): the
// tokens a grammar forced are counted too, apart.
#[test]
fn the_stats_count_sampled_and_forced_tokens_apart_and_together_what_clients_got() {
    let api = start(64);
    let mut given = 0;
    for i in 0..6 {
        let mut body = chat(&format!("agent {i}: your bid?"));
        body["max_tokens"] = json!(30);
        if i % 2 == 0 {
            body["response_format"] = json!({"type": "json_schema",
                "json_schema": {"name": "bid", "schema": bid_schema()}});
        }
        let (status, reply) = post(&api, "/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        given += reply["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let status = &stats(&api)["engines"][0]["status"];
    let sampled = status["generated_tokens"].as_u64().unwrap();
    let forced = status["forced_tokens"].as_u64().unwrap();
    assert!(forced > 0, "{status}");
    assert_eq!(sampled + forced, given, "{status}");
}

#[test]
fn logprobs_report_each_generated_token_with_its_likeliest_alternatives() {
    let api = start(256);
    let mut body = chat("hi");
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    body["temperature"] = json!(0);
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(
        content.len() as u64,
        reply["usage"]["completion_tokens"].as_u64().unwrap(),
        "one entry per generated token: {reply}"
    );
    for t in content {
        let logprob = t["logprob"].as_f64().unwrap();
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{t}");
        let tops: Vec<f64> = top.iter().map(|a| a["logprob"].as_f64().unwrap()).collect();
        assert!(
            tops.windows(2).all(|w| w[0] >= w[1]),
            "likeliest first: {t}"
        );
        // Greedy: the token drawn is the likeliest, and probabilities are at most 1.
        assert!((logprob - tops[0]).abs() < 1e-5, "{t}");
        assert!(tops.iter().all(|&l| l <= 1e-6), "{t}");
        assert_eq!(
            t["bytes"].as_array().unwrap().len(),
            t["token"].as_str().unwrap().len()
        );
    }

    // Asked for none: `logprobs` is null, as OpenAI answers.
    let (_, plain) = post(&api, "/chat/completions", &chat("hi"));
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");

    // Reporting does not change the reply.
    let mut same = body.clone();
    same["logprobs"] = json!(false);
    same.as_object_mut().unwrap().remove("top_logprobs");
    let (_, unreported) = post(&api, "/chat/completions", &same);
    assert_eq!(
        unreported["choices"][0]["message"],
        reply["choices"][0]["message"]
    );

    let mut orphan = chat("hi");
    orphan["top_logprobs"] = json!(2);
    let (status, e) = post(&api, "/chat/completions", &orphan);
    assert_eq!((status, error_of(&e).1), (400, Some("top_logprobs")), "{e}");
    let mut many = body.clone();
    many["top_logprobs"] = json!(21);
    let (status, e) = post(&api, "/chat/completions", &many);
    assert_eq!((status, error_of(&e).1), (400, Some("top_logprobs")), "{e}");
}

#[test]
fn a_token_forced_by_the_grammar_has_logprob_zero() {
    let api = start(256);
    let mut body = chat("bid");
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "k", "schema": {
            "type": "object", "properties": {"k": {"const": "v"}},
            "required": ["k"], "additionalProperties": false}}});
    body["logprobs"] = json!(true);
    let (status, reply) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!content.is_empty());
    assert!(
        content.iter().all(|t| t["logprob"].as_f64() == Some(0.0)),
        "{reply}"
    );
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let api = start(256);
    let tokenizer = tokenizers::Tokenizer::from_file(
        api._model.as_ref().unwrap().path().join("tokenizer.json"),
    )
    .unwrap();
    let id = |text: &str| {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids.len(), 1, "{text} is one token");
        ids[0].to_string()
    };
    let (a, b) = (id("a"), id("b"));
    let mut body = chat("hi");
    body["logit_bias"] = json!({ a.clone(): 100 });
    let (status, forced) = post(&api, "/chat/completions", &body);
    assert_eq!(status, 200, "{forced}");
    assert_eq!(
        forced["choices"][0]["message"]["content"],
        json!("a".repeat(16)),
        "a token biased by +100 is always drawn"
    );

    // Banned inside a grammar's choice: the other choice, whatever the seed.
    let mut choose = chat("pick");
    choose["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "k",
        "schema": {"type": "object", "properties": {"k": {"enum": ["a", "b"]}},
                   "required": ["k"], "additionalProperties": false}}});
    choose["max_tokens"] = json!(32);
    for (banned, left) in [(&a, "b"), (&b, "a")] {
        for seed in 0..4 {
            let mut ban = choose.clone();
            ban["seed"] = json!(seed);
            ban["logit_bias"] = json!({ banned.clone(): -100 });
            let (status, reply) = post(&api, "/chat/completions", &ban);
            assert_eq!(status, 200, "{reply}");
            let value: Value =
                serde_json::from_str(reply["choices"][0]["message"]["content"].as_str().unwrap())
                    .unwrap();
            assert_eq!(value["k"], json!(left), "seed {seed}: {reply}");
        }
    }

    for (bias, param) in [
        (json!({"abc": 1}), "logit_bias.abc"),
        (json!({"5": 101}), "logit_bias.5"),
        (json!({"99999999": 1}), "logit_bias"),
    ] {
        let mut bad = chat("hi");
        bad["logit_bias"] = bias;
        let (status, e) = post(&api, "/chat/completions", &bad);
        assert_eq!(status, 400, "{e}");
        assert!(error_of(&e).1.unwrap_or("").starts_with(param), "{e}");
    }
}

#[test]
fn penalties_change_replies_only_where_asked_and_keep_them_reproducible() {
    let api = start(256);
    let mut body = chat("hi");
    body["max_tokens"] = json!(48);
    let (_, plain) = post(&api, "/chat/completions", &body);
    let mut penalised = body.clone();
    penalised["frequency_penalty"] = json!(2.0);
    penalised["presence_penalty"] = json!(2.0);
    let (status, a) = post(&api, "/chat/completions", &penalised);
    assert_eq!(status, 200, "{a}");
    let (_, b) = post(&api, "/chat/completions", &penalised);
    assert_eq!(a["choices"], b["choices"], "seeded: the same reply twice");
    assert_ne!(
        a["choices"][0]["message"], plain["choices"][0]["message"],
        "the penalties change the reply"
    );
    let mut zero = body.clone();
    zero["frequency_penalty"] = json!(0);
    zero["presence_penalty"] = json!(0.0);
    let (_, z) = post(&api, "/chat/completions", &zero);
    assert_eq!(
        z["choices"], plain["choices"],
        "zero penalties change nothing"
    );
    let mut out = body.clone();
    out["presence_penalty"] = json!(-2.5);
    let (status, e) = post(&api, "/chat/completions", &out);
    assert_eq!(
        (status, error_of(&e).1),
        (400, Some("presence_penalty")),
        "{e}"
    );
}

#[test]
fn streamed_tool_calls_send_their_arguments_as_they_are_generated() {
    let api = start(256);
    let mut calls = 0;
    for seed in 0..6 {
        let mut body = chat("act");
        body["tools"] = tools();
        body["tool_choice"] = json!(if seed % 2 == 0 { "required" } else { "auto" });
        body["max_tokens"] = json!(80);
        body["seed"] = json!(seed);
        let (_, whole) = post(&api, "/chat/completions", &body);
        let message = &whole["choices"][0]["message"];
        body["stream"] = json!(true);
        let events = events(&api, &body);
        let deltas: Vec<&Value> = events
            .iter()
            .filter(|e| !e.is_null())
            .map(|e| &e["choices"][0]["delta"])
            .collect();
        let streamed_calls: Vec<&Value> = deltas
            .iter()
            .filter_map(|d| d["tool_calls"].get(0))
            .collect();
        if let Some(call) = message["tool_calls"].get(0) {
            calls += 1;
            let first = streamed_calls[0];
            assert!(
                first["id"].as_str().unwrap().starts_with("call_"),
                "{first}"
            );
            assert_eq!(first["function"]["name"], call["function"]["name"]);
            assert!(
                streamed_calls[1..].iter().all(|c| c.get("id").is_none()),
                "only the first chunk of a call names it"
            );
            let arguments: String = streamed_calls
                .iter()
                .filter_map(|c| c["function"]["arguments"].as_str())
                .collect();
            assert_eq!(arguments, call["function"]["arguments"].as_str().unwrap());
            assert!(
                streamed_calls.len() > 3,
                "the arguments come in pieces as they are generated: {streamed_calls:?}"
            );
            serde_json::from_str::<Value>(&arguments).unwrap();
        } else {
            // Words (or a cut call): the same content as unstreamed, in pieces.
            assert!(streamed_calls.is_empty() || whole["choices"][0]["finish_reason"] == "length");
            let content: String = deltas
                .iter()
                .filter_map(|d| d["content"].as_str())
                .collect();
            assert_eq!(
                content,
                message["content"].as_str().unwrap_or(""),
                "{whole}"
            );
        }
    }
    assert!(calls > 0, "some replies are calls");
}
