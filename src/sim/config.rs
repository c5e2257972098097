//! Experiment configs: one TOML file says what to simulate, how often, with which policy, and
//! the scenario's own knobs in a section named after it. Every mistake is reported with the
//! file, the line and the field.

use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A config problem: at a place in a file, or in a command-line flag.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{}:{line}:{column}: {message}", file.display())]
    At {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: cannot read the config: {message}", file.display())]
    Read { file: PathBuf, message: String },
    /// A command-line override that the config's rules refuse.
    #[error("{flag}: {message}")]
    Flag { flag: String, message: String },
}

impl ConfigError {
    /// The line (1-based) a problem in a file is at.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::At { line, .. } => Some(*line),
            _ => None,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            ConfigError::At { message, .. }
            | ConfigError::Read { message, .. }
            | ConfigError::Flag { message, .. } => message,
        }
    }
}

/// A TOML source and the means to point into it.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    pub text: String,
}

impl Source {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            file: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
        })
    }

    /// The line (1-based) of byte offset `at`.
    pub fn line(&self, at: usize) -> usize {
        self.text[..at.min(self.text.len())].matches('\n').count() + 1
    }

    /// An error at byte range `span` (0 when unknown).
    pub fn error(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let at = span.map_or(0, |s| s.start.min(self.text.len()));
        let before = &self.text[..at];
        let line = self.line(at);
        let column = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        ConfigError::At {
            file: self.path.clone(),
            line,
            column,
            message: message.into(),
        }
    }

    /// Deserialises `T` from the whole file, mapping serde's error to its place and naming
    /// the field set on that line.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(&self.text).map_err(|e| {
            let message = e.message().trim().to_string();
            let key = e.span().and_then(|span| {
                let start = self.text[..span.start.min(self.text.len())]
                    .rfind('\n')
                    .map_or(0, |i| i + 1);
                let line = self.text[start..].lines().next()?;
                let (key, _) = line.split_once('=')?;
                let key = key.trim().trim_matches('"');
                (!key.is_empty() && !key.starts_with('[') && !message.contains(&format!("`{key}`")))
                    .then(|| key.to_string())
            });
            let message = match key {
                Some(key) => format!("field `{key}`: {message}"),
                None => message,
            };
            self.error(e.span(), message)
        })
    }

    /// Folder the file is in: relative paths in it are relative to there.
    pub fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }
}

/// How agents decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Ask the language model (all agents of a step in one batch).
    Llm,
    /// The scenario's deterministic rules: a classic agent-based baseline.
    Scripted,
}

impl PolicyKind {
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Llm => "llm",
            PolicyKind::Scripted => "scripted",
        }
    }
}

pub use super::limits::MAX_TEMPERATURE;

/// Sampling and model settings of the `llm` policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// A preset, folder, GGUF file or Hub repo id (the CLI's --model overrides it). Unset,
    /// the program's default, which it gives at load ([`Overrides::default_model`]): the
    /// simulation layer knows no model of its own.
    ///
    /// [`Overrides::default_model`]: crate::sim::experiment::Overrides::default_model
    pub model: Option<String>,
    /// Most tokens one decision may take; a decision cut short falls back to "no change".
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    /// Requests in flight at most: prompts are rendered and tokenized a wave at a time, so a
    /// million agents never sit in memory as a million prompts.
    pub wave: usize,
}

impl Default for LlmConfig {
    fn default() -> Self {
        // Ollama's defaults, which the reference experiments ran with.
        Self {
            model: None,
            max_tokens: 96,
            temperature: 0.8,
            top_p: 0.9,
            top_k: Some(40),
            wave: 4096,
        }
    }
}

/// An arm's or a policy group's changes to the `[llm]` settings: the model (a preset, folder,
/// GGUF file or Hub repo id, as `[llm] model`) and the sampling (e.g. a temperature sweep).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmOverrides {
    /// Another model than `[llm] model` (which `--model` sets): arms and groups that name
    /// their own keep it whatever the command line says.
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

