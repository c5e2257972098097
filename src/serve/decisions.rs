//! A step's sampled decisions from `decisions.jsonl`, filtered by role, fallback or
//! population attribute, each with its agent's group path and attributes (from the state
//! table of that step), and the prompts the run kept (`prompts.jsonl`).
//!
//! The log is indexed by byte range per step as it grows, so that a page of a long run reads
//! one step's lines, not the whole log.

use crate::record::{DECISIONS, GROUPS, PROMPTS, StepRecord};
use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Seek, SeekFrom};
use std::path::Path;

/// Decisions sent at most in one answer.
pub const MOST: usize = 1000;

/// Lines of one step read at most for one answer: a step whose every one of a million
/// decisions was logged is filtered over its first this many, and the answer says so.
pub const SCANNED: usize = 20_000;

/// Where each step's lines lie in `decisions.jsonl`, as far as it has been read.
#[derive(Debug, Default, Clone)]
pub struct LogIndex {
    /// Bytes indexed (up to a whole line).
    len: u64,
    /// (population, step) -> byte ranges, in the log's order.
    ranges: BTreeMap<(usize, usize), Vec<(u64, u64)>>,
}

#[derive(Deserialize)]
struct Key {
    population: usize,
    step: usize,
}

impl LogIndex {
    /// Reads what the log gained since the last call.
    pub fn update(&mut self, dir: &Path) {
        let path = dir.join(DECISIONS);
        let Ok(mut file) = std::fs::File::open(&path) else {
            return;
        };
        let len = file.metadata().map_or(0, |m| m.len());
        if len < self.len {
            // Rewound (a resume cut the log back to its checkpoint): index it anew.
            *self = LogIndex::default();
        }
        if len == self.len || file.seek(SeekFrom::Start(self.len)).is_err() {
            return;
        }
        let mut bytes = Vec::new();
        if file.take(len - self.len).read_to_end(&mut bytes).is_err() {
            return;
        }
        let mut start = 0usize;
        while let Some(end) = bytes[start..].iter().position(|&b| b == b'\n') {
            let line = &bytes[start..start + end];
            if let Ok(k) = serde_json::from_slice::<Key>(line) {
                let at = self.len + start as u64;
                let ranges = self.ranges.entry((k.population, k.step)).or_default();
                match ranges.last_mut() {
                    Some(last) if last.1 == at => last.1 = at + end as u64 + 1,
                    _ => ranges.push((at, at + end as u64 + 1)),
                }
            }
            start += end + 1;
        }
        self.len += start as u64;
    }

    /// The step's first [`SCANNED`] lines, and whether it has more.
    fn lines(&self, dir: &Path, key: (usize, usize)) -> (Vec<Value>, bool) {
        let Some(ranges) = self.ranges.get(&key) else {
            return (Vec::new(), false);
        };
        let Ok(file) = std::fs::File::open(dir.join(DECISIONS)) else {
            return (Vec::new(), false);
        };
        let mut reader = std::io::BufReader::new(file);
        let mut out = Vec::new();
        let mut line = Vec::new();
        for &(a, b) in ranges {
            if reader.seek(SeekFrom::Start(a)).is_err() {
                continue;
            }
            let mut at = a;
            while at < b {
                if out.len() == SCANNED {
                    return (out, true);
                }
                line.clear();
                match std::io::BufRead::read_until(&mut reader, b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => at += n as u64,
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                    out.push(v);
                }
            }
        }
        (out, false)
    }
}

