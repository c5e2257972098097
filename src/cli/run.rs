//! `throng run CONFIG` and `throng run --resume RUN_DIR`: an experiment from config to
//! records, then its report.

use super::ModelArgs;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;
use throng::record::{self, Manifest, RunFolder, Status};
use throng::scenarios;
use throng::sim::config::PolicyKind;
use throng::sim::experiment::{Experiment, Overrides};
use throng::sim::policy::Llm;
use throng::sim::runner::{Ended, Progress, RunOptions};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The experiment config (e.g. experiments/exp1-unregulated.toml).
    #[arg(required_unless_present = "resume")]
    pub config: Option<PathBuf>,
    /// Continue the interrupted run in this folder from its last finished step.
    #[arg(long, conflicts_with = "config")]
    pub resume: Option<PathBuf>,
    /// Where to write the run (default: runs/<name>-<unix time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub policy: Option<PolicyKind>,
    #[arg(long, allow_negative_numbers = true)]
    pub replicates: Option<i64>,
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<i64>,
    /// Population sizes, e.g. `20,100`.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub agents: Option<Vec<i64>>,
    /// Skip the report at the end.
    #[arg(long)]
    pub no_report: bool,
    /// Stop after N steps, leaving the run resumable with --resume (for batch-job time limits).
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Where and how to load the model (for the `llm` policy); --model overrides the config's.
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: RunArgs) -> Result<()> {
    let model_given = std::env::args().any(|a| a == "--model" || a.starts_with("--model="));
    let overrides = Overrides {
        policy: args.policy,
        replicates: args.replicates,
        steps: args.steps,
        agents: args.agents.clone(),
        model: model_given.then(|| args.model.model.clone()),
    };
    let (mut loaded, folder, mut manifest) = match (&args.config, &args.resume) {
        (_, Some(dir)) => open_resumed(dir, &overrides)?,
        (Some(config), None) => open_new(config, args.out.clone(), &overrides)?,
        (None, None) => bail!("give an experiment config, or --resume RUN_DIR"),
    };
    let resume = args.resume.is_some();
    let dir = folder.dir().to_path_buf();
    let exp = loaded.experiment();
    let mut llm = if scenarios::needs_model(exp) {
        let model = ModelArgs {
            model: exp.config.llm.model.clone(),
            ..args.model.clone()
        };
        let (engine, weights) = model.load_engine_described()?;
        manifest.model = Some(model.model.clone());
        manifest.device = Some(model.device.clone());
        manifest.weights = Some(weights);
        let prompts = scenarios::prompts(exp)?;
        Some(Llm::new(
            engine,
            prompts,
            exp.config.history,
            exp.config.llm.wave,
        ))
    } else {
        None
    };
    let cells = exp.arms.len() * exp.config.replicates.0;
    let planned: u64 = exp
        .config
        .agents
        .0
        .iter()
        .map(|&n| (n * cells * exp.config.steps.0) as u64)
        .sum();
    let name = exp.config.name.clone();
    let bar = ProgressBar::new(planned);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {human_pos}/{human_len} decisions, {per_sec} [{elapsed_precise}, ETA {eta_precise}] {msg}",
        )
        .expect("invariant: a valid template"),
    );
    let started = Instant::now();
    let mut steps_done = 0u64;
    eprintln!("throng: running {name} into {}", dir.display());
    let options = RunOptions {
        resume,
        stop_after: args.stop_after,
        stop: None,
    };
    let ended = loaded.run(
        llm.as_mut(),
        &dir,
        &mut manifest,
        &options,
        &mut |p| match p {
            Progress::Decided(n) => bar.inc(n as u64),
            Progress::Step {
                population,
                step,
                steps,
                step_seconds,
                ..
            } => {
                steps_done += 1;
                bar.set_message(format!(
                    "{population} agents, step {step}/{steps} took {step_seconds:.2}s"
                ));
            }
        },
    );
    let ended = match ended {
        Ok(ended) => ended,
        Err(e) => {
            bar.abandon();
            manifest.status = Status::Failed;
            manifest.error = Some(e.to_string());
            let _ = record::write_json_atomic(&dir.join(record::MANIFEST), &manifest);
            return Err(e).with_context(|| {
                format!(
                    "the run stopped; its finished steps are kept: throng run --resume {}",
                    dir.display()
                )
            });
        }
    };
    bar.finish();
    if ended == Ended::Paused {
        manifest.status = Status::Paused;
        record::write_json_atomic(&dir.join(record::MANIFEST), &manifest)?;
        out!(
            "paused after {steps_done} steps; continue with: throng run --resume {}",
            dir.display()
        )?;
        return Ok(());
    }
    manifest.status = Status::Finished;
    manifest.finished_unix = Some(record::now_unix());
    manifest.peak_rss_bytes = record::peak_rss_bytes();
    if let Some(llm) = &llm {
        let engine = llm.engine();
        let t = engine.totals();
        manifest.prefix_hit_rate = Some(t.prefix_hit_rate());
        manifest.preemptions = Some(t.preemptions);
        eprintln!(
            "{}",
            super::generate::summary(
                engine,
                manifest.counters.decisions as usize,
                started.elapsed()
            )
        );
    }
    record::write_json_atomic(&dir.join(record::MANIFEST), &manifest)?;
    if !args.no_report {
        let text =
            scenarios::report(&dir).map_err(|e| anyhow::anyhow!("writing the report: {e}"))?;
        out!("{}", text.trim_end())?;
        out!("report: {}", dir.join("report.html").display())?;
    } else {
        out!("run: {}", dir.display())?;
    }
    Ok(())
}

