//! A run's folder, taken before anything heavy is loaded: a new run's made (its manifest, then
//! its inputs), or an interrupted run's checked (its manifest, inputs and checkpoint) to
//! continue it.

use super::error::{RunError, refuse};
use super::inputs::Inputs;
use super::memory::MemoryCheck;
use crate::host::Program;
use crate::record::{self, Manifest, RunFolder, Status};
use crate::scenarios::{self, Registry};
use crate::sim::experiment::Overrides;
use std::path::{Path, PathBuf};

/// The experiment of a run, its folder and its manifest as it starts.
pub type Opened = (Box<dyn scenarios::Loaded>, RunFolder, Manifest);

/// A new run's folder while the run starts: given up when dropped before [`Starting::started`]
/// (see [`RunFolder::abandon`]).
pub(crate) struct Starting(pub Option<RunFolder>);

impl Starting {
    /// The folder, kept from now on.
    pub fn started(mut self) -> Option<RunFolder> {
        self.0.take()
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(folder) = self.0.take() {
            folder.abandon();
        }
    }
}

/// Takes the run folder `dir` to continue it: checks it, its manifest, its inputs and its
/// checkpoint before anything heavy (the model) is loaded.
pub(crate) fn open_resumed(
    registry: &Registry,
    dir: &Path,
    overrides: &Overrides,
    memory: &MemoryCheck,
) -> Result<Opened, RunError> {
    if !overrides.is_empty() {
        refuse!(
            "--resume continues a run as it was configured: drop --policy/--replicates/--steps/--agents/--model \
             (its settings are in {})",
            dir.join(record::CONFIG).display()
        );
    }
    let folder = RunFolder::resume(dir)?;
    let mut manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
    if manifest.status == Status::Finished {
        refuse!(
            "the run in {} has finished; nothing to resume",
            dir.display()
        );
    }
    let config = dir.join(record::CONFIG);
    if !config.is_file() {
        refuse!("{}", missing_config(dir, &manifest));
    }
    check_inputs(dir, &manifest)?;
    if let Some(defined_in) = &manifest.defined_in
        && !registry.knows(&manifest.scenario)
    {
        refuse!(
            "cannot resume {}: its scenario `{}` is the Python class `{}` of {}, which this \
             program has not imported: resume it from Python, with `python -m throng run \
             --resume {}` (which imports it) or `throng.run(resume={:?})` with it imported",
            dir.display(),
            manifest.scenario,
            defined_in.class,
            defined_in.importable(),
            dir.display(),
            dir.display().to_string()
        );
    }
    let mut loaded = registry.load(&config, overrides)?;
    if let Err(e) = memory.check(loaded.as_ref()) {
        refuse!("cannot resume {}: {e}", dir.display());
    }
    let point = loaded.resume_from(dir)?;
    if let Some(warning) = &point.warning {
        eprintln!("throng: warning: {warning}");
    }
    eprintln!(
        "throng: resuming {} ({}) at step {} of {}",
        dir.display(),
        manifest.name,
        point.steps_done,
        manifest.planned_steps()
    );
    manifest.status = Status::Running;
    manifest.error = None;
    Ok((loaded, folder, manifest))
}

/// Refuses to resume a run whose config or templates changed since it started (see
/// [`record::inputs`]), naming each change and the two ways on.
fn check_inputs(dir: &Path, manifest: &Manifest) -> Result<(), RunError> {
    if manifest.inputs.is_empty() {
        eprintln!(
            "throng: warning: {} was started by a throng that kept no fingerprints of its inputs: \
             edits made to its config or templates since cannot be detected",
            dir.display()
        );
        return Ok(());
    }
    let changes = record::inputs::changes(dir, &manifest.inputs);
    if changes.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = changes
        .iter()
        .map(|c| format!("  - {}/{c}", dir.display()))
        .collect();
    // The copies under inputs/templates are what the run renders: an edit there is undone
    // from the template it was copied from, not from inputs/, which holds the edit.
    let mut undo = Vec::new();
    if changes.iter().any(|c| !c.is_template()) {
        undo.push(format!(
            "the config as it started is {}",
            dir.join(record::inputs::STARTED_CONFIG).display()
        ));
    }
    for c in changes.iter().filter(|c| c.is_template()) {
        let copy = dir.join(c.file());
        undo.push(
            match record::inputs::original_template(dir, manifest, c.file()) {
                Some(original) => format!(
                    "{} is the template as it started: copy it to {}",
                    original.display(),
                    copy.display()
                ),
                None => format!(
                    "{} is the run's own copy of a template, the one it renders, and no other copy \
                 of it as it started was found: put back what was changed in it",
                    copy.display()
                ),
            },
        );
    }
    refuse!(
        "cannot resume {dir}: its inputs changed since the run started, and a resume runs \
         exactly what the run started with:\n{}\nTo continue the run as it started, undo the \
         change: {}. To run with the change, start a new run: throng run {config} --out \
         NEW_FOLDER",
        list.join("\n"),
        undo.join("; "),
        dir = dir.display(),
        config = dir.join(record::CONFIG).display(),
    )
}