impl LlmOverrides {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    pub fn apply(&self, base: &LlmConfig) -> LlmConfig {
        LlmConfig {
            model: self.model.clone().or_else(|| base.model.clone()),
            max_tokens: self.max_tokens.unwrap_or(base.max_tokens),
            temperature: self.temperature.unwrap_or(base.temperature),
            top_p: self.top_p.unwrap_or(base.top_p),
            top_k: self.top_k.or(base.top_k),
            ..base.clone()
        }
    }
}

/// A named variant of the scenario: its `scenario` table overrides the base one (e.g.
/// personas off for a control arm), its `llm` table the sampling.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmConfig {
    pub name: String,
    #[serde(default)]
    pub scenario: toml::Table,
    /// The step (counted from 1) from which the arm's `scenario` changes hold: the steps before
    /// it are the base's (a price cap changed at step 6 of 10). None: from the start.
    pub from_step: Option<i64>,
    #[serde(default)]
    pub llm: LlmOverrides,
    /// The policy of the arm's agents outside its policy groups, in place of the
    /// experiment's `policy` (an LLM arm beside its scripted baseline). None: the experiment's.
    pub policy: Option<PolicyKind>,
    /// The arm's own `[[arms.policy_groups]]`, in place of the experiment's. None: the
    /// experiment's groups.
    pub policy_groups: Option<Vec<toml::Spanned<PolicyGroupConfig>>>,
}

/// `[sweep]`: every combination of the listed values becomes an arm (crossed with the
/// `[[arms]]`, if any).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Scenario knob -> values.
    #[serde(default)]
    pub scenario: indexmap::IndexMap<String, Vec<toml::Value>>,
    /// Model or sampling setting (`model`, `temperature`, `top_p`, `top_k`, `max_tokens`) ->
    /// values: `model = ["a", "b"]` makes one arm per model.
    #[serde(default)]
    pub llm: indexmap::IndexMap<String, Vec<toml::Value>>,
}

/// `[counterfactual]`: the run this one changes. Its decisions are reused wherever this run's
/// inputs equal its (as `--reuse` does), and the report sets each arm beside it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterfactualConfig {
    /// The base run's folder, relative to the folder throng runs in (as `--out` and `--reuse`).
    pub base: PathBuf,
    /// The base run's arm to compare with; needed when it has several.
    pub arm: Option<String>,
}

/// `[[policy_groups]]`: agents that use another policy than the experiment's `policy`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyGroupConfig {
    pub policy: PolicyKind,
    /// A seeded sample of this share of the matching agents (1 = all of them).
    #[serde(default = "all")]
    pub share: f64,
    /// Population attributes the agents must have: `{ education = "doctorate" }`, a list of
    /// categories, or `[low, high]` for a numeric attribute.
    #[serde(default, rename = "where")]
    pub filter: toml::Table,
    /// The group's own model and sampling (`llm = { model = "...", temperature = 0.7 }`),
    /// over its arm's: an `llm` group only.
    #[serde(default)]
    pub llm: LlmOverrides,
}

fn all() -> f64 {
    1.0
}

/// What the decisions log keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "DecisionLogSpec")]
pub enum DecisionLogMode {
    /// Every decision.
    #[default]
    All,
    /// None (aggregates and the state table are still kept).
    None,
    /// Every decision of a seeded sample of this many agents per cell.
    Sample(usize),
}

/// [`DecisionLogMode`] as written, checked as it is read, so that a mistake is reported at
/// its line.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum DecisionLogSpec {
    All,
    None,
    Sample(usize),
}

impl TryFrom<DecisionLogSpec> for DecisionLogMode {
    type Error = CountError;
    fn try_from(spec: DecisionLogSpec) -> Result<Self, CountError> {
        Ok(match spec {
            DecisionLogSpec::All => DecisionLogMode::All,
            DecisionLogSpec::None => DecisionLogMode::None,
            DecisionLogSpec::Sample(0) => return Err(CountError::EmptySample),
            DecisionLogSpec::Sample(n) => DecisionLogMode::Sample(n),
        })
    }
}

