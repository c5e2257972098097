//! A page of a step's logged decisions from `decisions.jsonl`, filtered by arm, replicate,
//! role, fallback or population attribute, each with its agent's group path and attributes
//! (from the state table of that step), and the prompts the run kept (`prompts.jsonl`).
//!
//! The log is read through [`LogIndex`]: a page reads its step's lines from where the page
//! starts, at most [`SCANNED`] of them, and says where the next page starts, so that a page of
//! a multi-gigabyte log, or of a step of a million logged decisions, reads a page's worth.

use super::log::{Line, LogIndex};
use crate::record::columns::{texts, wholes};
use crate::record::{GROUPS, Manifest, PROMPTS, StepRecord, open};
use arrow_array::RecordBatch;
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::statistics::Statistics;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;

/// Decisions sent at most in one answer.
pub(crate) const MOST: usize = 1000;

/// Lines of a step read at most for one answer: a filter that matches few of a million
/// logged decisions answers with what it found among this many, and where to go on.
pub(crate) const SCANNED: usize = 20_000;

/// An attribute with more values than this among a step's agents (a name) filters nothing
/// useful, and is not offered.
const FEW_VALUES: usize = 50;

#[derive(Debug, thiserror::Error)]
pub enum DecisionsError {
    #[error(
        "`from` {from} is not a place among the decisions of step {step}: ask without it for the step's first page, and follow each answer's `next`"
    )]
    BadFrom { from: u64, step: usize },
}

