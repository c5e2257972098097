//! `throng api --store DIR` and `--reuse DIR`: the server's replies kept in a decision store
//! as they are given, and replies taken from earlier stores (a run's, or a server's) instead
//! of the model, by the key of each request's complete input. A simulation that talks to the
//! server is then replayed exactly (the same requests in the same order get the same replies
//! without the model), and its counterfactual runs compute only what changed.
//!
//! The store is written by a thread of its own, in transactions of up to 256 replies or
//! 100 ms, so that requests never wait on the disk and a kill loses at most that much.

use crate::engine::ModelIdentity;
use crate::engine::{RequestKey, Response};
use crate::record::store::{HeldStore, STORE, Store, StoredReply};
use crate::reuse::Reuse;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The file that marks a folder as a server's store.
pub(crate) const MARKER: &str = "api.json";
/// A run folder's manifest, which a server's store must not be.
const MANIFEST: &str = "manifest.json";

/// Replies committed together at most, and the longest one waits.
const BATCH: usize = 256;
const WAIT: Duration = Duration::from_millis(100);

/// Why `--store` or `--reuse` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "--store {}: {why}. Give a new folder, or one an earlier `throng api --store` wrote",
        .dir.display()
    )]
    NotAStore { dir: PathBuf, why: &'static str },
    #[error(
        "--reuse {}: {why}. Give the folder of an earlier run or of an earlier `throng api \
         --store`, whose decisions.redb holds the replies, or drop --reuse",
        .dir.display()
    )]
    NotASource { dir: PathBuf, why: &'static str },
    #[error(
        "--reuse {} is also --store: a store is written while it is served; give --store a \
         new folder",
        .0.display()
    )]
    Same(PathBuf),
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
    #[error(transparent)]
    Reuse(#[from] crate::reuse::ReuseError),
}

/// Refuses what cannot be a source of replies, before anything is written.
pub(crate) fn check_sources(dirs: &[PathBuf], store: Option<&Path>) -> Result<(), StoreError> {
    for dir in dirs {
        let why = match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "there is nothing there",
            Err(_) => "it cannot be read",
            Ok(meta) if !meta.is_dir() => "it is a file, not a folder",
            Ok(_) if !dir.join(MANIFEST).is_file() && !dir.join(MARKER).is_file() => {
                "it is neither a run folder nor a server's store (it has no manifest.json or api.json)"
            }
            Ok(_) if !dir.join(STORE).is_file() => {
                "it has no decision store (its run asked no model, or predates stores)"
            }
            Ok(_) => {
                if let Some(store) = store
                    && same_folder(dir, store)
                {
                    return Err(StoreError::Same(dir.clone()));
                }
                continue;
            }
        };
        return Err(StoreError::NotASource {
            dir: dir.clone(),
            why,
        });
    }
    Ok(())
}

fn same_folder(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Opens the stores of `dirs` for the models served (each one's name and identity).
pub(crate) fn open_sources(
    dirs: &[PathBuf],
    models: &[(&str, &ModelIdentity)],
) -> Result<crate::reuse::Opened, StoreError> {
    Ok(crate::reuse::open(dirs, models)?)
}

/// A reply on its way to the store.
type Entry = (RequestKey, StoredReply);

/// The longest wait between two tries to write replies the store refused.
const MOST_BACKOFF: Duration = Duration::from_secs(5);
/// How long a stopping server goes on trying to write what the store still refuses.
const LAST_TRIES: Duration = Duration::from_secs(10);

/// The server's own store, held open and written by its thread.
pub struct Recorder {
    tx: Option<mpsc::Sender<Entry>>,
    thread: Option<JoinHandle<()>>,
    /// Replies given and not yet committed.
    pending: Arc<AtomicU64>,
}

impl Recorder {
    /// Opens (or creates) the store in `dir`, marked with the served models' identities, and
    /// holds it open until the server stops.
    pub fn open(dir: &Path, models: &[(&str, &ModelIdentity)]) -> Result<Self, StoreError> {
        let io = |source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let not = |why| StoreError::NotAStore {
            dir: dir.to_path_buf(),
            why,
        };
        match std::fs::metadata(dir) {
            Ok(meta) if !meta.is_dir() => return Err(not("it is a file")),
            Ok(_) if dir.join(MANIFEST).exists() => return Err(not("it is a run folder")),
            Ok(_)
                if !dir.join(MARKER).is_file()
                    && std::fs::read_dir(dir).map_err(io)?.next().is_some() =>
            {
                return Err(not("it holds other files"));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(io)?
            }
            Err(e) => return Err(io(e)),
        }
        let marker = dir.join(MARKER);
        if !marker.is_file() {
            let text = serde_json::json!({"kind": "throng api store", "version": 1});
            std::fs::write(&marker, format!("{text:#}\n")).map_err(|source| StoreError::Io {
                path: marker.clone(),
                source,
            })?;
        }
        let store = Store::open(dir)?;
        for (name, identity) in models {
            let identity =
                serde_json::to_string(identity).expect("invariant: an identity is plain strings");
            store.set_model(name, &identity)?;
        }
        let held = store.hold()?;
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            store: held,
            pending: Arc::clone(&pending),
            failing: None,
        };
        let thread = std::thread::Builder::new()
            .name("throng-api-store".into())
            .spawn(move || writer.run(rx))
            .map_err(io)?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            pending,
        })
    }

    /// Keeps `reply` under `key` (and its token ids, for conversations that repeat it).
    pub fn keep(&self, key: RequestKey, reply: &Response) {
        let stored = StoredReply {
            text: reply.text.clone(),
            stopped: reply.finish_reason == crate::engine::FinishReason::Stop,
            prompt_tokens: reply.prompt_tokens as u32,
            generated_tokens: reply.generated_tokens as u32,
            token_ids: reply.token_ids.clone(),
        };
        if let Some(tx) = &self.tx {
            self.pending.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send((key, stored));
        }
    }

    /// Replies given and not yet in the store.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::SeqCst)
    }
}

