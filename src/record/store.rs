//! A run's decision store, `decisions.redb`: every reply the model gave, by the key of its
//! request's complete input (see the engine's `request_key`), so that a later run whose
//! request has the same key takes the reply instead of computing it (`throng run --reuse`).
//!
//! The store is a redb database: indexed (a million lookups a step are a million B-tree
//! reads, not a scan of `decisions.jsonl`), written a step at a time in one durable
//! transaction, and crash-safe by redb's commits, so a kill loses at most the step it was in.
//! Its `meta` table says which models' replies it holds (their identities, as JSON), so that
//! a run can refuse a store whose replies another device or weight format made. Once a run
//! is sealed, the manifest's checksum of the file is checked before the store is trusted.

use super::RecordError;
pub use super::names::STORE;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const REPLIES: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("replies");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// What a request's reply was: enough to give the same decision, history and records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReply {
    pub text: String,
    /// Whether it ended at a stop (else at its token limit).
    pub stopped: bool,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    /// The reply's token ids, kept where a later prompt may repeat the reply and should do
    /// so with the ids the model gave (`throng api`'s conversations); a run's replies leave
    /// them out. Encoded after the rest, only when there are any, so that entries written
    /// without them (every run's, and those of stores older than this field) read as before.
    #[serde(skip)]
    pub token_ids: Vec<u32>,
}

impl StoredReply {
    /// The entry stored under `key`: a CRC-32 of the key and the encoded reply (4 bytes,
    /// little-endian), then the reply. redb checksums its pages only when they are written
    /// whole by a commit it knows of: a byte flipped in place later, or in a store whose last
    /// commit was cut by a kill, is caught by this checksum alone.
    fn encode(&self, key: &[u8; 32]) -> Vec<u8> {
        let mut reply =
            postcard::to_stdvec(self).expect("invariant: in-memory postcard encoding cannot fail");
        if !self.token_ids.is_empty() {
            reply = postcard::to_extend(&self.token_ids, reply)
                .expect("invariant: in-memory postcard encoding cannot fail");
        }
        let mut entry = checksum(key, &reply).to_le_bytes().to_vec();
        entry.extend_from_slice(&reply);
        entry
    }

    /// The reply of the entry `bytes` stored under `key`, if its checksum holds and it
    /// decodes.
    fn decode(key: &[u8; 32], bytes: &[u8]) -> Option<Self> {
        let (sum, reply) = bytes.split_first_chunk::<4>()?;
        if u32::from_le_bytes(*sum) != checksum(key, reply) {
            return None;
        }
        let (mut stored, ids): (Self, _) = postcard::take_from_bytes(reply).ok()?;
        if !ids.is_empty() {
            stored.token_ids = postcard::from_bytes(ids).ok()?;
        }
        Some(stored)
    }
}

fn checksum(key: &[u8; 32], reply: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(key);
    h.update(reply);
    h.finalize()
}

/// What a store holds under a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Hit(StoredReply),
    Miss,
    /// An entry whose checksum does not hold (or that does not decode): damaged, so not
    /// trusted; the reply is computed again.
    Damaged,
}

fn store_error(path: &Path, e: impl std::fmt::Display) -> RecordError {
    RecordError::format(path, format!("the decision store: {e}"))
}

/// Why a store cannot be opened to read; one a process writes says which.
fn open_error(path: &Path, e: redb::DatabaseError) -> RecordError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => RecordError::format(
            path,
            "the decision store is in use by another process (a `throng api` that stores into it \
             or reuses it, or a run writing it): stop that process first, or use a copy of the \
             folder",
        ),
        e => store_error(path, e),
    }
}

thread_local! {
    /// Whether this thread is inside [`readable`], whose panics are reported as errors.
    static READING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `read`, a read of the store at `path`, with redb's panics turned into an error: redb
/// trusts the pages it wrote, and on a page damaged since (4 KB overwritten in the middle of
/// the file) it panics ("entered unreachable code") instead of failing. A damaged store must
/// be left out with a warning, not end the process. The panic's own message is not printed:
/// a hook installed once passes every other panic to the hook before it.
fn readable<T>(
    path: &Path,
    read: impl FnOnce() -> Result<T, RecordError>,
) -> Result<T, RecordError> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !READING.with(std::cell::Cell::get) {
                before(info)
            }
        }));
    });
    let was = READING.with(|r| r.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
    READING.with(|r| r.set(was));
    result.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(store_error(
            path,
            format!("damaged: a page of it does not read ({why})"),
        ))
    })
}