/// Whether the state table is also written as CSV.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CsvMode {
    /// While a step's state has at most `csv_max_rows` rows.
    #[default]
    Auto,
    Always,
    Never,
}

/// `[records]`: what a run writes beside its state Parquet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordsConfig {
    pub decisions: DecisionLogMode,
    pub csv: CsvMode,
    pub csv_max_rows: usize,
}

impl Default for RecordsConfig {
    fn default() -> Self {
        Self {
            decisions: DecisionLogMode::All,
            csv: CsvMode::Auto,
            csv_max_rows: 200_000,
        }
    }
}

impl RecordsConfig {
    /// Whether a run whose largest step has `rows` state rows writes them as CSV too.
    pub(crate) fn state_csv(&self, rows: usize) -> bool {
        match self.csv {
            CsvMode::Always => true,
            CsvMode::Never => false,
            CsvMode::Auto => rows <= self.csv_max_rows,
        }
    }
}

/// An experiment, as written in its TOML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Names the run's folder (`runs/<name>-<unix time>`): one path component.
    #[serde(deserialize_with = "run_name")]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub seed: u64,
    /// Independent repetitions of every arm and population size.
    #[serde(default = "one", deserialize_with = "replicates")]
    pub replicates: Count,
    #[serde(deserialize_with = "steps")]
    pub steps: Count,
    /// The policy of every agent outside `policy_groups`.
    #[serde(default = "default_policy")]
    pub policy: PolicyKind,
    /// Past turns (prompt and reply) each agent keeps in its prompt; 0 for memoryless agents.
    #[serde(default)]
    pub history: usize,
    /// Folder of the scenario's prompt templates, relative to this file.
    pub templates: Option<toml::Spanned<PathBuf>>,
    #[serde(default)]
    pub llm: LlmConfig,
    /// Population sizes to run (each with every arm and replicate).
    pub agents: Sizes,
    /// `name` picks the scenario; every other key is the scenario's own knob.
    pub scenario: toml::Spanned<toml::Table>,
    #[serde(default)]
    pub arms: Vec<toml::Spanned<ArmConfig>>,
    pub sweep: Option<toml::Spanned<SweepConfig>>,
    pub population: Option<toml::Spanned<super::population::PopulationConfig>>,
    #[serde(default)]
    pub policy_groups: Vec<toml::Spanned<PolicyGroupConfig>>,
    #[serde(default)]
    pub records: RecordsConfig,
    /// `[counterfactual]`: a finished run this one's arms are set beside, step by step.
    pub counterfactual: Option<toml::Spanned<CounterfactualConfig>>,
    /// How the ranks of an MPI job share the work (`throng run --split` overrides it).
    #[serde(default)]
    pub split: Split,
}

/// How the ranks of a job share a run. The records are the same whichever is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// `cells` when the cells of a population size can be dealt out evenly, else `agents`.
    #[default]
    Auto,
    /// Cells (arms x replicates) are dealt out to ranks; each steps its own.
    Cells,
    /// Every rank holds every cell and decides for its share of the agents; decisions are
    /// exchanged every step.
    Agents,
    /// Every rank holds every cell; each model belongs to one rank (the run's `i`-th model to
    /// rank `i % ranks`), which alone loads it and decides for its agents (scripted agents go
    /// with their cell, cell `c` to rank `c % ranks`); decisions are exchanged every step.
    /// A device then holds only the models its agents need.
    Models,
}

/// The longest `name` taken: the folder `<name>-<unix time>` must fit a file name's 255 bytes.
pub(crate) const MAX_NAME_BYTES: usize = 200;