impl Drop for Recorder {
    /// Writes what is still on its way before the server ends.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer: batches of replies in one transaction each. A batch the store refuses (a full
/// disk) is kept and tried again, waiting longer each time up to [`MOST_BACKOFF`], with the
/// replies that arrive meanwhile: nothing is dropped while the server runs, and what a
/// stopping server still cannot write is counted on its way out.
struct Writer {
    store: HeldStore,
    pending: Arc<AtomicU64>,
    /// Since when, and how long to wait before the next try, while writes fail.
    failing: Option<(Instant, Duration)>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Entry>) {
        let mut batch: Vec<Entry> = Vec::new();
        let mut open = true;
        while open {
            let window = self.failing.map_or(WAIT, |(_, backoff)| backoff);
            open = collect(&rx, &mut batch, window);
            if !batch.is_empty() {
                self.write(&mut batch);
            }
        }
        let until = Instant::now() + LAST_TRIES;
        while !batch.is_empty() && Instant::now() < until {
            std::thread::sleep(self.failing.map_or(Duration::ZERO, |(_, b)| b));
            self.write(&mut batch);
        }
        if !batch.is_empty() {
            eprintln!(
                "throng api: error: {} replies could not be written to the store before the \
                 server stopped (see the warnings above)",
                batch.len()
            );
        }
    }

    /// Commits `batch` (emptying it), or keeps it for the next try.
    fn write(&mut self, batch: &mut Vec<Entry>) {
        match self.store.insert(batch) {
            Ok(()) => {
                self.pending.fetch_sub(batch.len() as u64, Ordering::SeqCst);
                batch.clear();
                if let Some((since, _)) = self.failing.take() {
                    eprintln!(
                        "throng api: the store takes replies again after {:.0?}; none was lost",
                        since.elapsed()
                    );
                }
            }
            Err(e) => {
                let backoff = match self.failing {
                    None => {
                        eprintln!(
                            "throng api: warning: the store refuses replies ({e}); they are kept \
                             and written when it takes them again"
                        );
                        Duration::from_millis(100)
                    }
                    Some((_, b)) => (b * 2).min(MOST_BACKOFF),
                };
                let since = self.failing.map_or_else(Instant::now, |(s, _)| s);
                self.failing = Some((since, backoff));
            }
        }
    }
}

/// Adds to `batch` what arrives within `window` (at most [`BATCH`] replies), waiting first for
/// one reply when it holds none. False once the server has stopped sending.
fn collect(rx: &mpsc::Receiver<Entry>, batch: &mut Vec<Entry>, window: Duration) -> bool {
    if batch.is_empty() {
        match rx.recv() {
            Ok(entry) => batch.push(entry),
            Err(_) => return false,
        }
    }
    let until = Instant::now() + window;
    for _ in 0..BATCH {
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(entry) => batch.push(entry),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => return false,
        }
    }
    true
}

/// Replies taken from earlier stores.
pub(crate) type Sources = std::sync::Mutex<Reuse>;