/// What the page asks for.
#[derive(Debug, Default, Deserialize)]
pub struct Query {
    /// A step's position among the run's steps (1-based); the latest with decisions when
    /// absent (the step being written, while its decisions come).
    pub step: Option<usize>,
    pub arm: Option<String>,
    pub replicate: Option<usize>,
    pub role: Option<String>,
    /// `only` or `none`.
    pub fallback: Option<String>,
    pub attribute: Option<String>,
    pub value: Option<String>,
    pub limit: Option<usize>,
    /// Where the page starts: the `next` of the page before (the step's first line when
    /// absent).
    pub from: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Answer {
    pub step: Option<usize>,
    /// Whether `step` is the step being written (not in `steps.csv` yet).
    pub in_progress: bool,
    /// Positions of the steps that have logged decisions.
    pub steps: Vec<usize>,
    pub arms: Vec<String>,
    pub replicates: Vec<usize>,
    /// The roles among the lines read.
    pub roles: Vec<String>,
    /// Each attribute of the step's agents, with its values (when few).
    pub attributes: BTreeMap<String, Vec<String>>,
    /// Lines of the step read for this answer.
    pub scanned: usize,
    /// Whether the read stopped at [`SCANNED`] lines before the page was full.
    pub truncated: bool,
    /// Where the next page starts (`from`), while the step has more lines.
    pub next: Option<u64>,
    pub decisions: Vec<Value>,
    /// Why the log could not be read, when it could not.
    pub problem: Option<String>,
}

/// A page of the decisions of one step that match `q`.
pub fn answer(
    dir: &Path,
    manifest: Option<&Manifest>,
    steps: &[StepRecord],
    index: &mut LogIndex,
    q: &Query,
) -> Result<Answer, DecisionsError> {
    let mut answer = Answer {
        arms: manifest.map(|m| m.arms.clone()).unwrap_or_default(),
        replicates: (0..manifest.map_or(0, |m| m.replicates)).collect(),
        ..Answer::default()
    };
    match page(dir, steps, index, q, &mut answer) {
        Ok(()) => Ok(answer),
        Err(Failed::Bad(e)) => Err(e),
        Err(Failed::Io(e)) => {
            answer.problem = Some(format!("decisions.jsonl cannot be read: {e}"));
            answer.decisions.clear();
            answer.next = None;
            Ok(answer)
        }
    }
}

enum Failed {
    Bad(DecisionsError),
    Io(std::io::Error),
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Self {
        Failed::Io(e)
    }
}

fn page(
    dir: &Path,
    steps: &[StepRecord],
    index: &mut LogIndex,
    q: &Query,
    answer: &mut Answer,
) -> Result<(), Failed> {
    let Some(mut log) = index.open(dir, steps)? else {
        return Ok(());
    };
    answer.steps = log.positions()?;
    let chosen = match q.step {
        Some(p) => answer.steps.iter().copied().find(|&at| at == p),
        None => answer.steps.last().copied(),
    };
    let Some(at) = chosen else {
        return Ok(());
    };
    answer.step = Some(at);
    answer.in_progress = at == log.going();
    let (start, end) = log.range(at)?;
    let from = q.from.unwrap_or(start);
    if !(start..=end).contains(&from) {
        return Err(Failed::Bad(DecisionsError::BadFrom { from, step: at }));
    }
    let key = steps.get(at - 1).map(|s| (s.population, s.step));
    let state = key.and_then(|_| super::replay::state_file(dir, steps, at));
    // The agents whose attribute has the value asked for, when it is asked for.
    let having = match (q.attribute.as_deref(), q.value.as_deref(), &state, key) {
        (Some(a), Some(v), Some(state), Some(key)) if !a.is_empty() => {
            Some(agents_with(dir, state, key, a, v))
        }
        (Some(a), Some(_), _, _) if !a.is_empty() => Some(HashSet::new()),
        _ => None,
    };
    let limit = q.limit.unwrap_or(100).clamp(1, MOST);
    let mut roles = BTreeSet::new();
    let mut next = from;
    while next < end {
        if answer.scanned == SCANNED {
            answer.truncated = answer.decisions.len() < limit;
            break;
        }
        let Some(Line {
            next: after, bytes, ..
        }) = log.line(next)?
        else {
            break;
        };
        answer.scanned += 1;
        let decision = bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let Some(d) = decision.filter(|d| {
            let (Some(p), Some(s)) = (d["population"].as_u64(), d["step"].as_u64()) else {
                return false;
            };
            log.position_of(p as usize, s as usize) == at
        }) else {
            next = after;
            continue;
        };
        if let Some(r) = d["role"].as_str() {
            roles.insert(r.to_string());
        }
        if matches(&d, q, having.as_ref()) {
            if answer.decisions.len() == limit {
                // The next page starts with this one.
                break;
            }
            answer.decisions.push(d);
        }
        next = after;
    }
    answer.next = (next < end).then_some(next);
    answer.roles = roles.into_iter().collect();
    let agents = match (state, key) {
        (Some(state), Some(key)) => Agents::of(dir, &state, key, &answer.decisions),
        _ => Agents::default(),
    };
    for d in &mut answer.decisions {
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
    answer.attributes = agents.values;
    Ok(())
}

/// Whether decision `d` passes the filters of `q` (`having`: the agents the attribute filter
/// lets through).
fn matches(d: &Value, q: &Query, having: Option<&HashSet<AgentKey>>) -> bool {
    fn text(v: &Option<String>) -> Option<&str> {
        v.as_deref().filter(|s| !s.is_empty())
    }
    text(&q.arm).is_none_or(|a| d["arm"] == a)
        && q.replicate.is_none_or(|r| d["replicate"] == r)
        && text(&q.role).is_none_or(|r| d["role"] == r)
        && match q.fallback.as_deref() {
            Some("only") => !d["fallback"].is_null(),
            Some("none") => d["fallback"].is_null(),
            _ => true,
        }
        && having.is_none_or(|set| agent_key(d).is_some_and(|k| set.contains(&k)))
}

type AgentKey = (String, usize, usize);

fn agent_key(d: &Value) -> Option<AgentKey> {
    Some((
        d.get("arm")?.as_str()?.to_string(),
        d.get("replicate")?.as_u64()? as usize,
        d.get("agent")?.as_u64()? as usize,
    ))
}

/// The agents of the page's decisions, as the state table of their step has them.
#[derive(Default)]
struct Agents {
    of: HashMap<AgentKey, (Option<String>, BTreeMap<String, String>)>,
    /// Attribute -> its values among the step's agents.
    values: BTreeMap<String, Vec<String>>,
}

/// Columns of the state table that are keys or the scenario's own text, not attributes.
const NOT_ATTRIBUTES: &[&str] = &["arm", "role", "policy", "kind", "persona_text"];

/// The text columns of a batch that are attributes.
fn attribute_columns(b: &RecordBatch) -> Vec<(String, Vec<String>)> {
    b.schema()
        .fields()
        .iter()
        .filter(|f| {
            matches!(f.data_type(), DataType::Utf8 | DataType::Dictionary(..))
                && !NOT_ATTRIBUTES.contains(&f.name().as_str())
        })
        .filter_map(|f| text_column(b, f.name()).map(|c| (f.name().clone(), c)))
        .collect()
}

/// The keys of a batch's rows: (arm, population, replicate, step, agent) columns.
struct Keys {
    arm: Vec<String>,
    population: Vec<usize>,
    replicate: Vec<usize>,
    step: Vec<usize>,
    agent: Vec<usize>,
}

impl Keys {
    fn of(b: &RecordBatch) -> Option<Self> {
        Some(Keys {
            arm: text_column(b, "arm")?,
            population: whole_column(b, "population")?,
            replicate: whole_column(b, "replicate")?,
            step: whole_column(b, "step")?,
            agent: whole_column(b, "agent")?,
        })
    }

    fn at(&self, r: usize, key: (usize, usize)) -> Option<AgentKey> {
        ((self.population[r], self.step[r]) == key)
            .then(|| (self.arm[r].clone(), self.replicate[r], self.agent[r]))
    }
}

impl Agents {
    fn of(dir: &Path, state: &str, key: (usize, usize), decisions: &[Value]) -> Self {
        let wanted: HashSet<AgentKey> = decisions.iter().filter_map(agent_key).collect();
        let mut agents = Agents::default();
        let levels = level_names(dir);
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for b in step_batches(dir, state, key) {
            let Some(keys) = Keys::of(&b) else {
                continue;
            };
            let level_cols: Vec<(&String, Vec<usize>)> = levels
                .iter()
                .filter_map(|l| whole_column(&b, l).map(|c| (l, c)))
                .collect();
            let attr_cols = attribute_columns(&b);
            for r in 0..b.num_rows() {
                let Some(who) = keys.at(r, key) else {
                    continue;
                };
                for (n, c) in &attr_cols {
                    let values = seen.entry(n.clone()).or_default();
                    if values.len() <= FEW_VALUES {
                        values.insert(c[r].clone());
                    }
                }
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
                agents.of.insert(who, (group, attrs));
            }
        }
        agents.values = seen
            .into_iter()
            .filter(|(_, v)| v.len() <= FEW_VALUES)
            .map(|(n, v)| (n, v.into_iter().collect()))
            .collect();
        agents
    }

    fn of_agent(&self, who: &AgentKey) -> (Option<String>, BTreeMap<String, String>) {
        self.of.get(who).cloned().unwrap_or_default()
    }
}

/// The agents of step `key` whose `attribute` is `value`.
fn agents_with(
    dir: &Path,
    state: &str,
    key: (usize, usize),
    attribute: &str,
    value: &str,
) -> HashSet<AgentKey> {
    let mut found = HashSet::new();
    for b in step_batches(dir, state, key) {
        let (Some(keys), Some(values)) = (Keys::of(&b), text_column(&b, attribute)) else {
            continue;
        };
        for (r, v) in values.iter().enumerate() {
            if v == value
                && let Some(who) = keys.at(r, key)
            {
                found.insert(who);
            }
        }
    }
    found
}

/// The batches of the state file `name` of `dir` that may hold rows of step `key`, one at a
/// time (the row groups whose statistics rule the step out are skipped); none when it cannot
/// be read (a page shows the decisions without attributes then).
fn step_batches(dir: &Path, name: &str, key: (usize, usize)) -> impl Iterator<Item = RecordBatch> {
    let reader = (|| {
        let file = open::regular(dir, name).ok()?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).ok()?;
        let groups = row_groups_of(builder.metadata(), key);
        builder
            .with_row_groups(groups)
            .with_batch_size(65536)
            .build()
            .ok()
    })();
    reader.into_iter().flatten().map_while(Result::ok)
}

/// The row groups whose `population` and `step` statistics may include `key`.
fn row_groups_of(meta: &ParquetMetaData, key: (usize, usize)) -> Vec<usize> {
    let schema = meta.file_metadata().schema_descr();
    let column = |name: &str| (0..schema.num_columns()).find(|&i| schema.column(i).name() == name);
    let all = 0..meta.num_row_groups();
    let (Some(p), Some(s)) = (column("population"), column("step")) else {
        return all.collect();
    };
    all.filter(|&g| {
        let rg = meta.row_group(g);
        [(p, key.0), (s, key.1)]
            .iter()
            .all(|&(c, v)| rg.column(c).statistics().is_none_or(|st| within(st, v)))
    })
    .collect()
}

fn within(st: &Statistics, v: usize) -> bool {
    let v = v as i128;
    let (lo, hi) = match st {
        Statistics::Int64(s) => (
            s.min_opt().map(|&x| x as u64 as i128),
            s.max_opt().map(|&x| x as u64 as i128),
        ),
        Statistics::Int32(s) => (
            s.min_opt().map(|&x| x as u32 as i128),
            s.max_opt().map(|&x| x as u32 as i128),
        ),
        _ => return true,
    };
    lo.is_none_or(|lo| lo <= v) && hi.is_none_or(|hi| v <= hi)
}

/// The run's group levels, innermost first, from the first batch of its groups table.
fn level_names(dir: &Path) -> Vec<String> {
    let merged = format!("{GROUPS}.parquet");
    let parts = format!("{GROUPS}.parts");
    let name = if open::regular(dir, &merged).is_ok() {
        Some(merged)
    } else {
        super::folders::listing(dir, &parts)
            .into_iter()
            .filter(|n| n.ends_with(".parquet"))
            .min()
            .map(|n| format!("{parts}/{n}"))
    };
    let Some(file) = name.and_then(|n| open::regular(dir, &n).ok()) else {
        return Vec::new();
    };
    let Some(reader) = ParquetRecordBatchReaderBuilder::try_new(file)
        .ok()
        .and_then(|b| b.with_batch_size(65536).build().ok())
    else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    for b in reader.map_while(Result::ok) {
        for l in text_column(&b, "level").unwrap_or_default() {
            if !names.contains(&l) {
                names.push(l);
            }
        }
    }
    names
}

/// Column `name` of `b` as text (a missing value empty).
fn text_column(b: &RecordBatch, name: &str) -> Option<Vec<String>> {
    texts(b.column_by_name(name)?.as_ref(), "")
}

/// Column `name` of `b` as whole numbers.
fn whole_column(b: &RecordBatch, name: &str) -> Option<Vec<usize>> {
    wholes(b.column_by_name(name)?.as_ref())
}

/// The prompt with `hash`, if the run kept it (`prompts.jsonl`: one line per distinct prompt
/// of a logged decision), read a line at a time.
pub fn prompt(dir: &Path, hash: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Kept {
        hash: String,
        text: String,
    }
    let file = open::regular(dir, PROMPTS).ok()?;
    let mut reader = std::io::BufReader::new(file);
    let needle = format!("\"{hash}\"");
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = std::io::Read::take(&mut reader, super::log::LONGEST_LINE)
            .read_until(b'\n', &mut line)
            .ok()?;
        if n == 0 {
            return None;
        }
        if line.last() != Some(&b'\n') && n as u64 == super::log::LONGEST_LINE {
            // Too long to read whole: skipped.
            reader.skip_until(b'\n').ok()?;
            continue;
        }
        // Only a line that names the hash is parsed.
        if line.windows(needle.len()).any(|w| w == needle.as_bytes())
            && let Ok(k) = serde_json::from_slice::<Kept>(&line)
            && k.hash == hash
        {
            return Some(k.text);
        }
    }
}