/// A run's own store, written as it goes. The database is open only while it is written: a
/// step's replies go in and it is closed again, so that between steps the file is as it will
/// stay (the manifest's checksum of a paused or finished run holds for it).
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
}

impl Store {
    /// The store of the run in `dir`, created if it is not there (a resumed run goes on
    /// writing its own).
    pub fn open(dir: &Path) -> Result<Self, RecordError> {
        let store = Self {
            path: dir.join(STORE),
        };
        let db = store.db()?;
        let w = db.begin_write().map_err(|e| store_error(&store.path, e))?;
        w.open_table(REPLIES)
            .map_err(|e| store_error(&store.path, e))?;
        w.open_table(META)
            .map_err(|e| store_error(&store.path, e))?;
        w.commit().map_err(|e| store_error(&store.path, e))?;
        Ok(store)
    }

    fn db(&self) -> Result<redb::Database, RecordError> {
        redb::Database::create(&self.path).map_err(|e| open_error(&self.path, e))
    }

    /// Records `model`'s identity (JSON), so that readers know whose replies these are.
    pub(crate) fn set_model(&self, model: &str, identity: &str) -> Result<(), RecordError> {
        let db = self.db()?;
        let w = db.begin_write().map_err(|e| store_error(&self.path, e))?;
        {
            let mut meta = w.open_table(META).map_err(|e| store_error(&self.path, e))?;
            meta.insert(format!("model:{model}").as_str(), identity)
                .map_err(|e| store_error(&self.path, e))?;
        }
        w.commit().map_err(|e| store_error(&self.path, e))
    }

    /// Adds `replies` in one durable transaction.
    pub fn insert(&self, replies: &[([u8; 32], StoredReply)]) -> Result<(), RecordError> {
        if replies.is_empty() {
            return Ok(());
        }
        insert(&self.db()?, &self.path, replies)
    }

    /// The store held open for writing until the [`HeldStore`] is dropped.
    pub fn hold(&self) -> Result<HeldStore, RecordError> {
        Ok(HeldStore {
            db: self.db()?,
            path: self.path.clone(),
        })
    }
}

/// A store held open for writing for as long as it lives, as a server's is: no other process
/// can open it meanwhile, so a reader (`--reuse` of it) is refused at its start, saying why,
/// instead of taking the file from under the writer between two of its commits.
pub struct HeldStore {
    db: redb::Database,
    path: PathBuf,
}

impl HeldStore {
    /// Adds `replies` in one durable transaction.
    pub fn insert(&self, replies: &[([u8; 32], StoredReply)]) -> Result<(), RecordError> {
        insert(&self.db, &self.path, replies)
    }
}

fn insert(
    db: &redb::Database,
    path: &Path,
    replies: &[([u8; 32], StoredReply)],
) -> Result<(), RecordError> {
    let w = db.begin_write().map_err(|e| store_error(path, e))?;
    {
        let mut table = w.open_table(REPLIES).map_err(|e| store_error(path, e))?;
        for (key, reply) in replies {
            table
                .insert(key, reply.encode(key).as_slice())
                .map_err(|e| store_error(path, e))?;
        }
    }
    w.commit().map_err(|e| store_error(path, e))
}

/// An earlier run's store, read to reuse its replies.
pub struct Source {
    db: redb::ReadOnlyDatabase,
    /// The run folder it belongs to.
    pub dir: PathBuf,
    /// The identities of the models whose replies it holds, by model name (JSON text).
    pub models: BTreeMap<String, String>,
    /// Replies it holds.
    pub len: u64,
}

