//! `throng run CONFIG` and `throng run --resume RUN_DIR`: an experiment from config to
//! records, then its report.

use super::ModelArgs;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;
use throng::record::{self, Manifest};
use throng::scenarios::{self, Overrides, PolicyChoice};
use throng::sim::config::PolicyKind;

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
    #[arg(long)]
    pub replicates: Option<usize>,
    #[arg(long)]
    pub steps: Option<usize>,
    /// Population sizes, e.g. `20,100`.
    #[arg(long, value_delimiter = ',')]
    pub agents: Option<Vec<usize>>,
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
        (_, Some(dir)) => (dir.join(record::CONFIG), dir.clone(), true),
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
    // A resumed run's config.toml already holds the overrides it started with.
    let overrides = if resume {
        Overrides::default()
    } else {
        overrides
    };
    let exp = scenarios::load(&config_path, &overrides)?;
    let dir = if resume {
        dir
    } else {
        args.out
            .clone()
            .unwrap_or_else(|| throng::sim::runner::default_run_dir(&exp.config.name))
    };
    let mut manifest = if resume {
        let mut m: Manifest = record::read_json(&dir.join(record::MANIFEST))?;
        if m.status == "finished" {
            bail!(
                "the run in {} has finished; nothing to resume",
                dir.display()
            );
        }
        m.status = "running".into();
        m
    } else {
        if dir.join(record::MANIFEST).exists() {
            bail!(
                "{} already holds a run: pick another --out, or --resume it",
                dir.display()
            );
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_resolved_config(&exp, &dir)?;
        Manifest {
            name: exp.config.name.clone(),
            scenario: exp.scenario.clone(),
            config_file: config_path.display().to_string(),
            seed: exp.config.seed,
            policy: format!("{:?}", exp.config.policy).to_lowercase(),
            throng_version: env!("CARGO_PKG_VERSION").into(),
            arms: exp.arms.iter().map(|(n, _)| n.clone()).collect(),
            populations: exp.config.agents.0.clone(),
            replicates: exp.config.replicates.0,
            steps: exp.config.steps.0,
            status: "running".into(),
            started_unix: record::now_unix(),
            ..Manifest::default()
        }
    };
    let policy = match exp.config.policy {
        PolicyKind::Scripted => PolicyChoice::Scripted,
        PolicyKind::Llm => {
            let model = ModelArgs {
                model: exp.config.llm.model.clone(),
                ..args.model.clone()
            };
            let (engine, weights) = model.load_engine_described()?;
            manifest.model = Some(model.model.clone());
            manifest.device = Some(model.device.clone());
            manifest.weights = Some(weights);
            PolicyChoice::Llm(Box::new(engine))
        }
    };
    let total = exp.config.agents.0.len() * exp.config.steps.0;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("invariant: a valid template"),
    );
    let started = Instant::now();
    let (mut steps_done, mut decisions) = (0u64, 0u64);
    eprintln!("throng: running {} into {}", exp.config.name, dir.display());
    let options = throng::sim::runner::RunOptions {
        resume,
        stop_after: args.stop_after,
    };
    let (ended, engine) = scenarios::run(&exp, policy, &dir, &mut manifest, options, |p| {
        steps_done += 1;
        decisions += p.decisions as u64;
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        bar.set_position(((p.group * p.steps) + p.step) as u64);
        bar.set_message(format!(
            "{} companies, {:.2} steps/s, {:.1} decisions/s",
            p.population,
            steps_done as f64 / secs,
            decisions as f64 / secs
        ));
    })?;
    bar.finish();
    if ended == throng::sim::runner::Ended::Paused {
        manifest.status = "paused".into();
        record::write_json_atomic(&dir.join(record::MANIFEST), &manifest)?;
        println!(
            "paused after {steps_done} steps; continue with: throng run --resume {}",
            dir.display()
        );
        return Ok(());
    }
    manifest.status = "finished".into();
    manifest.finished_unix = Some(record::now_unix());
    if let Some(engine) = &engine {
        let t = engine.totals();
        manifest.prefix_hit_rate = Some(t.prefix_hit_rate());
        manifest.preemptions = Some(t.preemptions);
        eprintln!(
            "{}",
            super::generate::summary(engine, manifest.decisions as usize, started.elapsed())
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
fn write_resolved_config(
    exp: &throng::sim::config::Experiment,
    dir: &std::path::Path,
) -> Result<()> {
    let mut table: toml::Table = toml::from_str(&exp.source.text)?;
    let c = &exp.config;
    table.insert(
        "replicates".into(),
        toml::Value::Integer(c.replicates.0 as i64),
    );
    table.insert("steps".into(), toml::Value::Integer(c.steps.0 as i64));
    table.insert(
        "policy".into(),
        toml::Value::String(format!("{:?}", c.policy).to_lowercase()),
    );
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
