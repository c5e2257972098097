//! The simulations throng ships, each a [`Scenario`] in its own folder, and the registry:
//! one entry per scenario, with its name, how its config becomes typed arms (read once, and
//! checked), how it runs, and how its report is written.
#![warn(missing_docs)]

#[allow(missing_docs)] // The shipped studies: their own chapters document them.
pub mod energy_market;
#[allow(missing_docs)]
pub mod guess;

use crate::record::{self, DefinedIn, Manifest};
use crate::sim::config::{ConfigError, PolicyKind, ScenarioProblem};
use crate::sim::experiment::{Experiment, Overrides};
use crate::sim::footprint::{Footprint, SizeError};
use crate::sim::policy::{Llm, template_name};
use crate::sim::prompt::PromptBook;
use crate::sim::runner::{
    self, Checkpoint, Ended, FirstStep, Policies, Progress, SimError, SimOptions,
};
use crate::sim::scenario::{Descriptor, Scenario};
use std::path::{Path, PathBuf};

pub use crate::analysis::ReportError;

/// A kind of scenario, as the registry knows it: its [`Descriptor`] (its name, and the roles
/// whose prompt templates it needs), how a config becomes its typed arms, and how its report
/// is written. A Rust type registers through [`Registry::with`]; a kind defined at run time (a
/// Python class) implements this itself and registers through [`Registry::with_kind`].
pub trait Kind: Send + Sync {
    /// What the runner knows of the kind; the arms [`Kind::load`] makes carry it.
    fn descriptor(&self) -> &Descriptor;
    /// Types and checks the experiment's arms (see [`load_with`]).
    fn load(&self, exp: Experiment) -> Result<Box<dyn Loaded>, ConfigError>;
    /// Writes the report of a run folder; returns its key numbers as text.
    fn report(&self, dir: &Path) -> Result<String, ReportError>;
    /// Where its code is, when it is not the program's own (a Python class): recorded in the
    /// run folder, so that a reader knows what to import to report or resume the run.
    fn defined_in(&self) -> Option<DefinedIn> {
        None
    }
}

/// How a kind's runs are reported: the report is the read side of a run folder, so it is
/// the registry's to choose, not the simulation's.
pub(crate) type ReportFn = fn(&Path) -> Result<String, ReportError>;

/// The report every scenario gets unless it has its own: per-step means with intervals over
/// replicates, distributions, the headline table, caveats and timing
/// ([`crate::analysis::overview`]).
pub fn base_report(dir: &Path) -> Result<String, ReportError> {
    crate::analysis::overview::write(dir, &crate::analysis::overview::OverviewOptions::default())
        .map(|r| r.summary)
}

/// A scenario type's kind: everything from the type itself, and its report.
struct Native<S> {
    descriptor: Descriptor,
    report: ReportFn,
    scenario: std::marker::PhantomData<fn() -> S>,
}

impl<S: Scenario> Kind for Native<S> {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }
    fn load(&self, exp: Experiment) -> Result<Box<dyn Loaded>, ConfigError> {
        load_with(exp, self.descriptor.clone(), S::from_table)
    }
    fn report(&self, dir: &Path) -> Result<String, ReportError> {
        (self.report)(dir)
    }
}

/// The scenarios a `throng` program knows, by name: the ones throng ships
/// ([`Registry::builtin`]) and any a study adds with [`Registry::with`], which then get the
/// whole command line through [`crate::cli::main_with`].
#[derive(Clone)]
pub struct Registry {
    entries: Vec<std::sync::Arc<dyn Kind>>,
}

impl Registry {
    /// No scenario at all.
    pub fn empty() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// Every scenario throng ships: the energy market and the guessing game.
    pub fn builtin() -> Self {
        Self::empty()
            .with_report::<energy_market::EnergyMarket>(energy_market::report::write)
            .with_report::<guess::GuessGame>(guess::report::write)
    }