/// What the page asks for.
#[derive(Debug, Default, Deserialize)]
pub struct Query {
    /// A step's position among the run's steps (1-based); the latest with decisions when
    /// absent.
    pub step: Option<usize>,
    pub role: Option<String>,
    /// `only` or `none`.
    pub fallback: Option<String>,
    pub attribute: Option<String>,
    pub value: Option<String>,
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct Answer {
    pub step: Option<usize>,
    /// Positions of the steps that have logged decisions.
    pub steps: Vec<usize>,
    pub roles: Vec<String>,
    pub attributes: BTreeMap<String, Vec<String>>,
    pub total: usize,
    /// Whether the step has more logged decisions than were read (see [`SCANNED`]): `total`
    /// then counts the matches among the first of them.
    pub truncated: bool,
    pub decisions: Vec<Value>,
}

/// The decisions of one step that match `q`.
pub fn answer(dir: &Path, steps: &[StepRecord], index: &LogIndex, q: &Query) -> Answer {
    let positions: Vec<((usize, usize), usize)> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.population, s.step), i + 1))
        .filter(|(k, _)| index.ranges.contains_key(k))
        .collect();
    let chosen = match q.step {
        Some(p) => positions.iter().find(|(_, at)| *at == p).copied(),
        None => positions.last().copied(),
    };
    let mut answer = Answer {
        step: chosen.map(|(_, at)| at),
        steps: positions.iter().map(|(_, at)| *at).collect(),
        roles: Vec::new(),
        attributes: BTreeMap::new(),
        total: 0,
        truncated: false,
        decisions: Vec::new(),
    };
    let Some((key, at)) = chosen else {
        return answer;
    };
    let (mut lines, truncated) = index.lines(dir, key);
    answer.truncated = truncated;
    let agents = match super::replay::state_file(dir, steps, at) {
        Some(state) => Agents::of(dir, &state, key, &lines),
        None => Agents::default(),
    };
    let mut roles = std::collections::BTreeSet::new();
    for d in &mut lines {
        if let Some(r) = d.get("role").and_then(Value::as_str) {
            roles.insert(r.to_string());
        }
        let who = agent_key(d);
        if let (Some(who), Some(obj)) = (who, d.as_object_mut()) {
            let (group, attrs) = agents.of_agent(&who);
            obj.insert("group".into(), group.map_or(Value::Null, Value::String));
            obj.insert(
                "attributes".into(),
                serde_json::to_value(attrs).unwrap_or_default(),
            );
        }
    }
    answer.roles = roles.into_iter().collect();
    answer.attributes = agents.values;
    let kept: Vec<Value> = lines
        .into_iter()
        .filter(|d| {
            q.role
                .as_deref()
                .is_none_or(|r| r.is_empty() || d["role"] == r)
        })
        .filter(|d| match q.fallback.as_deref() {
            Some("only") => !d["fallback"].is_null(),
            Some("none") => d["fallback"].is_null(),
            _ => true,
        })
        .filter(|d| match (q.attribute.as_deref(), q.value.as_deref()) {
            (Some(a), Some(v)) if !a.is_empty() => d["attributes"][a] == v,
            _ => true,
        })
        .collect();
    answer.total = kept.len();
    answer.decisions = kept
        .into_iter()
        .take(q.limit.unwrap_or(100).min(MOST))
        .collect();
    answer
}

type AgentKey = (String, usize, usize);

fn agent_key(d: &Value) -> Option<AgentKey> {
    Some((
        d.get("arm")?.as_str()?.to_string(),
        d.get("replicate")?.as_u64()? as usize,
        d.get("agent")?.as_u64()? as usize,
    ))
}

/// The agents of the logged decisions, as the state table of their step has them.
#[derive(Default)]
struct Agents {
    of: HashMap<AgentKey, (Option<String>, BTreeMap<String, String>)>,
    /// Attribute -> its values among these agents.
    values: BTreeMap<String, Vec<String>>,
}

/// Columns of the state table that are keys or the scenario's own text, not attributes.
const NOT_ATTRIBUTES: &[&str] = &["arm", "role", "policy", "kind", "persona_text"];