/// Takes the run folder `dir` to continue it: checks it, its manifest and its checkpoint
/// before anything heavy (the model) is loaded.
fn open_resumed(
    dir: &Path,
    overrides: &Overrides,
) -> Result<(Box<dyn scenarios::Loaded>, RunFolder, Manifest)> {
    if !overrides.is_empty() {
        bail!(
            "--resume continues a run as it was configured: drop --policy/--replicates/--steps/--agents/--model \
             (its settings are in {})",
            dir.join(record::CONFIG).display()
        );
    }
    let folder = RunFolder::resume(dir)?;
    let mut manifest: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
    if manifest.status == Status::Finished {
        bail!(
            "the run in {} has finished; nothing to resume",
            dir.display()
        );
    }
    let config = dir.join(record::CONFIG);
    if !config.is_file() {
        bail!(
            "cannot resume {}: it stopped before its config was written, so it never ran; start it again",
            dir.display()
        );
    }
    let mut loaded = scenarios::load(&config, overrides)?;
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

/// Takes a new or empty folder for a new run of `config`: the manifest first, so that the
/// folder is a recognisable run from its first moment, then the config as run.
fn open_new(
    config: &Path,
    out: Option<PathBuf>,
    overrides: &Overrides,
) -> Result<(Box<dyn scenarios::Loaded>, RunFolder, Manifest)> {
    let loaded = scenarios::load(config, overrides)?;
    let exp = loaded.experiment();
    let dir = out.unwrap_or_else(|| throng::sim::runner::default_run_dir(&exp.config.name));
    let manifest = Manifest {
        name: exp.config.name.clone(),
        scenario: exp.scenario.clone(),
        config_file: config.display().to_string(),
        seed: exp.config.seed,
        policy: exp.policies.label(),
        throng_version: env!("CARGO_PKG_VERSION").into(),
        arms: exp.arms.iter().map(|a| a.name.clone()).collect(),
        populations: exp.config.agents.0.clone(),
        replicates: exp.config.replicates.0,
        steps: exp.config.steps.0,
        status: Status::Running,
        started_unix: record::now_unix(),
        ..Manifest::default()
    };
    let folder = RunFolder::create(&dir, &manifest)?;
    write_resolved_config(exp, &dir)?;
    Ok((loaded, folder, manifest))
}

/// Writes `config.toml` into the run folder: the experiment as run (command-line overrides
/// applied, the templates folder made absolute), so that `--resume` and readers need nothing
/// else; the original goes beside it.
fn write_resolved_config(exp: &Experiment, dir: &Path) -> Result<()> {
    let mut table: toml::Table = toml::from_str(&exp.source.text)?;
    let c = &exp.config;
    table.insert(
        "replicates".into(),
        toml::Value::Integer(c.replicates.0 as i64),
    );
    table.insert("steps".into(), toml::Value::Integer(c.steps.0 as i64));
    table.insert("policy".into(), toml::Value::String(c.policy.name().into()));
    table.insert(
        "agents".into(),
        toml::Value::Array(
            c.agents
                .0
                .iter()
                .map(|&a| toml::Value::Integer(a as i64))
                .collect(),
        ),
    );
    let templates = std::path::absolute(scenarios::templates_dir(exp))?;
    table.insert(
        "templates".into(),
        toml::Value::String(templates.display().to_string()),
    );
    let llm = table
        .entry("llm")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(llm) = llm {
        llm.insert("model".into(), toml::Value::String(c.llm.model.clone()));
    }
    std::fs::write(dir.join(record::CONFIG), toml::to_string_pretty(&table)?)?;
    std::fs::write(dir.join("config.original.toml"), &exp.source.text)?;
    Ok(())
}

/// `throng report RUN_DIR`.
pub fn report(dir: PathBuf) -> Result<()> {
    let text = scenarios::report(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    out!("{}", text.trim_end())?;
    out!("report: {}", dir.join("report.html").display())?;
    Ok(())
}
