//! Experiment configs: one TOML file says what to simulate, how often, with which policy, and
//! the scenario's own knobs in a section named after it. Every mistake is reported with the
//! file, the line and the field.

use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A config problem at a place in a file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", file.display())]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// A TOML source and the means to point into it.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    pub text: String,
}

impl Source {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            message: format!("cannot read the config: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
        })
    }

    /// An error at byte range `span` (0 when unknown).
    pub fn error(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let at = span.map_or(0, |s| s.start.min(self.text.len()));
        let before = &self.text[..at];
        let line = before.matches('\n').count() + 1;
        let column = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        ConfigError {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Ask the language model (all agents of a step in one batch).
    Llm,
    /// The scenario's deterministic rules: a classic agent-based baseline.
    Scripted,
}

/// Sampling and model settings of the `llm` policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// A preset, folder, GGUF file or Hub repo id (the CLI's --model overrides it).
    pub model: String,
    /// Most tokens one decision may take; a decision cut short falls back to "no change".
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
}

impl Default for LlmConfig {
    fn default() -> Self {
        // Ollama's defaults, which the reference experiments ran with.
        Self {
            model: crate::model::DEFAULT_MODEL.into(),
            max_tokens: 96,
            temperature: 0.8,
            top_p: 0.9,
            top_k: Some(40),
        }
    }
}

/// A named variant of the scenario: its `scenario` table overrides the base one (e.g.
/// personas off for a control arm).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmConfig {
    pub name: String,
    #[serde(default)]
    pub scenario: toml::Table,
}

/// An experiment, as written in its TOML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub seed: u64,
    /// Independent repetitions of every arm and population size.
    #[serde(default = "one")]
    pub replicates: Count,
    pub steps: Count,
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
}

fn one() -> Count {
    Count(1)
}

fn default_policy() -> PolicyKind {
    PolicyKind::Llm
}

/// A count that must be at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Count(pub usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        if n < 1 {
            return Err(serde::de::Error::custom(format!(
                "must be at least 1, got {n}"
            )));
        }
        Ok(Count(n as usize))
    }
}

/// One population size or several: `agents = 20` or `agents = [20, 50, 100]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sizes(pub Vec<usize>);

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
        if sizes.is_empty() {
            return Err(serde::de::Error::custom(
                "give at least one population size",
            ));
        }
        if let Some(bad) = sizes.iter().find(|&&n| n < 2) {
            return Err(serde::de::Error::custom(format!(
                "a population needs at least 2 agents, got {bad}"
            )));
        }
        Ok(Sizes(sizes.into_iter().map(|n| n as usize).collect()))
    }
}

/// What is wrong with a scenario table, and at which (dotted) field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioProblem {
    pub field: String,
    pub message: String,
}

impl ScenarioProblem {
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
                message: e.into_inner().to_string(),
            }
        })
    }
}

/// An experiment with its arms resolved: what the runner runs.
#[derive(Debug, Clone)]
pub struct Experiment {
    pub source: Source,
    pub config: ExperimentConfig,
    /// The scenario's name (`energy_market`).
    pub scenario: String,
    /// `(arm name, scenario table)` per arm; one arm, `base`, when the file defines none.
    pub arms: Vec<(String, toml::Table)>,
}