impl Source {
    /// Opens the store of the run in `dir`. A store the run's manifest has a checksum for
    /// (a finished or paused run) must match it; a damaged or unreadable one is an error,
    /// which callers report as a warning and go on without it.
    pub fn open(dir: &Path) -> Result<Self, RecordError> {
        let path = dir.join(STORE);
        if !path.is_file() {
            return Err(RecordError::format(
                &path,
                "missing: the run has no decision store (it asked no model, or predates \
                 stores)",
            ));
        }
        super::verify(dir, STORE)?;
        readable(&path, || {
            let db = redb::ReadOnlyDatabase::open(&path).map_err(|e| open_error(&path, e))?;
            let r = db.begin_read().map_err(|e| store_error(&path, e))?;
            let meta = r.open_table(META).map_err(|e| store_error(&path, e))?;
            let mut models = BTreeMap::new();
            for entry in meta.iter().map_err(|e| store_error(&path, e))? {
                let (k, v) = entry.map_err(|e| store_error(&path, e))?;
                if let Some(model) = k.value().strip_prefix("model:") {
                    models.insert(model.to_string(), v.value().to_string());
                }
            }
            // Every page of the table read once: redb finds a damaged page only when it
            // reads it, so a store that passes here will not fail a lookup later (unless
            // it is damaged while open).
            let replies = r.open_table(REPLIES).map_err(|e| store_error(&path, e))?;
            let mut len = 0;
            for entry in replies.iter().map_err(|e| store_error(&path, e))? {
                entry.map_err(|e| store_error(&path, e))?;
                len += 1;
            }
            drop(replies);
            drop(meta);
            drop(r);
            Ok(Self {
                db,
                dir: dir.to_path_buf(),
                models,
                len,
            })
        })
    }

    /// A reader for many lookups (one read transaction); it may be shared by threads.
    pub fn reader(&self) -> Result<Reader, RecordError> {
        let path = self.dir.join(STORE);
        let r = self.db.begin_read().map_err(|e| store_error(&path, e))?;
        let table = r.open_table(REPLIES).map_err(|e| store_error(&path, e))?;
        Ok(Reader { table, path })
    }
}

/// Lookups in a [`Source`], in one read transaction.
pub struct Reader {
    table: redb::ReadOnlyTable<&'static [u8; 32], &'static [u8]>,
    path: PathBuf,
}

impl Reader {
    /// What is recorded under `key`. A store redb cannot read is an error; an entry whose
    /// own checksum fails is [`Lookup::Damaged`].
    pub fn get(&self, key: &[u8; 32]) -> Result<Lookup, RecordError> {
        readable(&self.path, || {
            let Some(bytes) = self
                .table
                .get(key)
                .map_err(|e| store_error(&self.path, e))?
            else {
                return Ok(Lookup::Miss);
            };
            Ok(match StoredReply::decode(key, bytes.value()) {
                Some(reply) => Lookup::Hit(reply),
                None => Lookup::Damaged,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(i: u32) -> StoredReply {
        StoredReply {
            text: format!("{{\"x\": {i}}}"),
            stopped: true,
            prompt_tokens: 100 + i,
            generated_tokens: 7,
            token_ids: Vec::new(),
        }
    }

    fn key(i: u32) -> [u8; 32] {
        let mut k = [0u8; 32];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k
    }

    #[test]
    fn a_stores_replies_read_back_by_key_with_its_models() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.set_model("m", "{\"weights\":\"abc\"}").unwrap();
        let replies: Vec<_> = (0..1000).map(|i| (key(i), reply(i))).collect();
        store.insert(&replies[..500]).unwrap();
        store.insert(&replies[500..]).unwrap();
        drop(store);
        let source = Source::open(dir.path()).unwrap();
        assert_eq!(source.len, 1000);
        assert_eq!(source.models["m"], "{\"weights\":\"abc\"}");
        let reader = source.reader().unwrap();
        assert_eq!(reader.get(&key(7)).unwrap(), Lookup::Hit(reply(7)));
        assert_eq!(reader.get(&key(5000)).unwrap(), Lookup::Miss);
    }

    #[test]
    fn stored_token_ids_round_trip_and_entries_without_them_read_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let with_ids = StoredReply {
            token_ids: vec![1, 70_000, 3, u32::MAX],
            ..reply(1)
        };
        // An entry as every store wrote it before token ids were kept: the reply alone.
        let old = reply(2);
        let old_bytes = {
            let encoded = postcard::to_stdvec(&old).unwrap();
            let mut entry = checksum(&key(2), &encoded).to_le_bytes().to_vec();
            entry.extend_from_slice(&encoded);
            entry
        };
        assert_eq!(
            old.encode(&key(2)),
            old_bytes,
            "a reply without ids is stored as before"
        );
        let store = Store::open(dir.path()).unwrap();
        store
            .insert(&[(key(1), with_ids.clone()), (key(2), old.clone())])
            .unwrap();
        drop(store);
        let source = Source::open(dir.path()).unwrap();
        let reader = source.reader().unwrap();
        assert_eq!(reader.get(&key(1)).unwrap(), Lookup::Hit(with_ids));
        assert_eq!(reader.get(&key(2)).unwrap(), Lookup::Hit(old));
    }

    #[test]
    fn a_reopened_store_keeps_what_it_had() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path())
            .unwrap()
            .insert(&[(key(1), reply(1))])
            .unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.insert(&[(key(2), reply(2))]).unwrap();
        drop(store);
        assert_eq!(Source::open(dir.path()).unwrap().len, 2);
    }

    #[test]
    fn a_truncated_or_overwritten_store_is_refused() {
        for damage in ["truncate", "garbage"] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let replies: Vec<_> = (0..2000).map(|i| (key(i), reply(i))).collect();
            store.insert(&replies).unwrap();
            drop(store);
            let path = dir.path().join(STORE);
            let mut bytes = std::fs::read(&path).unwrap();
            match damage {
                "truncate" => bytes.truncate(bytes.len() / 3),
                _ => bytes[..4096].fill(0xAB),
            }
            std::fs::write(&path, &bytes).unwrap();
            let opened = Source::open(dir.path()).and_then(|s| {
                let r = s.reader()?;
                (0..2000).try_for_each(|i| r.get(&key(i)).map(|_| ()))
            });
            assert!(opened.is_err(), "{damage}: a damaged store was read");
        }
    }