    /// Adds scenario `S` under its [`Scenario::NAME`], its runs reported by the base report
    /// ([`base_report`]); a scenario of the same name registered before is replaced (a study
    /// may ship its own version of a built-in one).
    pub fn with<S: Scenario + 'static>(self) -> Self {
        self.with_report::<S>(base_report)
    }

    /// Adds scenario `S` with a report of its own: `report` writes it for a run folder and
    /// returns its key numbers as text (the energy market and the guessing game hand their
    /// sections and figures to the base through `analysis::overview::write_with`).
    pub fn with_report<S: Scenario + 'static>(self, report: ReportFn) -> Self {
        self.with_kind(std::sync::Arc::new(Native::<S> {
            descriptor: S::descriptor(),
            report,
            scenario: std::marker::PhantomData,
        }))
    }

    /// Adds a kind of scenario under its own name, replacing one of the same name.
    pub fn with_kind(mut self, kind: std::sync::Arc<dyn Kind>) -> Self {
        self.entries
            .retain(|e| e.descriptor().name != kind.descriptor().name);
        self.entries.push(kind);
        self
    }

    /// The names of the registered scenarios, in the order they were added.
    pub fn names(&self) -> Vec<&str> {
        self.entries
            .iter()
            .map(|e| e.descriptor().name.as_str())
            .collect()
    }

    fn find(&self, name: &str) -> Option<&dyn Kind> {
        self.entries
            .iter()
            .find(|e| e.descriptor().name == name)
            .map(|e| e.as_ref())
    }

    /// Where the code of scenario `name` is, when it is not this program's own.
    pub fn defined_in(&self, name: &str) -> Option<DefinedIn> {
        self.find(name).and_then(|k| k.defined_in())
    }

    /// Whether a scenario of this name is registered.
    pub fn knows(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    fn known(&self) -> String {
        self.names().join(", ")
    }

    /// Loads and checks an experiment: its config, overrides, its scenario's knobs (typed
    /// once, per arm), and its templates.
    pub fn load(&self, path: &Path, overrides: &Overrides) -> Result<Box<dyn Loaded>, ConfigError> {
        let exp = Experiment::load(path, overrides)?;
        let Some(entry) = self.find(&exp.scenario) else {
            return Err(exp.source.error(
                Some(exp.config.scenario.span()),
                format!(
                    "field `scenario.name`: unknown scenario `{}` (known: {}); a study's own \
                     scenario runs from its own program, one written in Python from Python: \
                     import the module whose class `@throng.scenario` registers it, then \
                     `throng.run(config)`, or `python -m throng --import MODULE run CONFIG`",
                    exp.scenario,
                    self.known()
                ),
            ));
        };
        self.prompts(&exp)?;
        entry.load(exp)
    }

    /// The experiment's prompt templates, checked to exist and compile: `system.jinja`, one
    /// per role, and the persona meta-prompt when personas are written by the model.
    pub fn prompts(&self, exp: &Experiment) -> Result<PromptBook, ConfigError> {
        let dir = templates_dir(exp);
        let roles = self
            .find(&exp.scenario)
            .map_or(&[][..], |e| e.descriptor().roles);
        let persona = exp
            .population
            .personas
            .as_ref()
            .map(|p| template_name(&p.template));
        let extra: Vec<&str> = persona.iter().map(String::as_str).collect();
        PromptBook::load(&dir, &exp.scenario, roles, &extra)
            .map_err(|e| exp.templates_error(e.to_string()))
    }

    /// Writes the report of the run in `dir`; returns its key numbers as text.
    pub fn report(&self, dir: &Path) -> Result<String, ReportError> {
        let manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
        match self.find(&manifest.scenario) {
            Some(entry) => entry.report(dir),
            None => Err(ReportError::UnknownScenario {
                scenario: manifest.scenario,
                known: self.known(),
                fix: unknown_fix(manifest.defined_in.as_ref(), dir),
            }),
        }
    }
}

/// How to reach a run's scenario that this program does not know: through the code the run
/// recorded, else by the study's own program.
pub fn unknown_fix(defined_in: Option<&DefinedIn>, dir: &Path) -> String {
    match defined_in {
        Some(d) => format!(
            "it is the Python class `{}` of {}, which this program has not imported: report it \
             from Python, with `python -m throng report {dir}` (which imports it) or \
             `throng.open_run({dir:?}).report()` (which imports it too, when it is importable \
             there)",
            d.class,
            match &d.file {
                Some(file) => format!("`{file}`"),
                None => format!("module `{}`", d.module),
            },
            dir = dir.display()
        ),
        None => "a study's own scenario is reported by the study's own program, or from \
                 Python with its class imported"
            .into(),
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::builtin()
    }
}