impl Experiment {
    /// Reads and checks `path`. `check` validates a scenario table (the base one and each
    /// arm's merged one) for the scenario it names, so that its mistakes are reported at
    /// their line too.
    pub fn load(
        path: &Path,
        check: impl Fn(&str, &toml::Table) -> Result<(), ScenarioProblem>,
    ) -> Result<Self, ConfigError> {
        let source = Source::read(path)?;
        let config: ExperimentConfig = source.parse()?;
        let section = config.scenario.span();
        let mut base = config.scenario.get_ref().clone();
        let scenario = match base.remove("name") {
            Some(toml::Value::String(name)) => name,
            Some(_) => {
                return Err(source.error(Some(section), "field `scenario.name` must be a string"));
            }
            None => {
                return Err(source.error(
                    Some(section),
                    "[scenario] needs a `name` (e.g. name = \"energy_market\")",
                ));
            }
        };
        let located = |problem: ScenarioProblem, within: Range<usize>, prefix: &str| {
            let table = if prefix.is_empty() {
                "scenario"
            } else {
                "arms."
            };
            let span =
                find_field(&source.text, within.clone(), &problem.field, table).unwrap_or(within);
            let field = if problem.field.is_empty() {
                String::new()
            } else {
                format!("field `{}`: ", problem.field)
            };
            source.error(Some(span), format!("{prefix}{field}{}", problem.message))
        };
        check(&scenario, &base).map_err(|p| located(p, section.clone(), ""))?;
        let mut arms = Vec::new();
        for arm in &config.arms {
            let mut merged = base.clone();
            for (key, value) in &arm.get_ref().scenario {
                merged.insert(key.clone(), value.clone());
            }
            let prefix = format!("arm `{}`: ", arm.get_ref().name);
            check(&scenario, &merged).map_err(|p| located(p, arm.span(), &prefix))?;
            arms.push((arm.get_ref().name.clone(), merged));
        }
        if arms.is_empty() {
            arms.push(("base".to_string(), base));
        }
        let mut names: Vec<&String> = arms.iter().map(|(n, _)| n).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(source.error(None, format!("two arms are named `{}`", w[0])));
        }
        Ok(Self {
            source,
            config,
            scenario,
            arms,
        })
    }

    /// The templates folder: the config's `templates`, relative to the config's folder, or
    /// `default`.
    pub fn templates_dir(&self, default: &Path) -> PathBuf {
        match &self.config.templates {
            Some(t) => self.source.dir().join(t.get_ref()),
            None => default.to_path_buf(),
        }
    }

    /// An error pointing at the `templates` field (or the top of the file).
    pub fn templates_error(&self, message: impl Into<String>) -> ConfigError {
        self.source
            .error(self.config.templates.as_ref().map(|t| t.span()), message)
    }
}

/// The span of the line that sets the last segment of dotted `field`, searching from the
/// start of `within` to the end of that table: the next header that does not begin with
/// `[<prefix>` (its own sub-tables), or the next `[[` entry.
fn find_field(text: &str, within: Range<usize>, field: &str, prefix: &str) -> Option<Range<usize>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Experiment, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exp.toml");
        std::fs::write(&path, text).unwrap();
        Experiment::load(&path, |_, t| match t.get("bad") {
            Some(_) => Err(ScenarioProblem::new("bad", "is not allowed")),
            None => Ok(()),
        })
    }

    const BASE: &str = "name = \"x\"\nsteps = 3\nagents = [20, 50]\n";
    const SCENARIO: &str = "\n[scenario]\nname = \"energy_market\"\nx = 1\n";

    #[test]
    fn reads_a_minimal_config_with_defaults() {
        let e = load(&format!("{BASE}{SCENARIO}")).unwrap();
        assert_eq!(e.config.replicates, Count(1));
        assert_eq!(e.config.agents, Sizes(vec![20, 50]));
        assert_eq!(e.config.policy, PolicyKind::Llm);
        assert_eq!(e.scenario, "energy_market");
        assert_eq!(e.arms.len(), 1);
        assert!(!e.arms[0].1.contains_key("name"));
    }

    #[test]
    fn errors_name_line_and_field() {
        let err = load(&format!("{BASE}replicates = -2\n{SCENARIO}")).unwrap_err();
        assert_eq!(err.line, 4, "{err}");
        assert!(err.message.contains("at least 1"), "{err}");
        let err = load(&format!(
            "{}{SCENARIO}",
            BASE.replace("steps = 3", "steps = \"many\"")
        ))
        .unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        let err = load(&format!("{BASE}polcy = \"llm\"\n{SCENARIO}")).unwrap_err();
        assert!(err.message.contains("polcy"), "{err}");
        let err = load(&format!("{BASE}{SCENARIO}bad = 2\n")).unwrap_err();
        assert_eq!(
            (err.line, err.message.as_str()),
            (8, "field `bad`: is not allowed"),
            "{err}"
        );
    }

    #[test]
    fn arms_override_the_scenario_table_and_are_checked() {
        let text = format!(
            "{BASE}{SCENARIO}\n[[arms]]\nname = \"control\"\nscenario = {{ x = 2 }}\n\n[[arms]]\nname = \"b\"\n[arms.scenario]\nbad = 1\n"
        );
        let err = load(&text).unwrap_err();
        assert!(err.message.starts_with("arm `b`: field `bad`"), "{err}");
        assert_eq!(err.line, 16, "{err}");
        let ok = load(&format!(
            "{BASE}{SCENARIO}\n[[arms]]\nname = \"control\"\nscenario = {{ x = 2 }}\n"
        ))
        .unwrap();
        assert_eq!(ok.arms[0].1["x"].as_integer(), Some(2));
    }
}
