//! The simulations throng ships, each a [`crate::sim::scenario::Scenario`], and the one
//! place that maps a scenario's name to its code.

pub mod energy_market;

use crate::engine::Engine;
use crate::record::Manifest;
use crate::sim::config::{ConfigError, Experiment, PolicyKind, ScenarioProblem};
use crate::sim::policy::{Llm, Policy, Scripted};
use crate::sim::prompt::PromptBook;
use crate::sim::runner::{self, Ended, Progress, RunError, RunOptions};
use crate::sim::scenario::Scenario;
use energy_market::EnergyMarket;
use energy_market::config::MarketConfig;
use std::path::{Path, PathBuf};

pub const NAMES: [&str; 1] = ["energy_market"];

/// Checks a `[scenario]` table for scenario `name`.
pub fn check(name: &str, table: &toml::Table) -> Result<(), ScenarioProblem> {
    match name {
        "energy_market" => EnergyMarket::check(table),
        other => Err(ScenarioProblem::new(
            "name",
            format!("unknown scenario `{other}` (known: {})", NAMES.join(", ")),
        )),
    }
}

/// Roles of scenario `name`: the prompt templates it needs besides `system.jinja`.
pub fn roles(name: &str) -> &'static [&'static str] {
    match name {
        "energy_market" => &["producer", "utility"],
        _ => &[],
    }
}

/// Settings the command line may override.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub policy: Option<PolicyKind>,
    pub replicates: Option<usize>,
    pub steps: Option<usize>,
    pub agents: Option<Vec<usize>>,
    pub model: Option<String>,
}

/// Loads and checks an experiment: its config, its scenario's knobs, and its templates.
pub fn load(path: &Path, overrides: &Overrides) -> Result<Experiment, ConfigError> {
    let mut exp = Experiment::load(path, check)?;
    let c = &mut exp.config;
    if let Some(p) = overrides.policy {
        c.policy = p;
    }
    if let Some(r) = overrides.replicates {
        c.replicates.0 = r.max(1);
    }
    if let Some(s) = overrides.steps {
        c.steps.0 = s.max(1);
    }
    if let Some(a) = &overrides.agents {
        c.agents.0 = a.clone();
    }
    if let Some(m) = &overrides.model {
        c.llm.model = m.clone();
    }
    prompts(&exp)?;
    Ok(exp)
}

/// The experiment's prompt templates, checked to exist and compile.
pub fn prompts(exp: &Experiment) -> Result<PromptBook, ConfigError> {
    let dir = templates_dir(exp);
    PromptBook::load(&dir, &exp.scenario, roles(&exp.scenario))
        .map_err(|e| exp.templates_error(e.to_string()))
}

/// `templates` from the config, else `templates/<scenario>` beside or above the config's
/// folder, else in the current directory.
pub fn templates_dir(exp: &Experiment) -> PathBuf {
    let name = &exp.scenario;
    let beside = exp.source.dir().join("..").join("templates").join(name);
    let default = if beside.is_dir() {
        beside
    } else {
        PathBuf::from("templates").join(name)
    };
    exp.templates_dir(&default)
}

/// How agents decide, ready to run.
pub enum PolicyChoice {
    Scripted,
    Llm(Box<Engine>),
}

/// Runs `exp` into `dir` (or resumes it there). Returns how it ended and the engine, if one
/// ran, so that the caller can report its totals.
pub fn run(
    exp: &Experiment,
    policy: PolicyChoice,
    dir: &Path,
    manifest: &mut Manifest,
    options: RunOptions,
    on_step: impl FnMut(Progress),
) -> Result<(Ended, Option<Engine>), RunError> {
    match exp.scenario.as_str() {
        "energy_market" => {
            let scenarios: Vec<EnergyMarket> = exp
                .arms
                .iter()
                .map(|(_, table)| {
                    EnergyMarket::new(
                        MarketConfig::from_table(table).expect("invariant: checked at load"),
                    )
                })
                .collect();
            run_with(exp, &scenarios, policy, dir, manifest, options, on_step)
        }
        other => unreachable!("scenario `{other}` passed `check`"),
    }
}

fn run_with<S: Scenario>(
    exp: &Experiment,
    scenarios: &[S],
    policy: PolicyChoice,
    dir: &Path,
    manifest: &mut Manifest,
    options: RunOptions,
    on_step: impl FnMut(Progress),
) -> Result<(Ended, Option<Engine>), RunError> {
    let mut llm = match policy {
        PolicyChoice::Scripted => None,
        PolicyChoice::Llm(engine) => {
            let prompts = prompts(exp).map_err(|e| RunError::Resume(e.to_string()))?;
            Some(Llm::new(
                *engine,
                prompts,
                exp.config.llm.clone(),
                exp.config.history,
            ))
        }
    };
    let policy: &mut dyn Policy<S> = match llm.as_mut() {
        Some(llm) => llm,
        None => &mut Scripted,
    };
    let ended = runner::run(exp, scenarios, policy, dir, manifest, options, on_step)?;
    Ok((ended, llm.map(Llm::into_engine)))
}

/// Writes the report of the run in `dir`; returns its key numbers as text.
pub fn report(dir: &Path) -> Result<String, String> {
    let manifest: Manifest =
        crate::record::read_json(&dir.join(crate::record::MANIFEST)).map_err(|e| e.to_string())?;
    match manifest.scenario.as_str() {
        "energy_market" => crate::analysis::energy_report::report(dir)
            .map(|r| crate::analysis::energy_report::text(&r)),
        other => Err(format!("no report for scenario `{other}`")),
    }
}
