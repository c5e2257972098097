//! `throng run CONFIG` and `throng run --resume RUN_DIR`: an experiment from config to
//! records, then its report.

use super::ModelArgs;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use throng::cluster::Ranks;
use throng::record::{self, Manifest, RunFolder, Status};
use throng::scenarios;
use throng::sim::config::{PolicyKind, Split};
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
    /// How the ranks of an MPI job share the run (default: the config's `split`, else auto:
    /// cells when they deal out evenly, else agents). Records are the same either way.
    #[arg(long, value_enum)]
    pub split: Option<Split>,
    /// Devices of this machine's ranks, one per local rank (e.g. `cuda:0,cuda:2`); the
    /// default is `cuda:LOCAL_RANK` in a CUDA build, else --device.
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<String>>,
    /// Seconds a rank waits for another at the end of a step before stopping the whole job.
    #[arg(long, default_value_t = throng::cluster::DEFAULT_TIMEOUT.as_secs())]
    pub rank_timeout: u64,
    /// Seconds a first Ctrl-C or SIGTERM waits for the current step to finish; a step still
    /// running then (or a second signal) stops the run at once, paused at its last checkpoint.
    #[arg(long, default_value_t = 300)]
    pub stop_timeout: u64,
    /// Where and how to load the model (for the `llm` policy); --model overrides the config's.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The device this rank takes: its entry of --devices, else an explicit --device, else
/// `cuda:LOCAL_RANK` in a CUDA build, else the CPU.
fn device_for(args: &RunArgs, ranks: &Ranks) -> String {
    let local = ranks.topology().local_rank;
    if let Some(devices) = args.devices.as_ref().filter(|d| !d.is_empty()) {
        return devices[local % devices.len()].clone();
    }
    let explicit = super::given("device");
    if !explicit && candle_core::utils::cuda_is_available() {
        return format!("cuda:{local}");
    }
    args.model.device.clone()
}

/// Ctrl-C, and the SIGTERM a batch system sends before a job's time limit: finish the step,
/// checkpoint, exit 0. A second signal, or a step still running `timeout` after the first
/// (a step that cannot finish), stops the run at once: the run in `dir` is marked paused,
/// its records end at the last checkpoint, and the process exits 130. Ranks other than 0
/// wait a little longer, so that rank 0 stops (and marks the folder) first.
fn stop_on_signal(rank: usize, dir: &Path, timeout: Duration) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let dir = dir.to_path_buf();
    let installed = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            stop_at_once(rank, &dir, "a second signal");
        }
        eprintln!(
            "\nthrong: rank {rank}: stopping after the current step; send the signal again, or \
             wait {} s, to stop at once",
            timeout.as_secs()
        );
        let dir = dir.clone();
        let wait = match rank {
            0 => timeout,
            _ => timeout.saturating_add(Duration::from_secs(10)),
        };
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            let why = format!(
                "the step did not finish within {} s of the signal",
                timeout.as_secs()
            );
            stop_at_once(rank, &dir, &why);
        });
    });
    if let Err(e) = installed {
        eprintln!("throng: warning: cannot catch Ctrl-C/SIGTERM ({e}); a signal will kill the run");
    }
    stop
}

/// Ends the process in the middle of a step, leaving the run in `dir` paused (see
/// [`stop_on_signal`]).
fn stop_at_once(rank: usize, dir: &Path, why: &str) -> ! {
    let resume = format!("throng run --resume {}", dir.display());
    match record::pause_at_once(dir) {
        Ok(m) if m.status == Status::Finished => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the run had finished, but its report \
             was not written: throng report {}",
            dir.display()
        ),
        Ok(_) => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the step in progress is lost, the \
             steps before it are kept (the run is paused at its last checkpoint); resume with: \
             {resume}"
        ),
        Err(e) => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the run could not be marked paused \
             ({e}), but its records end at the last checkpoint; resume with: {resume}"
        ),
    }
    std::process::exit(130);
}

/// `threads`: the global --threads, if given.
pub fn run(args: RunArgs, threads: Option<usize>) -> Result<()> {
    let ranks = Ranks::join(Duration::from_secs(args.rank_timeout.max(1)))?;
    let local = ranks.topology().local_size;
    if threads.is_none() && local > 1 {
        // Ranks sharing a machine share its cores, rather than each starting one thread per
        // core.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads((cores / local).max(1))
            .build_global();
    }
    let result = run_ranked(args, &ranks);
    if let Err(e) = &result
        && ranks.size() > 1
    {
        // Other ranks may be waiting for this one: end the whole job, not this process
        // alone (MPI's finalisation would wait for them).
        eprintln!("throng: rank {}: error: {e:#}", ranks.rank());
        ranks.abort(1);
    }
    result
}

