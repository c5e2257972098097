//! An experiment made ready to run: its config read once, command-line overrides checked by
//! the same rules as the file, arms resolved (the base, `[[arms]]`, and every combination of
//! a `[sweep]`), the population and the policy groups validated. Every problem points at its
//! file, line and field, or at the flag that caused it.

use super::config::{
    ConfigError, Count, ExperimentConfig, LlmConfig, LlmOverrides, MAX_ARMS, MAX_TEMPERATURE,
    PolicyGroupConfig, PolicyKind, RecordsConfig, ScenarioProblem, Sizes, Source, find_field,
};
use super::population::{Attribute, PopulationSpec};
use std::ops::Range;
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
        let flag = |flag: &str, message: String| ConfigError::Flag {
            flag: flag.into(),
            message,
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

/// One arm: a name, its scenario table (the base with the arm's changes) and its sampling.
#[derive(Debug, Clone)]
pub struct Arm {
    pub name: String,
    /// Its scenario table from the start: the base's alone for an arm whose changes hold from a
    /// later step.
    pub table: toml::Table,
    /// Its changes that hold from a later step (`from_step`), if they do.
    pub change: Option<Change>,
    pub llm: LlmConfig,
    /// Where it is defined (the `[scenario]` section for the base arm).
    pub span: Range<usize>,
}

/// An arm's scenario from a step on: the steps before it are run as the base's.
#[derive(Debug, Clone)]
pub struct Change {
    /// The first step (counted from 1, as records count them) that the table rules.
    pub from_step: usize,
    pub table: toml::Table,
}

/// Agents that use another policy than the experiment's.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyGroup {
    pub policy: PolicyKind,
    /// Share of the matching agents, drawn by seed.
    pub share: f64,
    /// `(attribute index, test)` conditions, all of which must hold.
    pub filter: Vec<(usize, Condition)>,
    /// The group's own model and sampling, over its arm's (an `llm` group only).
    pub llm: LlmOverrides,
}

/// A condition on one attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// The category is one of these (indices).
    OneOf(Vec<u16>),
    /// The value is within `[low, high]`.
    Within(f64, f64),
}

/// Which policy each agent uses.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyPlan {
    pub default: PolicyKind,
    pub groups: Vec<PolicyGroup>,
}

impl PolicyPlan {
    /// Every policy some agent may use, default first.
    pub fn kinds(&self) -> Vec<PolicyKind> {
        let mut kinds = vec![self.default];
        for g in &self.groups {
            if !kinds.contains(&g.policy) {
                kinds.push(g.policy);
            }
        }
        kinds
    }

    pub fn is_mixed(&self) -> bool {
        self.kinds().len() > 1
    }

    pub fn uses(&self, kind: PolicyKind) -> bool {
        self.kinds().contains(&kind)
    }

    /// `llm`, `scripted`, or `mixed`.
    pub fn label(&self) -> String {
        if self.is_mixed() {
            "mixed".into()
        } else {
            self.default.name().into()
        }
    }
}

