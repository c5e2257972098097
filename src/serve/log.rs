//! `decisions.jsonl` read a page at a time, never whole. A run appends a step's decisions once
//! the step is decided, step after step in the order of `steps.csv`, so the lines of a step lie
//! together, in that order: a step's first line is found by a binary search over byte offsets
//! (a few dozen short reads of a multi-gigabyte log), and a page is read from there. What the
//! searches found is kept, a number per step, while the file only grows; nothing else of the
//! log stays in memory, and an index unused for a while is dropped.

use crate::record::{DECISIONS, StepRecord, open};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A line longer than this is no decision (a damaged log): it is skipped, never held.
pub(crate) const LONGEST_LINE: u64 = 16 << 20;

/// Lines that are no decisions tried one after another before a search takes a stretch of
/// the log for its end.
const TRIED: usize = 64;

/// An index not asked for in this long is dropped.
const UNUSED: Duration = Duration::from_secs(600);

#[derive(Deserialize)]
struct Key {
    population: usize,
    step: usize,
}

/// Where the steps' lines begin, as far as searches found them.
#[derive(Debug, Default, Clone)]
pub struct LogIndex {
    /// The file (device and inode) and its length when the starts were found: a log that
    /// shrank (a resume cut it back to its checkpoint) or was replaced is searched anew.
    file: Option<(u64, u64)>,
    len: u64,
    /// Position (1-based, as in `steps.csv`) -> the offset of its first line, or of the first
    /// line after it when it has none. Only starts that appending cannot move: a line at or
    /// after the position was there.
    starts: BTreeMap<usize, u64>,
}

/// The indexes of the logs that pages asked for, by run id.
#[derive(Default)]
pub(crate) struct Indexes(Mutex<HashMap<String, (LogIndex, Instant)>>);

impl Indexes {
    /// The index of run `id` (a new one when none is kept), taken out while it is used, so
    /// that a search of one log never waits on another's.
    pub fn take(&self, id: &str) -> LogIndex {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, (_, used)| used.elapsed() < UNUSED);
        all.remove(id).map(|(index, _)| index).unwrap_or_default()
    }

    pub fn put(&self, id: String, index: LogIndex) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (index, Instant::now()));
    }
}

/// The log of one run, open for a request: searches go through its index.
pub struct Log<'a> {
    index: &'a mut LogIndex,
    reader: BufReader<File>,
    /// Where `reader` is, when known: a page reads line after line without seeking (a seek
    /// drops the reader's buffer).
    at: Option<u64>,
    /// Up to the end of the last whole line: a line being appended is no decision yet.
    len: u64,
    /// The position of each (population, step) of `steps.csv`.
    positions: HashMap<(usize, usize), usize>,
    /// The position of the step being written (one past `steps.csv`), whose lines come last.
    going: usize,
}

/// One line of the log, as read.
pub struct Line {
    /// Where the next line starts.
    pub next: u64,
    /// The line without its newline; `None` when it was longer than [`LONGEST_LINE`].
    pub bytes: Option<Vec<u8>>,
}

impl LogIndex {
    /// The log of `dir`, whose steps so far are `steps`; `None` while there is none.
    pub fn open<'a>(&'a mut self, dir: &Path, steps: &[StepRecord]) -> io::Result<Option<Log<'a>>> {
        let file = match open::regular(dir, DECISIONS) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let id = file_id(&meta);
        let mut reader = BufReader::new(file);
        let len = whole_lines(&mut reader, meta.len())?;
        if self.file != Some(id) || len < self.len {
            *self = LogIndex::default();
        }
        self.file = Some(id);
        self.len = len;
        Ok(Some(Log {
            index: self,
            reader,
            at: None,
            len,
            positions: steps
                .iter()
                .enumerate()
                .map(|(i, s)| ((s.population, s.step), i + 1))
                .collect(),
            going: steps.len() + 1,
        }))
    }
}