    // Issue 41 A2: 4 KB overwritten in the middle of the file made redb panic ("entered
    // unreachable code") when the store was opened to reuse, or at a later lookup.
    #[test]
    fn a_page_overwritten_anywhere_is_an_error_or_a_miss_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let replies: Vec<_> = (0..2000).map(|i| (key(i), reply(i))).collect();
        store.insert(&replies).unwrap();
        drop(store);
        let path = dir.path().join(STORE);
        let whole = std::fs::read(&path).unwrap();
        let mut refused = 0;
        for page in 0..whole.len().div_ceil(4096) {
            let mut bytes = whole.clone();
            let end = (page * 4096 + 4096).min(bytes.len());
            bytes[page * 4096..end].fill(0xAB);
            std::fs::write(&path, &bytes).unwrap();
            // Every outcome but a panic (which fails this test) is allowed: refused at open,
            // refused at a lookup, or read with its damaged entries found by their checksums.
            let read = Source::open(dir.path()).and_then(|s| {
                let r = s.reader()?;
                (0..2000).try_for_each(|i| match r.get(&key(i))? {
                    Lookup::Hit(got) => {
                        assert_eq!(got, reply(i), "page {page}: a wrong reply read as right");
                        Ok(())
                    }
                    Lookup::Miss | Lookup::Damaged => Ok(()),
                })
            });
            refused += read.is_err() as usize;
        }
        assert!(refused > 0, "no damaged page was noticed");
    }

    // Guards against issue 30, item 3: redb does not checksum values, so a byte flipped in a
    // reply of a killed run's (unsealed) store was reused as the reply, and a later resume
    // sealed the store with the flipped byte in it.
    #[test]
    fn a_flipped_byte_in_a_stored_reply_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let text = "{\"guess\": 33.3333}";
        let stored = StoredReply {
            text: text.into(),
            ..reply(0)
        };
        store
            .insert(&[(key(1), stored.clone()), (key(2), reply(2))])
            .unwrap();
        drop(store);
        let path = dir.path().join(STORE);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(text.len())
            .position(|w| w == text.as_bytes())
            .expect("the reply's text is stored as it is");
        // `33.3333` becomes `39.3333`: a valid reply, and a wrong one.
        bytes[at + 11] = b'9';
        std::fs::write(&path, &bytes).unwrap();
        let source = Source::open(dir.path()).unwrap();
        let reader = source.reader().unwrap();
        assert_eq!(reader.get(&key(1)).unwrap(), Lookup::Damaged);
        assert_eq!(
            reader.get(&key(2)).unwrap(),
            Lookup::Hit(reply(2)),
            "the others hold"
        );
    }

    #[test]
    fn an_entry_moved_under_another_key_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let entry = reply(1).encode(&key(1));
        let db = store.db().unwrap();
        let w = db.begin_write().unwrap();
        w.open_table(REPLIES)
            .unwrap()
            .insert(&key(2), entry.as_slice())
            .unwrap();
        w.commit().unwrap();
        drop(db);
        let source = Source::open(dir.path()).unwrap();
        assert_eq!(
            source.reader().unwrap().get(&key(2)).unwrap(),
            Lookup::Damaged
        );
    }
}
