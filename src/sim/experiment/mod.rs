//! An experiment made ready to run: its config read once, command-line overrides checked by
//! the same rules as the file, arms resolved (the base, `[[arms]]`, and every combination of
//! a `[sweep]`), the population and the policy groups validated. Every problem points at its
//! file, line and field, or at the flag that caused it.

mod arms;
mod policies;
mod sampling;

pub use arms::{Arm, Change};
pub use policies::{Condition, MAX_POLICY_GROUPS, PolicyGroup, PolicyPlan};

use super::config::{
    ConfigError, Count, CountError, ExperimentConfig, LlmConfig, PolicyKind, RecordsConfig,
    ScenarioProblem, Sizes, Source, find_field,
};
use super::population::PopulationSpec;
use std::path::{Path, PathBuf};

/// Settings the command line may override; each is checked as the config's own would be.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub policy: Option<PolicyKind>,
    pub replicates: Option<i64>,
    pub steps: Option<i64>,
    pub agents: Option<Vec<i64>>,
    pub model: Option<String>,
    /// Not a flag: the model of a config whose `[llm]` names none, which the program running
    /// it chooses (the CLI passes its default model's name).
    pub default_model: Option<String>,
}

impl Overrides {
    /// Whether no flag overrides the config (a default model is no override).
    pub fn is_empty(&self) -> bool {
        self.policy.is_none()
            && self.replicates.is_none()
            && self.steps.is_none()
            && self.agents.is_none()
            && self.model.is_none()
    }

    fn apply(&self, c: &mut ExperimentConfig) -> Result<(), ConfigError> {
        let flag = |flag: &str, problem: CountError| ConfigError::Flag {
            flag: flag.into(),
            message: problem.to_string(),
        };
        if let Some(p) = self.policy {
            c.policy = p;
        }
        if let Some(r) = self.replicates {
            c.replicates = Count::replicates(r).map_err(|m| flag("--replicates", m))?;
        }
        if let Some(s) = self.steps {
            c.steps = Count::steps(s).map_err(|m| flag("--steps", m))?;
        }
        if let Some(a) = &self.agents {
            c.agents = Sizes::new(a.clone()).map_err(|m| flag("--agents", m))?;
        }
        if let Some(m) = &self.model {
            c.llm.model = Some(m.clone());
        }
        if c.llm.model.is_none() {
            c.llm.model.clone_from(&self.default_model);
        }
        Ok(())
    }
}

/// An experiment with its arms resolved: what the runner runs.
#[derive(Debug, Clone)]
pub struct Experiment {
    pub source: Source,
    pub config: ExperimentConfig,
    /// The scenario's name (`energy_market`).
    pub scenario: String,
    /// The `[scenario]` table without its name: what every arm starts from.
    pub base: toml::Table,
    /// One arm, `base`, when the file defines none.
    pub arms: Vec<Arm>,
    pub population: PopulationSpec,
    pub records: RecordsConfig,
    /// The model and sampling of every (arm, route): route 0 is the arm's own `llm`, route
    /// `g + 1` its policy group `g`'s overrides over it, [`Experiment::routes_per_arm`] to an
    /// arm (an arm with fewer groups repeats its own). See [`Experiment::llm_of`].
    pub routes: Vec<LlmConfig>,
}