fn run_ranked(args: RunArgs, ranks: &Ranks) -> Result<()> {
    let root = ranks.is_root();
    let model_given = super::given("model");
    let overrides = Overrides {
        policy: args.policy,
        replicates: args.replicates,
        steps: args.steps,
        agents: args.agents.clone(),
        model: model_given.then(|| args.model.model.clone()),
    };
    let memory = super::MemoryCheck {
        processes: ranks.topology().local_size,
        model_on_cpu: device_for(&args, ranks) == "cpu",
        kv_memory: args.model.kv_memory.map(|b| b.as_u64()),
    };
    // Rank 0 alone takes (and locks) the run folder and writes it; the other ranks follow
    // the folder it names (a default one is named by rank 0's clock).
    let opened = match (root, &args.config, &args.resume) {
        (false, ..) => None,
        (true, _, Some(dir)) => Some(open_resumed(dir, &overrides, &memory)?),
        (true, Some(config), None) => {
            Some(open_new(config, args.out.clone(), &overrides, &memory)?)
        }
        (true, None, None) => bail!("give an experiment config, or --resume RUN_DIR"),
    };
    let dir = opened
        .as_ref()
        .map_or_else(PathBuf::new, |(_, folder, _)| folder.dir().to_path_buf());
    let dir = if ranks.size() > 1 {
        // As bytes, not text: the folder's name need not be UTF-8.
        let bytes = ranks.broadcast(dir.as_os_str().as_encoded_bytes().to_vec())?;
        // SAFETY: the bytes are rank 0's `as_encoded_bytes`, and every rank of a job runs the
        // same throng build on the same platform.
        PathBuf::from(unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(bytes) })
    } else {
        dir
    };
    let resume = args.resume.is_some();
    let (mut loaded, _folder, mut manifest) = match opened {
        Some((loaded, folder, manifest)) => (loaded, Some(folder), manifest),
        None => {
            let mut loaded = match (&args.config, resume) {
                (_, true) => scenarios::load(&dir.join(record::CONFIG), &Overrides::default())?,
                (Some(config), false) => scenarios::load(config, &overrides)?,
                (None, false) => bail!("give an experiment config, or --resume RUN_DIR"),
            };
            if resume {
                loaded.resume_from(&dir)?;
            }
            (loaded, None, Manifest::default())
        }
    };
    let exp = loaded.experiment();
    let mut llm = if scenarios::needs_model(exp) {
        let model = ModelArgs {
            model: exp.config.llm.model.clone(),
            device: device_for(&args, ranks),
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
    // Sizes that overflow were refused by the footprint's check; saturating all the same.
    let cells = exp.arms.len().saturating_mul(exp.config.replicates.0);
    let planned: u64 = exp
        .config
        .agents
        .0
        .iter()
        .map(|&n| n.saturating_mul(cells).saturating_mul(exp.config.steps.0) as u64)
        .fold(0, u64::saturating_add);
    let name = exp.config.name.clone();
    let bar = match root {
        true => ProgressBar::new(planned),
        false => ProgressBar::hidden(),
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {human_pos}/{human_len} decisions, {per_sec} [{elapsed_precise}, ETA {eta_precise}] {msg}",
        )
        .expect("invariant: a valid template"),
    );
    let started = Instant::now();
    let mut steps_done = 0u64;
    if root {
        eprintln!(
            "throng: running {name} into {}{}",
            dir.display(),
            match ranks.size() {
                1 => String::new(),
                n => format!(" on {n} ranks"),
            }
        );
    }
    let stop = stop_on_signal(ranks.rank(), &dir, Duration::from_secs(args.stop_timeout));
    let options = RunOptions {
        resume,
        stop_after: args.stop_after,
        stop: Some(stop.clone()),
        ranks: ranks.clone(),
        split: args.split,
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
        Err(e) if !root => return Err(e.into()),
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
    if !root {
        return Ok(());
    }
    if ended == Ended::Paused {
        manifest.status = Status::Paused;
        record::write_json_atomic(&dir.join(record::MANIFEST), &manifest)?;
        // Without --stop-after, only a signal (to this rank or another) pauses a run.
        let why = match stop.load(Ordering::SeqCst) || args.stop_after.is_none() {
            true => "stopped by a signal",
            false => "paused",
        };
        out!(
            "{why} after {steps_done} steps, checkpointed; resume with: throng run --resume {}{}",
            dir.display(),
            match ranks.size() {
                1 => "",
                _ => " (under mpirun or srun, with any number of ranks)",
            }
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
    memory: &super::MemoryCheck,
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
            "cannot resume {}: it stopped before its config was written, so it never ran; start it again with a new --out (or delete the folder)",
            dir.display()
        );
    }
    let mut loaded = scenarios::load(&config, overrides)?;
    memory
        .check(loaded.as_ref())
        .map_err(|e| anyhow::anyhow!("cannot resume {}: {e}", dir.display()))?;
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
    memory: &super::MemoryCheck,
) -> Result<(Box<dyn scenarios::Loaded>, RunFolder, Manifest)> {
    let loaded = scenarios::load(config, overrides)?;
    let exp = loaded.experiment();
    let templates = std::path::absolute(scenarios::templates_dir(exp))?;
    if templates.to_str().is_none() {
        bail!(
            "the templates folder {} has a path that is not valid UTF-8, which the run's \
             config.toml cannot record for --resume: move the templates (or the config) to a \
             folder whose path is text, or point `templates` in {} at one",
            templates.display(),
            config.display()
        );
    }
    memory
        .check(loaded.as_ref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
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