/// Where a resumed run stands.
#[derive(Debug, Clone)]
pub struct ResumePoint {
    /// Steps finished, over all population sizes.
    pub steps_done: usize,
    /// Set when the newest checkpoint was damaged and an older one is used, or when there
    /// was none and the run starts again.
    pub warning: Option<String>,
}

/// An experiment whose arms are typed and checked: ready to run.
pub trait Loaded {
    /// The experiment, as loaded and checked.
    fn experiment(&self) -> &Experiment;
    /// Reads the checkpoint of the run in `dir` to continue from it (before any model is
    /// loaded, so that a damaged one is refused early).
    fn resume_from(&mut self, dir: &Path) -> Result<ResumePoint, SimError>;
    /// Runs (or resumes) into `dir`.
    fn run(
        &mut self,
        llm: Option<&mut Llm>,
        dir: &Path,
        manifest: &mut Manifest,
        options: &SimOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Ended, SimError>;
    /// What the run holds in memory at its largest population size, the model aside; an
    /// error when its sizes overflow what throng counts in.
    fn footprint(&self) -> Result<Footprint, SizeError>;
    /// The first step of population size `population` as the model sees it, with `sample`
    /// of its agents decided on this device (`throng plan`).
    fn first_step(
        &self,
        llm: &mut Llm,
        population: usize,
        sample: usize,
    ) -> Result<FirstStep, SimError>;
}

impl std::fmt::Debug for dyn Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let exp = self.experiment();
        f.debug_struct("Loaded")
            .field("name", &exp.config.name)
            .field("scenario", &exp.scenario)
            .field("arms", &exp.arms.len())
            .finish()
    }
}

struct Typed<S: Scenario> {
    exp: Experiment,
    arms: runner::Arms<S>,
    start: Option<Checkpoint<S::World>>,
}

/// Types and checks `exp`'s arms, of kind `kind`, with `make` (a scenario from an arm's
/// `[scenario]` table): the base table first, then each arm's (and, for arms whose changes
/// hold from a later step, each arm's from every such step); each is checked against the
/// population.
pub fn load_with<S: Scenario + 'static>(
    exp: Experiment,
    kind: Descriptor,
    make: impl Fn(&toml::Table) -> Result<S, ScenarioProblem>,
) -> Result<Box<dyn Loaded>, ConfigError> {
    // The base table first, so that its mistakes are reported at its own line once.
    let base = make(&exp.base).map_err(|p| exp.locate(None, p))?;
    let sizes = &exp.config.agents.0;
    base.check_population(&exp.population, sizes)
        .map_err(|p| exp.locate(None, p))?;
    // The arms from step `step` on: each arm's table once its changes hold.
    let arms_at = |step: usize| {
        let arms = exp
            .arms
            .iter()
            .enumerate()
            .map(|(i, arm)| {
                let table = match &arm.change {
                    Some(c) if c.from_step <= step => &c.table,
                    _ => &arm.table,
                };
                make(table).map_err(|p| exp.locate(Some(i), p))
            })
            .collect::<Result<Vec<S>, _>>()?;
        for (i, arm) in arms.iter().enumerate() {
            arm.check_population(&exp.population, sizes)
                .map_err(|p| exp.locate(Some(i), p))?;
        }
        Ok::<_, ConfigError>(arms)
    };
    let mut steps: Vec<usize> = exp
        .arms
        .iter()
        .filter_map(|a| a.change.as_ref().map(|c| c.from_step))
        .collect();
    steps.sort_unstable();
    steps.dedup();
    let later = steps
        .into_iter()
        .map(|step| Ok((step, arms_at(step)?)))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let start = arms_at(0)?;
    check_later_changes(&exp, &start, &later, &make)?;
    let arms = runner::Arms::changing(kind, start, later);
    Ok(Box::new(Typed {
        exp,
        arms,
        start: None,
    }))
}