impl Experiment {
    /// Reads and checks `path`, with `overrides` applied. The scenario's own tables are
    /// checked by the registry, which knows the scenario's type.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        let source = Source::read(path)?;
        let mut config: ExperimentConfig = source.parse()?;
        // Population sizes are checked as they are read (`Sizes::new`): a count, each size,
        // and no size twice.
        overrides.apply(&mut config)?;
        let (scenario, base) = scenario(&source, &config)?;
        let population = population(&source, &config)?;
        let groups = config
            .policy_groups
            .iter()
            .enumerate()
            .map(|(i, g)| policies::policy_group(&source, i, g, &population))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = PolicyPlan {
            default: config.policy,
            groups,
        };
        let arms = arms::resolve(&source, &config, &base, &plan, &population)?;
        for arm in &arms {
            sampling::check_sampling(&source, &config, arm)?;
        }
        let routes = routes(&source, &arms)?;
        if population.personas.is_some() && !arms.iter().any(|a| a.policies.uses(PolicyKind::Llm)) {
            let span = config.population.as_ref().map(|p| p.span());
            return Err(source.error(
                span,
                "field `population.personas`: LLM-written personas need the model: set policy = \"llm\" (or an llm policy group), or remove [population.personas]",
            ));
        }
        let records = config.records.clone();
        Ok(Self {
            source,
            config,
            scenario,
            base,
            arms,
            population,
            records,
            routes,
        })
    }

    /// Routes per arm: the arm's own, then one per policy group of the arm with the most.
    pub(crate) fn routes_per_arm(&self) -> usize {
        routes_per_arm(&self.arms)
    }

    /// The model and sampling of an agent of arm `arm` on route `route` (0: the arm's own;
    /// `g + 1`: the arm's policy group `g`'s).
    pub(crate) fn llm_of(&self, arm: usize, route: u8) -> &LlmConfig {
        &self.routes[arm * self.routes_per_arm() + route as usize]
    }

    /// The policy of route `route` of arm `arm` (0: the arm's `policy`; `g + 1`: its group
    /// `g`'s; past its groups, a route no agent takes, the arm's own).
    pub(crate) fn policy_of_route(&self, arm: usize, route: u8) -> PolicyKind {
        let plan = &self.arms[arm].policies;
        match route {
            0 => plan.default,
            g => plan
                .groups
                .get(g as usize - 1)
                .map_or(plan.default, |g| g.policy),
        }
    }

    /// Every policy some agent of some arm uses, arm by arm, each arm's default first.
    pub fn kinds(&self) -> Vec<PolicyKind> {
        let mut kinds = Vec::new();
        for arm in &self.arms {
            for kind in arm.policies.kinds() {
                if !kinds.contains(&kind) {
                    kinds.push(kind);
                }
            }
        }
        kinds
    }

    /// Whether some agent of some arm uses `kind`.
    pub fn uses(&self, kind: PolicyKind) -> bool {
        self.arms.iter().any(|a| a.policies.uses(kind))
    }

    /// Whether agents of the run use more than one policy (in one arm, or across arms).
    pub(crate) fn is_mixed(&self) -> bool {
        self.kinds().len() > 1
    }

    /// `llm`, `scripted`, or `mixed`.
    pub fn policy_label(&self) -> String {
        match self.kinds().as_slice() {
            [one] => one.name().into(),
            _ => "mixed".into(),
        }
    }

    /// Every model some agent asks, in a fixed order (arm by arm, the arm's own route
    /// first), each once. A model left unset (no `[llm] model` and no default given) is
    /// `None`.
    pub fn models(&self) -> Vec<Option<String>> {
        let mut models: Vec<Option<String>> = Vec::new();
        for arm in 0..self.arms.len() {
            for route in 0..self.routes_per_arm() {
                let route = route as u8;
                if self.policy_of_route(arm, route) != PolicyKind::Llm {
                    continue;
                }
                let model = &self.llm_of(arm, route).model;
                if !models.contains(model) {
                    models.push(model.clone());
                }
            }
        }
        models
    }

    /// Whether agents of this run ask more than one model.
    pub(crate) fn is_multi_model(&self) -> bool {
        self.models().len() > 1
    }

    /// A problem with model `name` (one that cannot be found or loaded), at the line of the
    /// config that names it, or at `--model` when the command line named it.
    pub(crate) fn model_error(&self, name: &str, message: impl std::fmt::Display) -> ConfigError {
        let text = &self.source.text;
        let quoted = [format!("\"{name}\""), format!("'{name}'")];
        let at = quoted.iter().filter_map(|q| text.find(q.as_str())).min();
        match at {
            Some(at) => self.source.error(
                Some(at..at + name.len() + 2),
                format!(
                    "field `model`: {message}; name a preset (`throng models` lists them), a model \
                     folder, a GGUF file or a Hugging Face repo id"
                ),
            ),
            None => ConfigError::Flag {
                flag: "--model".into(),
                message: message.to_string(),
            },
        }
    }

    /// A scenario problem at its line: of the population, of the base `[scenario]` table
    /// (`arm` = None), or of arm `arm` (found where that arm or the sweep sets the field).
    pub(crate) fn locate(&self, arm: Option<usize>, problem: ScenarioProblem) -> ConfigError {
        let text = &self.source.text;
        let field = if problem.field.is_empty() {
            String::new()
        } else {
            format!("field `{}`: ", problem.field)
        };
        if problem.field == "agents" {
            // The top-level `agents`, before the first table; or `--agents`, which replaced it.
            let top = text
                .match_indices("\n[")
                .next()
                .map_or(text.len(), |(at, _)| at);
            return match find_field(text, 0..top, "agents", "") {
                Some(at) if at.end <= top => self
                    .source
                    .error(Some(at), format!("{field}{}", problem.message)),
                _ => ConfigError::Flag {
                    flag: "--agents".into(),
                    message: problem.message,
                },
            };
        }
        if let Some(inner) = problem.field.strip_prefix("population.") {
            let span = self.config.population.as_ref().map_or(0..0, |p| p.span());
            let at = find_field(text, span.clone(), inner, "population").unwrap_or(span);
            return self
                .source
                .error(Some(at), format!("{field}{}", problem.message));
        }
        let key = problem.field.split('.').next().unwrap_or("");
        let base = self.config.scenario.span();
        let (span, prefix) = match arm {
            None => (
                find_field(text, base.clone(), &problem.field, "scenario").unwrap_or(base),
                String::new(),
            ),
            Some(i) => {
                let a = &self.arms[i];
                let swept = self
                    .config
                    .sweep
                    .as_ref()
                    .filter(|s| s.get_ref().scenario.contains_key(key));
                let span = match swept {
                    Some(s) => find_field(text, s.span(), key, "sweep").unwrap_or(s.span()),
                    None => find_field(text, a.span.clone(), &problem.field, "arms.")
                        .unwrap_or(a.span.clone()),
                };
                (span, format!("arm `{}`: ", a.name))
            }
        };
        self.source
            .error(Some(span), format!("{prefix}{field}{}", problem.message))
    }

    /// The templates folder: the config's `templates`, relative to the config's folder, or
    /// `default`.
    pub(crate) fn templates_dir(&self, default: &Path) -> PathBuf {
        match &self.config.templates {
            Some(t) => self.source.dir().join(t.get_ref()),
            None => default.to_path_buf(),
        }
    }

    /// An error pointing at the `templates` field (or the top of the file).
    pub(crate) fn templates_error(&self, message: impl Into<String>) -> ConfigError {
        self.source
            .error(self.config.templates.as_ref().map(|t| t.span()), message)
    }

    /// The largest number of state rows one step writes (every agent of every cell).
    pub(crate) fn largest_step_rows(&self) -> usize {
        let cells = self.arms.len() * self.config.replicates.0;
        self.config.agents.0.iter().max().copied().unwrap_or(0) * cells
    }
}