#[cfg(unix)]
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_id(_: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

/// The end of the last whole line of a file of `len` bytes (0 when none ends within the
/// last [`LONGEST_LINE`] bytes).
fn whole_lines(reader: &mut BufReader<File>, len: u64) -> io::Result<u64> {
    const CHUNK: u64 = 64 << 10;
    let mut end = len;
    let mut chunk = vec![0u8; CHUNK as usize];
    while end > 0 && len - end <= LONGEST_LINE {
        let from = end.saturating_sub(CHUNK);
        let n = (end - from) as usize;
        reader.seek(SeekFrom::Start(from))?;
        reader.read_exact(&mut chunk[..n])?;
        if let Some(i) = chunk[..n].iter().rposition(|&b| b == b'\n') {
            return Ok(from + i as u64 + 1);
        }
        end = from;
    }
    Ok(0)
}

impl Log<'_> {
    /// The position of the step being written: its lines are not in `steps.csv` yet.
    pub fn going(&self) -> usize {
        self.going
    }

    /// The position a decision line belongs to: its step's in `steps.csv`, or the step being
    /// written's when `steps.csv` does not have it yet.
    pub(crate) fn position_of(&self, population: usize, step: usize) -> usize {
        self.positions
            .get(&(population, step))
            .copied()
            .unwrap_or(self.going)
    }

    fn seek(&mut self, to: u64) -> io::Result<()> {
        if self.at != Some(to) {
            self.reader.seek(SeekFrom::Start(to))?;
            self.at = Some(to);
        }
        Ok(())
    }

    /// The line starting at `at` (before the end of the last whole line).
    pub fn line(&mut self, at: u64) -> io::Result<Option<Line>> {
        if at >= self.len {
            return Ok(None);
        }
        self.seek(at)?;
        // Unknown until the reads below are done.
        self.at = None;
        let mut bytes = Vec::new();
        let n = (&mut self.reader)
            .take(LONGEST_LINE)
            .read_until(b'\n', &mut bytes)? as u64;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            self.at = Some(at + n);
            return Ok(Some(Line {
                next: at + n,
                bytes: Some(bytes),
            }));
        }
        // Too long to be a decision: skipped to its end.
        drop(bytes);
        let rest = self.reader.skip_until(b'\n')? as u64;
        self.at = Some(at + n + rest);
        Ok(Some(Line {
            next: (at + n + rest).min(self.len),
            bytes: None,
        }))
    }

    /// The start and position of the first decision line starting at or after `at`; the end
    /// of the log (and no position) when none does.
    fn first_from(&mut self, at: u64) -> io::Result<(u64, usize)> {
        let mut start = if at == 0 {
            0
        } else {
            // The line that `at - 1` falls in ends at the next newline.
            self.seek(at - 1)?;
            self.at = None;
            let skipped = self.reader.skip_until(b'\n')? as u64;
            self.at = Some(at - 1 + skipped);
            at - 1 + skipped
        };
        for _ in 0..TRIED {
            let Some(line) = self.line(start)? else {
                break;
            };
            if let Some(key) = line
                .bytes
                .as_deref()
                .and_then(|b| serde_json::from_slice::<Key>(b).ok())
            {
                return Ok((start, self.position_of(key.population, key.step)));
            }
            start = line.next;
        }
        Ok((self.len, usize::MAX))
    }

    /// The offset of the first line of position `p` or after it.
    fn start(&mut self, p: usize) -> io::Result<u64> {
        if let Some(&s) = self.index.starts.get(&p) {
            return Ok(s);
        }
        // The starts known around `p` bound the search.
        let mut lo = self
            .index
            .starts
            .range(..p)
            .next_back()
            .map_or(0, |(_, &s)| s);
        let mut hi = self
            .index
            .starts
            .range(p + 1..)
            .next()
            .map_or(self.len, |(_, &s)| s);
        // The first offset whose first line is of `p` or after: lines are in position order.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.first_from(mid)?.1 >= p {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let (start, found) = self.first_from(lo)?;
        if start < self.len {
            // Every position from `p` to the one found starts there.
            for q in p..=found.min(self.going) {
                self.index.starts.insert(q, start);
            }
        }
        Ok(start)
    }

    /// The byte range of the lines of position `p`.
    pub fn range(&mut self, p: usize) -> io::Result<(u64, u64)> {
        Ok((self.start(p)?, self.start(p + 1)?))
    }

    /// The positions that have lines, in order (the step being written last, when it has).
    pub fn positions(&mut self) -> io::Result<Vec<usize>> {
        let mut with = Vec::new();
        let mut p = 1;
        while p <= self.going {
            let start = self.start(p)?;
            if start >= self.len {
                break;
            }
            let (_, found) = self.first_from(start)?;
            if found > self.going {
                break;
            }
            with.push(found);
            p = found + 1;
        }
        Ok(with)
    }
}