/// Refuses, at its line, a knob that an arm changes from a later step (`from_step`) but that
/// shapes the worlds at the start (a market's producers, its starting resources): the run
/// keeps the worlds it made at step 0, so the change could never hold. Tried on the first
/// population size's first replicate, as the run would make it; each changed knob is tried
/// alone too, so that the one to blame is named.
fn check_later_changes<S: Scenario>(
    exp: &Experiment,
    start: &[S],
    later: &[(usize, Vec<S>)],
    make: &impl Fn(&toml::Table) -> Result<S, ScenarioProblem>,
) -> Result<(), ConfigError> {
    let Some(&size) = exp.config.agents.0.first() else {
        return Ok(());
    };
    if later.is_empty() {
        return Ok(());
    }
    let population = runner::first_population(exp, size);
    for (step, arms) in later {
        for (i, arm) in exp.arms.iter().enumerate() {
            let Some(change) = arm.change.as_ref().filter(|c| c.from_step == *step) else {
                continue;
            };
            if runner::same_start(exp, &start[i], &arms[i], size, &population) {
                continue;
            }
            let changed: Vec<&String> = change
                .table
                .iter()
                .filter(|(k, v)| arm.table.get(*k) != Some(*v))
                .map(|(k, _)| k)
                .collect();
            let alone = |key: &String| {
                let mut table = arm.table.clone();
                table.insert(key.clone(), change.table[key].clone());
                make(&table)
                    .is_ok_and(|s| !runner::same_start(exp, &start[i], &s, size, &population))
            };
            let shaping: Vec<&String> = changed.iter().copied().filter(|k| alone(k)).collect();
            let named = if shaping.is_empty() { changed } else { shaping };
            let list: Vec<String> = named.iter().map(|k| format!("`{k}`")).collect();
            let (it, shapes) = match named.len() {
                1 => ("it", "shapes"),
                _ => ("they", "shape"),
            };
            let message = format!(
                "{} {shapes} the worlds at the start, so {it} cannot change from step {step} \
                 (`from_step`): leave `from_step` out to change {it} from the start, or change \
                 from a step only knobs that act on each step (prices, caps, prompts)",
                list.join(", ")
            );
            let field = named.first().map_or(String::new(), |k| k.to_string());
            return Err(exp.locate(Some(i), ScenarioProblem::new(field, message)));
        }
    }
    Ok(())
}

impl<S: Scenario> Loaded for Typed<S> {
    fn experiment(&self) -> &Experiment {
        &self.exp
    }

    fn resume_from(&mut self, dir: &Path) -> Result<ResumePoint, SimError> {
        let Some(loaded) = runner::read_checkpoint::<S::World>(dir)? else {
            self.start = None;
            return Ok(ResumePoint {
                steps_done: 0,
                warning: Some(
                    "no step had finished when the run stopped: it starts again from step 0".into(),
                ),
            });
        };
        let cp = loaded.value;
        let point = ResumePoint {
            steps_done: cp.group * self.exp.config.steps.0 + cp.steps_done,
            warning: loaded.warning,
        };
        self.start = Some(cp);
        Ok(point)
    }

    fn run(
        &mut self,
        llm: Option<&mut Llm>,
        dir: &Path,
        manifest: &mut Manifest,
        options: &SimOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Ended, SimError> {
        let mut policies = Policies {
            scripted: crate::sim::policy::Scripted,
            llm,
        };
        let sim = runner::Sim {
            exp: &self.exp,
            arms: &self.arms,
            dir,
        };
        runner::run(
            &sim,
            &mut policies,
            manifest,
            self.start.take(),
            options,
            progress,
        )
    }

    fn footprint(&self) -> Result<Footprint, SizeError> {
        crate::sim::footprint::footprint(&self.exp, self.arms.start())
    }

    fn first_step(
        &self,
        llm: &mut Llm,
        population: usize,
        sample: usize,
    ) -> Result<FirstStep, SimError> {
        runner::first_step(&self.exp, self.arms.start(), population, llm, sample)
    }
}

/// `templates` from the config, else `templates/<scenario>` beside or above the config's
/// folder, else in the current directory.
pub(crate) fn templates_dir(exp: &Experiment) -> PathBuf {
    let name = &exp.scenario;
    let beside = exp.source.dir().join("..").join("templates").join(name);
    let default = if beside.is_dir() {
        beside
    } else {
        PathBuf::from("templates").join(name)
    };
    exp.templates_dir(&default)
}

/// Whether the experiment needs the model.
pub(crate) fn needs_model(exp: &Experiment) -> bool {
    exp.uses(PolicyKind::Llm)
}
