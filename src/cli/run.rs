//! `throng run CONFIG` and `throng run --resume RUN_DIR`: an experiment from config to
//! records, then its report.

use super::ModelArgs;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;
use throng::record::{self, Manifest, Status};
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
    let (config_path, dir, resume) = match (&args.config, &args.resume) {
        (_, Some(dir)) => {
            if !dir.is_dir() {
                bail!(
                    "cannot resume {}: no such folder (give the run folder that `throng run` wrote)",
                    dir.display()
                );
            }
            if !dir.join(record::MANIFEST).exists() || !dir.join(record::CONFIG).exists() {
                bail!(
                    "cannot resume {}: it is not a throng run folder (no manifest.json and config.toml)",
                    dir.display()
                );
            }
            (dir.join(record::CONFIG), dir.clone(), true)
        }
        (Some(config), None) => (config.clone(), PathBuf::new(), false),
        (None, None) => bail!("give an experiment config, or --resume RUN_DIR"),
    };
    let overrides = Overrides {
        policy: args.policy,
        replicates: args.replicates,
        steps: args.steps,
        agents: args.agents.clone(),
        model: model_given.then(|| args.model.model.clone()),
    };
    if resume && !overrides.is_empty() {
        bail!(
            "--resume continues a run as it was configured: drop --policy/--replicates/--steps/--agents/--model \
             (its settings are in {})",
            config_path.display()
        );
    }
    let mut loaded = scenarios::load(&config_path, &overrides)?;
    let dir = if resume {
        dir
    } else {
        args.out.clone().unwrap_or_else(|| {
            throng::sim::runner::default_run_dir(&loaded.experiment().config.name)
        })
    };
    let mut manifest = if resume {
        let mut m: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
        if m.status == Status::Finished {
            bail!(
                "the run in {} has finished; nothing to resume",
                dir.display()
            );
        }
        let point = loaded.resume_from(&dir)?;
        if let Some(warning) = &point.warning {
            eprintln!("throng: warning: {warning}");
        }
        eprintln!(
            "throng: resuming {} at step {} of {}",
            dir.display(),
            point.steps_done,
            m.planned_steps()
        );
        m.status = Status::Running;
        m.error = None;
        m
    } else {
        let exp = loaded.experiment();
        if dir.join(record::MANIFEST).exists() {
            bail!(
                "{} already holds a run: pick another --out, or --resume it",
                dir.display()
            );
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_resolved_config(exp, &dir)?;
        Manifest {
            name: exp.config.name.clone(),
            scenario: exp.scenario.clone(),
            config_file: config_path.display().to_string(),
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
        }
    };
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
        println!(
            "paused after {steps_done} steps; continue with: throng run --resume {}",
            dir.display()
        );
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
        print!("{text}");
        println!("report: {}", dir.join("report.html").display());
    } else {
        println!("run: {}", dir.display());
    }
    Ok(())
}

/// Writes `config.toml` into the run folder: the experiment as run (command-line overrides
/// applied, the templates folder made absolute), so that `--resume` and readers need nothing
/// else; the original goes beside it.
fn write_resolved_config(exp: &Experiment, dir: &std::path::Path) -> Result<()> {
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
    print!("{text}");
    println!("report: {}", dir.join("report.html").display());
    Ok(())
}