/// The most `[[policy_groups]]` a run may have: each agent's group is kept in a byte.
pub const MAX_POLICY_GROUPS: usize = 255;

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
    pub policies: PolicyPlan,
    pub records: RecordsConfig,
    /// The model and sampling of every (arm, route): route 0 is the arm's own `llm`, route
    /// `g + 1` policy group `g`'s overrides over it. See [`Experiment::llm_of`].
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
        let mut arms: Vec<Arm> = config
            .arms
            .iter()
            .map(|arm| {
                let mut table = base.clone();
                for (key, value) in &arm.get_ref().scenario {
                    table.insert(key.clone(), value.clone());
                }
                let change = match arm.get_ref().from_step {
                    None => None,
                    Some(from) => Some(Change {
                        from_step: from_step(&source, &config, arm, from)?,
                        table: std::mem::replace(&mut table, base.clone()),
                    }),
                };
                Ok(Arm {
                    name: arm.get_ref().name.clone(),
                    table,
                    change,
                    llm: arm.get_ref().llm.apply(&config.llm),
                    span: arm.span(),
                })
            })
            .collect::<Result<_, ConfigError>>()?;
        if arms.is_empty() {
            arms.push(Arm {
                name: "base".into(),
                table: base.clone(),
                change: None,
                llm: config.llm.clone(),
                span: section.clone(),
            });
        }
        if arms.len() > MAX_ARMS {
            return Err(source.error(
                Some(arms[MAX_ARMS].span.clone()),
                format!(
                    "{} [[arms]] are more than the {MAX_ARMS} a run may have",
                    arms.len()
                ),
            ));
        }
        if let Some(sweep) = &config.sweep {
            arms = sweep_arms(&source, arms, sweep, config.arms.is_empty())?;
        }
        for (i, arm) in arms.iter().enumerate() {
            if let Some(first) = arms[..i].iter().find(|a| a.name == arm.name) {
                let name_of = |a: &Arm| {
                    find_field(&source.text, a.span.clone(), "name", "arms.")
                        .unwrap_or(a.span.clone())
                };
                return Err(source.error(
                    Some(name_of(arm)),
                    format!(
                        "field `arms.name`: two arms are named `{}` (the first at line {}): give each arm a name of its own",
                        arm.name,
                        source.line(name_of(first).start)
                    ),
                ));
            }
        }
        for arm in &arms {
            check_sampling(&source, &config, arm)?;
        }
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
                return Err(
                    source.error(at.or(span), format!("field `population.groups`: {message}"))
                );
            }
        }
        let groups = config
            .policy_groups
            .iter()
            .enumerate()
            .map(|(i, g)| policy_group(&source, i, g, &population))
            .collect::<Result<Vec<_>, _>>()?;
        let policies = PolicyPlan {
            default: config.policy,
            groups,
        };
        let per_arm = policies.groups.len() + 1;
        let mut routes = Vec::with_capacity(arms.len() * per_arm);
        for arm in &arms {
            routes.push(arm.llm.clone());
            for (g, group) in policies.groups.iter().enumerate() {
                let llm = group.llm.apply(&arm.llm);
                if !group.llm.is_empty()
                    && let Some((key, p)) = sampling_problem(&llm)
                {
                    let span = config.policy_groups[g].span();
                    let at = find_field(&source.text, span.clone(), key, "policy_groups")
                        .unwrap_or(span);
                    return Err(source.error(
                        Some(at),
                        format!("policy_groups[{g}]: llm: {p} (in arm `{}`)", arm.name),
                    ));
                }
                routes.push(llm);
            }
        }
        if population.personas.is_some() && !policies.uses(PolicyKind::Llm) {
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
            policies,
            records,
            routes,
        })
    }

    /// Routes per arm: the arm's own, then one per policy group.
    pub fn routes_per_arm(&self) -> usize {
        self.policies.groups.len() + 1
    }

    /// The model and sampling of an agent of arm `arm` on route `route` (0: the arm's own;
    /// `g + 1`: policy group `g`'s).
    pub fn llm_of(&self, arm: usize, route: u8) -> &LlmConfig {
        &self.routes[arm * self.routes_per_arm() + route as usize]
    }

    /// The policy of route `route` (0: the experiment's `policy`; `g + 1`: group `g`'s).
    pub fn policy_of_route(&self, route: u8) -> PolicyKind {
        match route {
            0 => self.policies.default,
            g => self.policies.groups[g as usize - 1].policy,
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
                if self.policy_of_route(route) != PolicyKind::Llm {
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
    pub fn is_multi_model(&self) -> bool {
        self.models().len() > 1
    }

    /// A problem with model `name` (one that cannot be found or loaded), at the line of the
    /// config that names it, or at `--model` when the command line named it.
    pub fn model_error(&self, name: &str, message: impl std::fmt::Display) -> ConfigError {
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
    pub fn locate(&self, arm: Option<usize>, problem: ScenarioProblem) -> ConfigError {
        let text = &self.source.text;
        let field = if problem.field.is_empty() {
            String::new()
        } else {
            format!("field `{}`: ", problem.field)
        };
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

    /// The largest number of state rows one step writes (every agent of every cell).
    pub fn largest_step_rows(&self) -> usize {
        let cells = self.arms.len() * self.config.replicates.0;
        self.config.agents.0.iter().max().copied().unwrap_or(0) * cells
    }
}

/// The text of a sweep value in an arm's name: `2/3`, `0.5`, `cot`.
fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every arm crossed with every combination of the sweep's values.
fn sweep_arms(
    source: &Source,
    arms: Vec<Arm>,
    sweep: &toml::Spanned<super::config::SweepConfig>,
    only_base: bool,
) -> Result<Vec<Arm>, ConfigError> {
    let s = sweep.get_ref();
    let mut axes: Vec<(bool, &String, &Vec<toml::Value>)> = Vec::new();
    for (key, values) in &s.scenario {
        axes.push((false, key, values));
    }
    for (key, values) in &s.llm {
        if !["model", "temperature", "top_p", "top_k", "max_tokens"].contains(&key.as_str()) {
            return Err(source.error(
                find_field(&source.text, sweep.span(), key, "sweep"),
                format!(
                    "field `sweep.llm.{key}`: not a model or sampling setting (sweepable: model, temperature, top_p, top_k, max_tokens)"
                ),
            ));
        }
        axes.push((true, key, values));
    }
    if let Some((_, key, _)) = axes.iter().find(|(_, _, v)| v.is_empty()) {
        return Err(source.error(
            find_field(&source.text, sweep.span(), key, "sweep"),
            format!("field `sweep.{key}`: give at least one value"),
        ));
    }
    for (is_llm, key, values) in &axes {
        let texts: Vec<String> = values.iter().map(value_text).collect();
        // `250` and `250.0` (or `"250"`) make the same arm under two names.
        let same = |a: usize, b: usize| {
            texts[a] == texts[b]
                || match (&values[a], &values[b]) {
                    (toml::Value::Integer(i), toml::Value::Float(f))
                    | (toml::Value::Float(f), toml::Value::Integer(i)) => *i as f64 == *f,
                    _ => false,
                }
        };
        if let Some(twice) = (0..values.len())
            .find(|&i| (0..i).any(|j| same(i, j)))
            .map(|i| &texts[i])
        {
            return Err(source.error(
                find_field(&source.text, sweep.span(), key, "sweep").or(Some(sweep.span())),
                format!(
                    "field `sweep.{}.{key}`: `{twice}` is listed twice: each value makes an arm, so give each once",
                    if *is_llm { "llm" } else { "scenario" }
                ),
            ));
        }
    }
    // Counted before any is made: a sweep of many long lists is a product, not a sum.
    let count = axes
        .iter()
        .try_fold(arms.len(), |n, (_, _, values)| n.checked_mul(values.len()));
    if count.is_none_or(|n| n > MAX_ARMS) {
        let product: Vec<String> = std::iter::once(arms.len())
            .chain(axes.iter().map(|(_, _, v)| v.len()))
            .map(|n| n.to_string())
            .collect();
        return Err(source.error(
            Some(sweep.span()),
            format!(
                "field `sweep`: its values make {} arms ({}), more than the {MAX_ARMS} a run may have",
                count.map_or("too many".to_string(), |n| n.to_string()),
                product.join(" x ")
            ),
        ));
    }
    let mut out = Vec::new();
    for arm in arms {
        let mut combos: Vec<Vec<usize>> = vec![vec![]];
        for (_, _, values) in &axes {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    (0..values.len()).map(move |i| {
                        let mut c = c.clone();
                        c.push(i);
                        c
                    })
                })
                .collect();
        }
        for combo in combos {
            let mut table = arm.table.clone();
            let mut change = arm.change.clone();
            let mut llm = toml::Table::new();
            let mut parts = Vec::new();
            for ((is_llm, key, values), &i) in axes.iter().zip(&combo) {
                let value = values[i].clone();
                parts.push(format!("{key}={}", value_text(&value)));
                if *is_llm {
                    llm.insert((*key).clone(), value);
                } else {
                    if let Some(change) = &mut change {
                        change.table.insert((*key).clone(), value.clone());
                    }
                    table.insert((*key).clone(), value);
                }
            }
            let overrides: LlmOverrides =
                toml::Value::Table(llm)
                    .try_into()
                    .map_err(|e: toml::de::Error| {
                        source.error(Some(sweep.span()), format!("field `sweep.llm`: {e}"))
                    })?;
            let name = if only_base {
                parts.join(", ")
            } else {
                format!("{}, {}", arm.name, parts.join(", "))
            };
            out.push(Arm {
                name,
                table,
                change,
                llm: overrides.apply(&arm.llm),
                span: arm.span.clone(),
            });
        }
    }
    Ok(out)
}

/// An arm's `from_step`, checked: a step of the run after the first (whose changes hold from
/// the start, as an arm without one), of an arm whose changes are scenario knobs.
fn from_step(
    source: &Source,
    config: &ExperimentConfig,
    arm: &toml::Spanned<super::config::ArmConfig>,
    from: i64,
) -> Result<usize, ConfigError> {
    let a = arm.get_ref();
    let at =
        |field: &str| find_field(&source.text, arm.span(), field, "arms.").or(Some(arm.span()));
    let steps = config.steps.0;
    let problem = if from < 1 {
        format!("{from} is not a step: steps count from 1")
    } else if from == 1 {
        "1 is the first step: leave `from_step` out for changes that hold from the start".into()
    } else if from as u64 > steps as u64 {
        format!(
            "{from} is after the run's last step ({steps}), so the arm would change nothing: give a step from 2 to {steps}"
        )
    } else if !a.llm.is_empty() {
        return Err(source.error(
            at("llm"),
            format!(
                "arm `{}`: `from_step` delays the arm's `scenario` changes, and its `llm` changes would hold from the start: make them an arm of their own",
                a.name
            ),
        ));
    } else if a.scenario.is_empty() {
        format!(
            "arm `{}` changes no scenario knob, so there is nothing to change from step {from}: add `scenario = {{ ... }}`",
            a.name
        )
    } else {
        return Ok(from as usize);
    };
    Err(source.error(
        at("from_step"),
        format!("field `arms.from_step`: {problem}"),
    ))
}

fn check_sampling(
    source: &Source,
    config: &ExperimentConfig,
    arm: &Arm,
) -> Result<(), ConfigError> {
    match sampling_problem(&arm.llm) {
        None => Ok(()),
        Some((key, p)) => Err(source.error(
            Some(sampling_span(source, config, arm, key)),
            format!("arm `{}`: llm: {p}", arm.name),
        )),
    }
}

/// The setting of `l` out of its range, and why, if one is.
fn sampling_problem(l: &LlmConfig) -> Option<(&'static str, String)> {
    if l.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Some((
            "model",
            "model is empty: name a preset, a model folder, a GGUF file or a Hub repo id".into(),
        ));
    }
    if !(l.temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&l.temperature)) {
        Some((
            "temperature",
            format!(
                "temperature {} must be from 0 to {MAX_TEMPERATURE}",
                l.temperature
            ),
        ))
    } else if !(l.top_p > 0.0 && l.top_p <= 1.0) {
        Some(("top_p", format!("top_p {} must be in (0, 1]", l.top_p)))
    } else if l.max_tokens == 0 {
        Some(("max_tokens", "max_tokens must be at least 1".into()))
    } else if l.top_k == Some(0) {
        Some(("top_k", "top_k must be at least 1 (or absent)".into()))
    } else if l.wave == 0 {
        Some(("wave", "wave must be at least 1".into()))
    } else {
        None
    }
}

