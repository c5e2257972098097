//! `throng api` served in process on a tiny random model, and the calls tests make to it.

use super::TinyLlama;
use serde_json::{Value, json};
use throng::api::{ApiOptions, ApiServer, Served};
use throng::engine::{EngineConfig, EngineHandle};

pub const KEY: &str = "test-key";

pub struct Api {
    pub base: String,
    pub addr: std::net::SocketAddr,
    pub _model: Option<tempfile::TempDir>,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub served: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Api {
    /// Stops the server and waits until it has ended (its store written).
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = served.join();
        }
    }
}

pub fn engine_config() -> EngineConfig {
    EngineConfig {
        max_seqs: 64,
        ..EngineConfig::default()
    }
}

pub fn start(queue: usize) -> Api {
    let model = super::tiny_model(&TinyLlama::default());
    let mut api = start_on(model.path(), options(queue)).unwrap();
    api._model = Some(model);
    api
}

pub fn options(queue: usize) -> ApiOptions {
    ApiOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        public: false,
        key: Some(KEY.into()),
        allowed_hosts: Vec::new(),
        queue,
        max_tokens: 1000,
        store: None,
        reuse: Vec::new(),
        connections: Default::default(),
    }
}

/// The tiny model in `model`, served as "tiny" with `options` (its address not used).
pub fn start_on(
    model: &std::path::Path,
    options: ApiOptions,
) -> Result<Api, throng::api::ApiError> {
    start_engine(model, options, engine_config())
}

pub fn start_engine(
    model: &std::path::Path,
    options: ApiOptions,
    config: EngineConfig,
) -> Result<Api, throng::api::ApiError> {
    let engine = super::engine(model.to_str().unwrap(), config);
    let encoder = engine.prompt_encoder().clone();
    let (handle, _thread) = EngineHandle::spawn(engine);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = ApiServer::on(
        listener,
        options,
        vec![Served {
            name: "tiny".into(),
            handle,
            encoder,
            max_seqs: 64,
        }],
    )?;
    let base = server.base_url();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = std::thread::spawn(move || {
        server
            .serve_until(async {
                let _ = stopped.await;
            })
            .unwrap()
    });
    Ok(Api {
        base,
        addr,
        _model: None,
        stop: Some(stop),
        served: Some(served),
    })
}

/// A POST with the key; the status and the JSON body, whatever the status.
pub fn post(api: &Api, path: &str, body: &Value) -> (u16, Value) {
    call(
        ureq::post(&format!("{}{path}", api.base)).set("Authorization", &format!("Bearer {KEY}")),
        body,
    )
}

pub fn call(request: ureq::Request, body: &Value) -> (u16, Value) {
    match request.send_json(body.clone()) {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("{e}"),
    }
}

pub fn get(api: &Api, path: &str) -> (u16, Value) {
    match ureq::get(&format!("{}{path}", api.base))
        .set("Authorization", &format!("Bearer {KEY}"))
        .call()
    {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("{e}"),
    }
}

pub fn chat(content: &str) -> Value {
    json!({"model": "tiny", "messages": [
        {"role": "system", "content": "You are an agent in a market."},
        {"role": "user", "content": content}
    ], "max_tokens": 16, "temperature": 0.8, "seed": 7})
}

pub fn error_of(body: &Value) -> (&str, Option<&str>, Option<&str>) {
    let e = &body["error"];
    (
        e["message"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error object: {body}")),
        e["param"].as_str(),
        e["code"].as_str(),
    )
}

pub fn stats(api: &Api) -> Value {
    let (status, stats) = get(api, "/throng/stats");
    assert_eq!(status, 200, "{stats}");
    stats
}