impl Agents {
    fn of(dir: &Path, state: &Path, key: (usize, usize), lines: &[Value]) -> Self {
        let wanted: std::collections::HashSet<AgentKey> =
            lines.iter().filter_map(agent_key).collect();
        let mut agents = Agents::default();
        if wanted.is_empty() {
            return agents;
        }
        let levels = level_names(dir);
        let Some(batches) = batches(state) else {
            return agents;
        };
        let mut seen: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for b in batches {
            let (Some(arm), Some(pop), Some(rep), Some(step), Some(agent)) = (
                text_column(&b, "arm"),
                whole_column(&b, "population"),
                whole_column(&b, "replicate"),
                whole_column(&b, "step"),
                whole_column(&b, "agent"),
            ) else {
                continue;
            };
            let level_cols: Vec<(&String, Vec<usize>)> = levels
                .iter()
                .filter_map(|l| whole_column(&b, l).map(|c| (l, c)))
                .collect();
            let attr_cols: Vec<(String, Vec<String>)> = b
                .schema()
                .fields()
                .iter()
                .filter(|f| {
                    matches!(f.data_type(), DataType::Utf8 | DataType::Dictionary(..))
                        && !NOT_ATTRIBUTES.contains(&f.name().as_str())
                })
                .filter_map(|f| text_column(&b, f.name()).map(|c| (f.name().clone(), c)))
                .collect();
            for r in 0..b.num_rows() {
                if pop[r] != key.0 || step[r] != key.1 {
                    continue;
                }
                let who = (arm[r].clone(), rep[r], agent[r]);
                if !wanted.contains(&who) {
                    continue;
                }
                let group = (!level_cols.is_empty()).then(|| {
                    level_cols
                        .iter()
                        .map(|(l, c)| format!("{l} {}", c[r]))
                        .collect::<Vec<_>>()
                        .join(" / ")
                });
                let attrs: BTreeMap<String, String> = attr_cols
                    .iter()
                    .map(|(n, c)| (n.clone(), c[r].clone()))
                    .collect();
                for (n, v) in &attrs {
                    seen.entry(n.clone()).or_default().insert(v.clone());
                }
                agents.of.insert(who, (group, attrs));
            }
        }
        // An attribute with a value per agent (a name) filters nothing useful.
        agents.values = seen
            .into_iter()
            .filter(|(_, v)| v.len() <= 50)
            .map(|(n, v)| (n, v.into_iter().collect()))
            .collect();
        agents
    }

    fn of_agent(&self, who: &AgentKey) -> (Option<String>, BTreeMap<String, String>) {
        self.of.get(who).cloned().unwrap_or_default()
    }
}

/// Every batch of a Parquet file, or none if it cannot be read (a page shows the decisions
/// without attributes then).
fn batches(path: &Path) -> Option<Vec<RecordBatch>> {
    let file = std::fs::File::open(path).ok()?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .ok()?
        .with_batch_size(65536)
        .build()
        .ok()?;
    reader.collect::<Result<Vec<_>, _>>().ok()
}

/// The run's group levels, innermost first, from the first batch of its groups table.
fn level_names(dir: &Path) -> Vec<String> {
    let merged = dir.join(format!("{GROUPS}.parquet"));
    let first_part = std::fs::read_dir(dir.join(format!("{GROUPS}.parts")))
        .ok()
        .and_then(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
                .min()
        });
    let path = if merged.is_file() {
        Some(merged)
    } else {
        first_part
    };
    let Some(batches) = path.and_then(|p| batches(&p)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    for b in &batches {
        for l in text_column(b, "level").unwrap_or_default() {
            if !names.contains(&l) {
                names.push(l);
            }
        }
    }
    names
}

fn text_column(b: &RecordBatch, name: &str) -> Option<Vec<String>> {
    let c = arrow_cast::cast(b.column_by_name(name)?, &DataType::Utf8).ok()?;
    let s = c.as_string::<i32>();
    Some(
        (0..s.len())
            .map(|i| {
                if s.is_valid(i) {
                    s.value(i).to_string()
                } else {
                    String::new()
                }
            })
            .collect(),
    )
}

fn whole_column(b: &RecordBatch, name: &str) -> Option<Vec<usize>> {
    let c = arrow_cast::cast(b.column_by_name(name)?, &DataType::UInt64).ok()?;
    let c = c.as_primitive::<arrow_array::types::UInt64Type>();
    Some(c.values().iter().map(|&v| v as usize).collect())
}

/// The prompt with `hash`, if the run kept it (`prompts.jsonl`: one line per distinct prompt
/// of a logged decision).
pub fn prompt(dir: &Path, hash: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Kept {
        hash: String,
        text: String,
    }
    let text = std::fs::read_to_string(dir.join(PROMPTS)).ok()?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Kept>(l).ok())
        .find(|k| k.hash == hash)
        .map(|k| k.text)
}