/// Loads `config` for a new run and checks what can be checked before its folder is written:
/// the config, the memory it needs, the models it names.
pub(crate) fn check_new(
    registry: &Registry,
    config: &Path,
    overrides: &Overrides,
    memory: &MemoryCheck,
) -> Result<Box<dyn scenarios::Loaded>, RunError> {
    let loaded = registry.load(config, overrides)?;
    if let Err(e) = memory.check(loaded.as_ref()) {
        refuse!("{}: {e}", config.display());
    }
    if scenarios::needs_model(loaded.experiment()) {
        super::settings::models_of(loaded.experiment())?;
    }
    Ok(loaded)
}

/// Takes a new or empty folder for a new run of `config`: the manifest first, so that the
/// folder is a recognisable run from its first moment, then the config as run.
pub(crate) fn open_new(
    registry: &Registry,
    config: &Path,
    out: Option<PathBuf>,
    overrides: &Overrides,
    memory: &MemoryCheck,
    program: &Program,
) -> Result<Opened, RunError> {
    let loaded = check_new(registry, config, overrides, memory)?;
    let exp = loaded.experiment();
    let templates = std::path::absolute(scenarios::templates_dir(exp))?;
    if templates.to_str().is_none() {
        refuse!(
            "the templates folder {} has a path that is not valid UTF-8, which the run's \
             config.toml cannot record for --resume: move the templates (or the config) to a \
             folder whose path is text, or point `templates` in {} at one",
            templates.display(),
            config.display()
        );
    }
    let dir = out.unwrap_or_else(|| crate::sim::runner::default_run_dir(&exp.config.name));
    let manifest = Manifest {
        name: exp.config.name.clone(),
        scenario: exp.scenario.clone(),
        config_file: config.display().to_string(),
        seed: exp.config.seed,
        policy: exp.policy_label(),
        throng_version: env!("CARGO_PKG_VERSION").into(),
        arms: exp.arms.iter().map(|a| a.name.clone()).collect(),
        populations: exp.config.agents.0.clone(),
        replicates: exp.config.replicates.0,
        steps: exp.config.steps.0,
        status: Status::Running,
        started_unix: record::now_unix(),
        counterfactual: super::base_run::base_of(exp, program)?,
        defined_in: registry.defined_in(&exp.scenario),
        ..Manifest::default()
    };
    let inputs = Inputs::of(registry, exp)?;
    let manifest = Manifest {
        inputs: inputs.fingerprints(),
        ..manifest
    };
    let folder = RunFolder::create(&dir, &manifest, program)?;
    let written = record::full_disk_at("config", &dir.join(record::CONFIG))
        .map_err(RunError::from)
        .and_then(|()| inputs.write(&dir));
    if let Err(e) = written {
        // Nothing has run: leave the place as it was, so that the same --out works again.
        folder.abandon();
        return Err(RunError::context(
            format!(
                "cannot start the run in {}: its config could not be written (the folder is left as it was)",
                dir.display()
            ),
            e,
        ));
    }
    Ok((loaded, folder, manifest))
}

/// Why a run whose `config.toml` is gone cannot be resumed, and what to do: a run that never
/// ran is started again; a run with finished steps keeps them, and gets its config back.
fn missing_config(dir: &Path, manifest: &Manifest) -> String {
    let checkpoint = [record::checkpoint::CHECKPOINT, record::checkpoint::PREVIOUS]
        .iter()
        .any(|name| dir.join(name).exists());
    if !checkpoint && manifest.steps_done == 0 && record::never_started(dir).is_some() {
        return format!(
            "cannot resume {0}: the run stopped at its start, before its config was written (a full \
             disk, or a kill), so it never ran and holds no records: start it again with `throng run \
             CONFIG --out {0}`, which takes the folder as empty",
            dir.display()
        );
    }
    let started = dir.join(record::inputs::STARTED_CONFIG);
    let original = dir.join(record::CONFIG_ORIGINAL);
    let source = match (started.is_file(), original.is_file()) {
        (true, _) => format!(
            "{} is the config as the run started (copy it back as it is)",
            started.display()
        ),
        (false, true) => format!(
            "{} is the config as written, before the command line's overrides",
            original.display()
        ),
        (false, false) => format!(
            "the run was started from {}",
            match manifest.config_file.is_empty() {
                true => "an experiment file",
                false => &manifest.config_file,
            }
        ),
    };
    format!(
        "cannot resume {dir}: its config.toml is missing (deleted or moved since the run started). \
         Nothing is lost: the records of its {done} finished steps (of {planned}) are still in {dir}, \
         so do not delete the folder. Put the config it ran with back as {config} and resume again: \
         {source}; the run used steps = {steps}, replicates = {replicates}, agents = {agents:?}, \
         policy = {policy}{model} (manifest.json), and a relative `templates` path in it must lead \
         from {dir} to the templates",
        dir = dir.display(),
        done = manifest.steps_done,
        planned = manifest.planned_steps(),
        config = dir.join(record::CONFIG).display(),
        steps = manifest.steps,
        replicates = manifest.replicates,
        agents = manifest.populations,
        policy = manifest.policy,
        model = manifest
            .model
            .as_ref()
            .map(|m| format!(", model = {m}"))
            .unwrap_or_default(),
    )
}