/// Why `name` cannot name a run folder, if it cannot: it becomes one component of a path
/// (`runs/<name>-<unix time>`), so it must be non-empty, hold no separator, not be `.` or
/// `..`, and hold no control character.
pub(crate) fn check_run_name(name: &str) -> Result<(), RunNameError> {
    const FIX: &str =
        "give a short name of letters, digits, `-`, `_` or `.` (e.g. name = \"exp1\")";
    let problem = if name.trim().is_empty() {
        "is empty".to_string()
    } else if let Some(c) = name.chars().find(|&c| c == '/' || c == '\\') {
        format!(
            "holds the path separator `{c}`: a name is one folder name, not a path (use --out to choose where the run goes)"
        )
    } else if name == "." {
        "is `.`, the current folder, not a folder of its own".to_string()
    } else if name == ".." {
        "is `..`, the folder above, not a folder of its own".to_string()
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        format!("holds the control character {c:?}")
    } else if name.len() > MAX_NAME_BYTES {
        format!(
            "is {} bytes long, more than the {MAX_NAME_BYTES} a folder name can take",
            name.len()
        )
    } else {
        return Ok(());
    };
    let shown: String = name.chars().take(40).collect();
    let shown = match shown.len() < name.len() {
        true => format!("{shown:?}..."),
        false => format!("{shown:?}"),
    };
    Err(RunNameError(format!(
        "{shown} cannot name a run folder: it {problem}; {FIX}"
    )))
}

/// Why a config's `name` cannot name a run folder, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RunNameError(String);

/// Why a count of a config (steps, replicates, population sizes, a decision log's sample) is
/// refused; the field is named by whoever read it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountError {
    #[error("must be at least 1, got {0}")]
    BelowOne(i64),
    #[error(
        "{0} steps are more than the {MAX_STEPS} a run may take: every step writes a Parquet part of each table and a checkpoint"
    )]
    TooManySteps(i64),
    #[error("{0} replicates are more than the {MAX_REPLICATES} a run may have")]
    TooManyReplicates(i64),
    #[error("give at least one population size")]
    NoSizes,
    #[error("{0} population sizes are more than the {MAX_POPULATION_SIZES} a run may list")]
    TooManySizes(usize),
    #[error("a population needs at least 2 agents, got {0}")]
    TooFewAgents(i64),
    /// A size listed twice runs the same cells twice under the same keys, and the report
    /// then counts each of those games twice in its intervals.
    #[error(
        "the population size {0} is listed twice: each size runs its own cells, so list it \
         once (for more games of one size, raise `replicates`)"
    )]
    SizeTwice(i64),
    #[error("a sample of 0 agents logs nothing: use decisions = \"none\", or sample at least 1")]
    EmptySample,
}

fn run_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    check_run_name(&name).map_err(serde::de::Error::custom)?;
    Ok(name)
}

fn one() -> Count {
    Count(1)
}

fn default_policy() -> PolicyKind {
    PolicyKind::Llm
}

/// The most steps a run may take: every step writes a Parquet part of each table (joined when
/// the run ends) and a checkpoint, so 100,000 steps already leave 100,000 files per table.
pub(crate) const MAX_STEPS: usize = 100_000;
/// The most replicates: a million games or markets of each arm and population size.
pub(crate) const MAX_REPLICATES: usize = 1_000_000;
/// The most arms a run may have, `[[arms]]` crossed with every `[sweep]` combination.
pub(crate) const MAX_ARMS: usize = 10_000;
/// The most population sizes a run may list (each is a group of Parquet parts, numbered in
/// three digits).
pub(crate) const MAX_POPULATION_SIZES: usize = 1_000;

/// A count that must be at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Count(pub usize);

impl Count {
    pub fn new(n: i64) -> Result<Self, CountError> {
        if n < 1 {
            return Err(CountError::BelowOne(n));
        }
        Ok(Count(n as usize))
    }

    /// A run's steps: at least 1, at most [`MAX_STEPS`].
    pub fn steps(n: i64) -> Result<Self, CountError> {
        let count = Self::new(n)?;
        if count.0 > MAX_STEPS {
            return Err(CountError::TooManySteps(n));
        }
        Ok(count)
    }