/// The scenario's name, and the `[scenario]` table without it: what every arm starts from.
fn scenario(
    source: &Source,
    config: &ExperimentConfig,
) -> Result<(String, toml::Table), ConfigError> {
    let section = config.scenario.span();
    let mut base = config.scenario.get_ref().clone();
    let name = match base.remove("name") {
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
    Ok((name, base))
}

/// The `[population]` section, validated (the default population without one), with its
/// groups checked against every population size.
fn population(source: &Source, config: &ExperimentConfig) -> Result<PopulationSpec, ConfigError> {
    let population = match &config.population {
        None => PopulationSpec::default(),
        Some(p) => p.get_ref().validate(Some(p.span())).map_err(|problem| {
            let within = problem.span.clone().unwrap_or(p.span());
            let at = find_field(&source.text, within.clone(), &problem.field, "population")
                .unwrap_or(within);
            source.error(
                Some(at),
                format!("field `{}`: {}", problem.field, problem.message),
            )
        })?,
    };
    for &size in &config.agents.0 {
        if let Err(message) = super::groups::check_divides(&population.groups, size) {
            let span = config.population.as_ref().map(|p| p.span());
            let at = span
                .clone()
                .and_then(|within| find_field(&source.text, within, "groups", "population"));
            return Err(source.error(at.or(span), format!("field `population.groups`: {message}")));
        }
    }
    Ok(population)
}

/// Routes per arm: the arm's own, then one per policy group of the arm with the most.
fn routes_per_arm(arms: &[Arm]) -> usize {
    arms.iter()
        .map(|a| a.policies.groups.len())
        .max()
        .unwrap_or(0)
        + 1
}

/// The model and sampling of every (arm, route) in order (see [`Experiment::routes`]), a
/// policy group's checked in each arm it overrides.
fn routes(source: &Source, arms: &[Arm]) -> Result<Vec<LlmConfig>, ConfigError> {
    let per_arm = routes_per_arm(arms);
    let mut routes = Vec::with_capacity(arms.len() * per_arm);
    for arm in arms {
        routes.push(arm.llm.clone());
        for (g, group) in arm.policies.groups.iter().enumerate() {
            let llm = group.llm.apply(&arm.llm);
            if !group.llm.is_empty()
                && let Some((key, p)) = sampling::sampling_problem(&llm)
            {
                let span = group.span.clone();
                let at =
                    find_field(&source.text, span.clone(), key, "policy_groups").unwrap_or(span);
                return Err(source.error(
                    Some(at),
                    format!("policy_groups[{g}]: llm: {p} (in arm `{}`)", arm.name),
                ));
            }
            routes.push(llm);
        }
        // Routes past the arm's own groups are never taken; they keep the stride.
        for _ in arm.policies.groups.len() + 1..per_arm {
            routes.push(arm.llm.clone());
        }
    }
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Experiment, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exp.toml");
        std::fs::write(&path, text).unwrap();
        Experiment::load(&path, &Overrides::default())
    }

    const BASE: &str = "name = \"x\"\nsteps = 3\nagents = [20, 50]\n";
    const SCENARIO: &str = "\n[scenario]\nname = \"energy_market\"\nx = 1\n";

    #[test]
    fn reads_a_minimal_config_with_defaults() {
        let e = load(&format!("{BASE}{SCENARIO}")).unwrap();
        assert_eq!(e.config.replicates, Count(1));
        assert_eq!(e.config.agents, Sizes(vec![20, 50]));
        assert_eq!(e.arms[0].policies.default, PolicyKind::Llm);
        assert!(!e.is_mixed());
        assert_eq!(e.scenario, "energy_market");
        assert_eq!(e.arms.len(), 1);
        assert!(!e.arms[0].table.contains_key("name"));
    }

    #[test]
    fn errors_name_line_and_field() {
        let err = load(&format!("{BASE}replicates = -2\n{SCENARIO}")).unwrap_err();
        assert_eq!(err.line(), Some(4), "{err}");
        assert!(err.message().contains("at least 1"), "{err}");
        let err = load(&format!(
            "{}{SCENARIO}",
            BASE.replace("steps = 3", "steps = \"many\"")
        ))
        .unwrap_err();
        assert_eq!(err.line(), Some(2), "{err}");
        let err = load(&format!("{BASE}polcy = \"llm\"\n{SCENARIO}")).unwrap_err();
        assert!(err.message().contains("polcy"), "{err}");
    }

    // Command-line overrides once skipped the config's rules (`--agents 1` ran a one-company
    // market; `--steps 0` became 1).
    #[test]
    fn overrides_are_checked_like_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exp.toml");
        std::fs::write(&path, format!("{BASE}{SCENARIO}")).unwrap();
        for (overrides, flag) in [
            (
                Overrides {
                    agents: Some(vec![1]),
                    ..Overrides::default()
                },
                "--agents",
            ),
            (
                Overrides {
                    steps: Some(0),
                    ..Overrides::default()
                },
                "--steps",
            ),
            (
                Overrides {
                    replicates: Some(0),
                    ..Overrides::default()
                },
                "--replicates",
            ),
        ] {
            let err = Experiment::load(&path, &overrides).unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
        }
        let ok = Experiment::load(
            &path,
            &Overrides {
                agents: Some(vec![5, 7]),
                steps: Some(2),
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(
            (ok.config.agents.0.clone(), ok.config.steps.0),
            (vec![5, 7], 2)
        );
    }

    #[test]
    fn arms_override_the_scenario_and_the_sampling() {
        let ok = load(&format!(
            "{BASE}{SCENARIO}\n[[arms]]\nname = \"control\"\nscenario = {{ x = 2 }}\nllm = {{ temperature = 0.1 }}\n"
        ))
        .unwrap();
        assert_eq!(ok.arms[0].table["x"].as_integer(), Some(2));
        assert_eq!(ok.arms[0].llm.temperature, 0.1);
        let err = load(&format!(
            "{BASE}{SCENARIO}\n[[arms]]\nname = \"a\"\n\n[[arms]]\nname = \"a\"\n"
        ))
        .unwrap_err();
        assert!(err.message().contains("two arms"), "{err}");
    }

    #[test]
    fn a_sweep_crosses_every_value() {
        let e = load(&format!(
            "{BASE}{SCENARIO}\n[sweep]\nscenario = {{ ratio = [\"1/2\", \"2/3\"], prompt = [\"basic\", \"cot\"] }}\nllm = {{ temperature = [0.0, 1.0] }}\n"
        ))
        .unwrap();
        assert_eq!(e.arms.len(), 8);
        assert_eq!(e.arms[0].name, "ratio=1/2, prompt=basic, temperature=0.0");
        assert_eq!(e.arms[7].llm.temperature, 1.0);
        assert_eq!(e.arms[7].table["prompt"].as_str(), Some("cot"));
        let err = load(&format!(
            "{BASE}{SCENARIO}\n[sweep]\nllm = {{ colour = [1] }}\n"
        ))
        .unwrap_err();
        assert!(err.message().contains("colour"), "{err}");
    }

    // Guards the routing of models: a sweep over models makes one arm per model, a policy
    // group's model and sampling apply over its arm's, and `models()` lists each model once.
    #[test]
    fn groups_and_sweeps_name_their_models() {
        let e = load(&format!(
            "{BASE}{SCENARIO}\n[llm]\nmodel = \"a\"\n\n[sweep]\nllm = {{ model = [\"a\", \"b\"] }}\n"
        ))
        .unwrap();
        assert_eq!(e.arms[1].name, "model=b");
        assert_eq!(e.models(), [Some("a".to_string()), Some("b".to_string())]);
        let e = load(&format!(
            "{BASE}{SCENARIO}\n[llm]\nmodel = \"a\"\n\n[[policy_groups]]\npolicy = \"llm\"\nshare = 0.5\nllm = {{ model = \"c\", temperature = 0.3 }}\n"
        ))
        .unwrap();
        assert_eq!(e.llm_of(0, 0).model.as_deref(), Some("a"));
        assert_eq!(e.llm_of(0, 1).model.as_deref(), Some("c"));
        assert_eq!(e.llm_of(0, 1).temperature, 0.3);
        assert!(e.is_multi_model());
        let err = e.model_error("c", "unknown model `c`");
        assert_eq!(err.line(), Some(15), "{err}");
        // A scripted group asks no model, so it may not name one.
        let err = load(&format!(
            "{BASE}{SCENARIO}\n[[policy_groups]]\npolicy = \"scripted\"\nllm = {{ model = \"c\" }}\n"
        ))
        .unwrap_err();
        assert!(err.message().contains("asks no model"), "{err}");
        // A group's sampling is checked as an arm's, at the group's line.
        let err = load(&format!(
            "{BASE}{SCENARIO}\n[[policy_groups]]\npolicy = \"llm\"\nllm = {{ temperature = 99.0 }}\n"
        ))
        .unwrap_err();
        assert!(err.message().contains("temperature 99"), "{err}");
    }

    #[test]
    fn policy_groups_name_their_attributes() {
        let pop =
            "\n[population.attributes.education]\nshares = { school = 60, university = 40 }\n";
        let e = load(&format!(
            "{BASE}policy = \"scripted\"\n{SCENARIO}{pop}\n[[policy_groups]]\npolicy = \"llm\"\nshare = 0.01\nwhere = {{ education = \"university\" }}\n"
        ))
        .unwrap();
        assert!(e.is_mixed());
        assert_eq!(
            e.arms[0].policies.groups[0].filter,
            vec![(0, Condition::OneOf(vec![1]))]
        );
        let err = load(&format!(
            "{BASE}{SCENARIO}{pop}\n[[policy_groups]]\npolicy = \"llm\"\nwhere = {{ educaton = \"university\" }}\n"
        ))
        .unwrap_err();
        assert!(
            err.message().contains("`educaton`") && err.line() == Some(12),
            "{err}"
        );
    }

    #[test]
    fn an_arm_sets_its_own_policy_and_policy_groups_over_the_experiments() {
        let pop =
            "\n[population.attributes.education]\nshares = { school = 60, university = 40 }\n";
        let arms = "\n[[arms]]\nname = \"llm\"\n\n[[arms]]\nname = \"rule\"\npolicy = \"scripted\"\n\n[[arms]]\nname = \"some\"\npolicy = \"scripted\"\n[[arms.policy_groups]]\npolicy = \"llm\"\nshare = 0.5\nwhere = { education = \"university\" }\n";
        let e = load(&format!("{BASE}{SCENARIO}{pop}{arms}")).unwrap();
        let plans: Vec<_> = e.arms.iter().map(|a| &a.policies).collect();
        assert_eq!(plans[0].default, PolicyKind::Llm);
        assert!(plans[0].groups.is_empty());
        assert_eq!(plans[1].default, PolicyKind::Scripted);
        assert_eq!(plans[2].default, PolicyKind::Scripted);
        assert_eq!(plans[2].groups.len(), 1);
        assert!(e.is_mixed(), "arms of different policies mix them");
        assert_eq!(e.policy_label(), "mixed");
        assert_eq!(e.kinds(), vec![PolicyKind::Llm, PolicyKind::Scripted]);
        // Only the third arm has a group; the others' second route is never taken.
        assert_eq!(e.routes_per_arm(), 2);
        assert_eq!(e.policy_of_route(2, 1), PolicyKind::Llm);
        assert_eq!(e.policy_of_route(1, 1), PolicyKind::Scripted);
        // An arm's group is checked as the experiment's are, at its own line.
        let bad = arms.replace("education = \"university\"", "educaton = \"university\"");
        let err = load(&format!("{BASE}{SCENARIO}{pop}{bad}")).unwrap_err();
        assert!(
            err.message().contains("`educaton`") && err.line() == Some(22),
            "{err}"
        );
        // A scripted arm under an experiment whose groups name models keeps those groups.
        let groups = "\n[[policy_groups]]\npolicy = \"llm\"\nshare = 0.5\n";
        let e = load(&format!(
            "{BASE}policy = \"scripted\"\n{SCENARIO}{groups}\n[[arms]]\nname = \"a\"\n\n[[arms]]\nname = \"b\"\npolicy_groups = []\n"
        ))
        .unwrap();
        assert_eq!(e.arms[0].policies.groups.len(), 1);
        assert!(
            e.arms[1].policies.groups.is_empty(),
            "an empty list clears them"
        );
    }
}