/// Where sampling setting `key` of `arm` is set: a `[sweep]` of it, the arm's own `llm`
/// table, or the `[llm]` section; the arm itself when none says.
fn sampling_span(source: &Source, config: &ExperimentConfig, arm: &Arm, key: &str) -> Range<usize> {
    let text = &source.text;
    if let Some(sweep) = config
        .sweep
        .as_ref()
        .filter(|s| s.get_ref().llm.contains_key(key))
    {
        return find_field(text, sweep.span(), key, "sweep").unwrap_or(sweep.span());
    }
    let in_arm = config.arms.iter().any(|a| a.span() == arm.span);
    if in_arm && let Some(at) = find_field(text, arm.span.clone(), key, "arms.") {
        return at;
    }
    let section = text
        .match_indices("[llm]")
        .map(|(i, _)| i)
        .find(|&i| i == 0 || text[..i].ends_with('\n'));
    section
        .and_then(|start| find_field(text, start..text.len(), key, "llm"))
        .unwrap_or(arm.span.clone())
}

fn policy_group(
    source: &Source,
    index: usize,
    group: &toml::Spanned<PolicyGroupConfig>,
    population: &PopulationSpec,
) -> Result<PolicyGroup, ConfigError> {
    let g = group.get_ref();
    let at = |m: String| source.error(Some(group.span()), format!("policy_groups[{index}]: {m}"));
    if index >= MAX_POLICY_GROUPS {
        return Err(at(format!(
            "a run may have at most {MAX_POLICY_GROUPS} policy groups"
        )));
    }
    if g.policy != PolicyKind::Llm && !g.llm.is_empty() {
        let span =
            find_field(&source.text, group.span(), "llm", "policy_groups").unwrap_or(group.span());
        return Err(source.error(
            Some(span),
            format!(
                "policy_groups[{index}]: field `llm`: a `{}` group asks no model: remove its llm \
                 settings, or make it policy = \"llm\"",
                g.policy.name()
            ),
        ));
    }
    if !(g.share > 0.0 && g.share <= 1.0) {
        return Err(at(format!(
            "share {} must be in (0, 1]: the share of matching agents that use `{}`",
            g.share,
            g.policy.name()
        )));
    }
    let mut filter = Vec::new();
    for (name, value) in &g.filter {
        let Some(i) = population.attributes.iter().position(|a| a.name() == name) else {
            let known: Vec<&str> = population.attributes.iter().map(Attribute::name).collect();
            return Err(at(format!(
                "where: unknown attribute `{name}` (the population has: {})",
                if known.is_empty() {
                    "none; describe it under [population.attributes]".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        let condition = match &population.attributes[i] {
            Attribute::Categorical { categories, .. } => {
                let wanted: Vec<&str> = match value {
                    toml::Value::String(s) => vec![s.as_str()],
                    toml::Value::Array(a) => a.iter().filter_map(|v| v.as_str()).collect(),
                    _ => vec![],
                };
                if wanted.is_empty() {
                    return Err(at(format!(
                        "where.{name}: give a category or a list of them"
                    )));
                }
                let codes = wanted
                    .iter()
                    .map(|w| {
                        categories
                            .iter()
                            .position(|c| c == w)
                            .map(|c| c as u16)
                            .ok_or_else(|| {
                                at(format!(
                                    "where.{name}: `{w}` is not a category (known: {})",
                                    categories.join(", ")
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Condition::OneOf(codes)
            }
            Attribute::Numeric { .. } => {
                let bounds: Vec<f64> = value
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
                            .collect()
                    })
                    .unwrap_or_default();
                match bounds.as_slice() {
                    [lo, hi] if lo <= hi => Condition::Within(*lo, *hi),
                    _ => {
                        return Err(at(format!(
                            "where.{name}: a numeric attribute takes [low, high]"
                        )));
                    }
                }
            }
        };
        filter.push((i, condition));
    }
    Ok(PolicyGroup {
        policy: g.policy,
        share: g.share,
        filter,
        llm: g.llm.clone(),
    })
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
        assert_eq!(e.policies.default, PolicyKind::Llm);
        assert!(!e.policies.is_mixed());
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
        assert!(e.policies.is_mixed());
        assert_eq!(
            e.policies.groups[0].filter,
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
}