    /// A run's replicates: at least 1, at most [`MAX_REPLICATES`].
    pub fn replicates(n: i64) -> Result<Self, CountError> {
        let count = Self::new(n)?;
        if count.0 > MAX_REPLICATES {
            return Err(CountError::TooManyReplicates(n));
        }
        Ok(count)
    }
}

fn steps<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
    Count::steps(i64::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn replicates<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
    Count::replicates(i64::deserialize(d)?).map_err(serde::de::Error::custom)
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Count::new(i64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// One population size or several: `agents = 20` or `agents = [20, 50, 100]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sizes(pub Vec<usize>);

impl Sizes {
    pub fn new(sizes: Vec<i64>) -> Result<Self, CountError> {
        if sizes.is_empty() {
            return Err(CountError::NoSizes);
        }
        if sizes.len() > MAX_POPULATION_SIZES {
            return Err(CountError::TooManySizes(sizes.len()));
        }
        if let Some(&bad) = sizes.iter().find(|&&n| n < 2) {
            return Err(CountError::TooFewAgents(bad));
        }
        if let Some((_, &twice)) = sizes
            .iter()
            .enumerate()
            .find(|(i, n)| sizes[..*i].contains(n))
        {
            return Err(CountError::SizeTwice(twice));
        }
        Ok(Sizes(sizes.into_iter().map(|n| n as usize).collect()))
    }
}

impl<'de> Deserialize<'de> for Sizes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(i64),
            Many(Vec<i64>),
        }
        let sizes = match Raw::deserialize(d)
            .map_err(|_| serde::de::Error::custom("expected a population size or a list of them"))?
        {
            Raw::One(n) => vec![n],
            Raw::Many(v) => v,
        };
        Sizes::new(sizes).map_err(serde::de::Error::custom)
    }
}

/// What is wrong with a scenario table, and at which (dotted) field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioProblem {
    /// The field at fault, dotted below the `[scenario]` table (`market.cap`); empty for the
    /// whole table.
    pub field: String,
    /// What is wrong, and the fix.
    pub message: String,
}

impl ScenarioProblem {
    /// A problem with `field`: the config's error names its file, line and field.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Deserialises `T` from `table`, naming the field that does not fit.
    pub fn parse<T: serde::de::DeserializeOwned>(
        table: &toml::Table,
    ) -> Result<T, ScenarioProblem> {
        let value = toml::Value::Table(table.clone());
        serde_path_to_error::deserialize(value).map_err(|e| {
            let field = e.path().to_string();
            ScenarioProblem {
                field: if field == "." { String::new() } else { field },
                // The message alone: the field is named by the caller, at its line.
                message: e.into_inner().message().trim().to_string(),
            }
        })
    }
}

/// The span of the line that sets the last segment of dotted `field`, searching from the
/// start of `within` to the end of that table: the next header that does not begin with
/// `[<prefix>` (its own sub-tables), or the next `[[` entry.
pub(crate) fn find_field(
    text: &str,
    within: Range<usize>,
    field: &str,
    prefix: &str,
) -> Option<Range<usize>> {
    let key = field
        .rsplit('.')
        .find(|s| !s.is_empty() && s.parse::<usize>().is_err())?;
    let region = text.get(within.start.min(text.len())..)?;
    let mut offset = within.start;
    for (n, line) in region.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_start();
        if n > 0
            && trimmed.starts_with('[')
            && (trimmed.starts_with("[[") || !trimmed.starts_with(&format!("[{prefix}")))
        {
            break;
        }
        let bare = trimmed.trim_start_matches('"');
        let sets_key = bare.starts_with(key)
            && bare[key.len()..]
                .trim_start_matches('"')
                .trim_start()
                .starts_with('=');
        if sets_key {
            let start = offset + (line.len() - trimmed.len());
            return Some(start..start + key.len());
        }
        for pattern in [format!("{key} ="), format!("{key}=")] {
            if let Some(i) = line.find(&pattern) {
                return Some(offset + i..offset + i + key.len());
            }
        }
        offset += line.len();
    }
    None
}
