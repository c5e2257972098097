//! `throng run CONFIG` and `throng run --resume RUN_DIR`: an experiment from config to
//! records, then its report.

use super::ModelArgs;
use crate::cluster::Ranks;
use crate::record::{self, Manifest, RunFolder, Status};
use crate::scenarios;
use crate::scenarios::Registry;
use crate::sim::config::{PolicyKind, Split};
use crate::sim::experiment::{Experiment, Overrides};
use crate::sim::policy::Llm;
use crate::sim::runner::{Ended, Progress, RunOptions};
use crate::sim::scenario::Halt;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
    #[arg(long, value_parser = super::choice::PolicyArg::parser())]
    pub policy: Option<PolicyKind>,
    #[arg(long, allow_negative_numbers = true)]
    pub replicates: Option<i64>,
    #[arg(long, allow_negative_numbers = true)]
    pub steps: Option<i64>,
    /// Population sizes, e.g. `20,100`.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub agents: Option<Vec<i64>>,
    /// Take every decision whose complete input (model, weights format, device class,
    /// prompt tokens, schema, sampling, seed) this earlier run recorded from its decision
    /// store instead of the model; repeat it to search several runs in turn.
    #[arg(long, value_name = "RUN_DIR")]
    pub reuse: Vec<PathBuf>,
    /// Skip the report at the end.
    #[arg(long)]
    pub no_report: bool,
    /// Stop after N steps, leaving the run resumable with --resume (for batch-job time limits).
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// How the ranks of an MPI job share the run (default: the config's `split`, else auto:
    /// cells when they deal out evenly, else agents). Records are the same either way.
    #[arg(long, value_parser = super::choice::SplitArg::parser())]
    pub split: Option<Split>,
    /// Devices of this machine's ranks, one per local rank (e.g. `cuda:0,cuda:2`); the
    /// default is `cuda:LOCAL_RANK` in a CUDA build, else --device.
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<String>>,
    /// Seconds a rank waits for another at the end of a step before stopping the whole job.
    #[arg(long, default_value_t = crate::cluster::DEFAULT_TIMEOUT.as_secs())]
    pub rank_timeout: u64,
    /// Seconds a first Ctrl-C or SIGTERM waits for the current step to finish; a step still
    /// running then (or a second signal) stops the run at once, paused at its last checkpoint.
    #[arg(long, default_value_t = 300)]
    pub stop_timeout: u64,
    /// Serve this run's live page at ADDR (default 127.0.0.1:8787) while it runs.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = super::serve::DEFAULT_ADDR)]
    pub serve: Option<std::net::SocketAddr>,
    /// With --serve: allow an address other machines can reach (controls still need the token).
    #[arg(long, requires = "serve")]
    pub public: bool,
    /// Where and how to load the model (for the `llm` policy); --model overrides the config's.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The kind of a device spec: `cpu` or `cuda`. Devices of one kind compute the same bits
/// (the same kernels on the same model of GPU); a CPU and a GPU do not.
fn device_kind(spec: &str) -> &str {
    spec.split(':').next().unwrap_or(spec)
}

/// The device this rank takes: its entry of --devices, else an explicit --device, else
/// `cuda:LOCAL_RANK` in a CUDA build, else the CPU. A resumed run (`started_on`: the device
/// its manifest names) stays on its kind of device.
fn device_for(args: &RunArgs, ranks: &Ranks, started_on: Option<&str>) -> String {
    let local = ranks.topology().local_rank;
    if let Some(devices) = args.devices.as_ref().filter(|d| !d.is_empty()) {
        return devices[local % devices.len()].clone();
    }
    let explicit = super::given("device");
    let gpu = match started_on {
        Some(device) => device_kind(device) == "cuda",
        None => candle_core::utils::cuda_is_available(),
    };
    if !explicit && gpu {
        return format!("cuda:{local}");
    }
    if !explicit && let Some(device) = started_on {
        return device.to_string();
    }
    args.model.engine.device.clone()
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
    let resume = crate::host::resume_command(dir);
    match record::pause_at_once(dir) {
        Ok(m) if m.status == Status::Finished => eprintln!(
            "\nthrong: rank {rank}: stopped at once ({why}); the run had finished, but its report \
             was not written: {}",
            crate::host::report_command(dir)
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

/// A new run's folder while the run starts: given up when dropped before [`Starting::started`]
/// (see [`RunFolder::abandon`]).
struct Starting(Option<RunFolder>);

impl Starting {
    /// The folder, kept from now on.
    fn started(mut self) -> Option<RunFolder> {
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

/// Ends a run that a panic stopped: a [`Halt`] from the scenario's code, or a bug's. Rank 0
/// marks the run failed in its manifest with the panic's message (paused, resumable, after a
/// Ctrl-C that landed in the scenario's code), so that the manifest does not say `running`;
/// then the panic goes on to whoever called the run, a [`Halt`] with the run's folder set.
fn halted(root: bool, dir: &Path, mut payload: Box<dyn std::any::Any + Send>) -> ! {
    let (message, interrupted) = if let Some(halt) = payload.downcast_mut::<Halt>() {
        halt.dir = Some(dir.to_path_buf());
        (halt.message.clone(), halt.interrupted)
    } else {
        let what = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        (
            format!("throng failed inside the run ({what}); please report this"),
            false,
        )
    };
    if root {
        let path = dir.join(record::MANIFEST);
        let marked = record::read_json::<Manifest>(&path).and_then(|mut manifest| {
            if interrupted {
                manifest.status = Status::Paused;
            } else {
                manifest.status = Status::Failed;
                manifest.error = Some(message);
            }
            record::write_json_atomic(&path, &manifest)
        });
        if let Err(e) = marked {
            eprintln!(
                "throng: warning: the stopped run could not be marked so in its manifest: {e}"
            );
        }
    }
    std::panic::resume_unwind(payload)
}

/// Who watches for Ctrl-C and SIGTERM during a run.
pub enum Signals<'a> {
    /// The run catches them itself, as the command does (see [`stop_on_signal`]).
    Catch,
    /// The program embedding throng watches them (the Python package: its interpreter owns
    /// the signal handlers): the run calls this often on its own thread, and a `true` stops
    /// it after the current step, paused and resumable.
    Watch(&'a mut dyn FnMut() -> bool),
}

/// Where a run was written, and how it ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub dir: PathBuf,
    pub ended: Ended,
}

/// `threads`: the global --threads, if given.
pub fn run(registry: &Registry, args: RunArgs, threads: Option<usize>) -> Result<()> {
    run_with(registry, args, threads, Signals::Catch).map(|_| ())
}

/// As [`run`], saying where the run went and how it ended, with signals watched as `signals`
/// says.
pub fn run_with(
    registry: &Registry,
    args: RunArgs,
    threads: Option<usize>,
    signals: Signals<'_>,
) -> Result<Outcome> {
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
    let result = run_ranked(registry, args, &ranks, signals);
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

fn run_ranked(
    registry: &Registry,
    mut args: RunArgs,
    ranks: &Ranks,
    mut signals: Signals<'_>,
) -> Result<Outcome> {
    if !args.reuse.is_empty() {
        super::reuse::check_sources(&args.reuse)?;
    }
    // A finished run given more steps or replicates is made again with them, reusing its
    // decisions (see `super::extend`).
    let extension = match super::extend::asked(&args) {
        true => Some(super::extend::plan(&mut args, ranks.size())?),
        false => None,
    };
    let root = ranks.is_root();
    let model_given = super::given("model");
    let overrides = Overrides {
        policy: args.policy,
        replicates: args.replicates,
        steps: args.steps,
        agents: args.agents.clone(),
        model: model_given.then(|| args.model.model.clone()),
        default_model: super::default_model(),
    };
    if let (Some(dir), Some(out)) = (&args.resume, &args.out) {
        bail!(
            "--resume continues the run in its own folder, {}: drop --out {} (to continue it \
             elsewhere, copy the folder there and resume the copy)",
            dir.display(),
            out.display()
        );
    }
    if args.resume.is_some() {
        super::resume::refuse_flags()?;
        if !args.reuse.is_empty() {
            bail!(
                "--resume reads the decision stores the run started with (its manifest's `reuse`): drop --reuse"
            );
        }
    }
    // A resumed run stays on the kind of device it started on (see `StartedWith`).
    let started_on = match &args.resume {
        Some(dir) => super::resume::StartedWith::read(dir)
            .ok()
            .and_then(|s| s.device),
        None => None,
    };
    let memory = super::MemoryCheck {
        processes: ranks.topology().local_size,
        model_on_cpu: device_kind(&device_for(&args, ranks, started_on.as_deref())) == "cpu",
        kv_memory: args.model.engine.kv_memory.map(|b| b.as_u64()),
    };
    // An extension is checked as the new run it is while the finished run is in its place,
    // and only then moved aside.
    // The live page's port is taken before anything is written or moved: a busy port refuses
    // the run and leaves nothing behind.
    let listener = match (root, args.serve) {
        (true, Some(addr)) => Some(
            crate::serve::listen(addr, args.public).context("--serve: the live page's address")?,
        ),
        _ => None,
    };
    let mut extension = match extension {
        Some(plan) => {
            let config = args
                .config
                .as_ref()
                .expect("invariant: an extension has a config");
            check_new(registry, config, &overrides, &memory)?;
            Some(plan.move_aside(&mut args)?)
        }
        None => None,
    };
    // Rank 0 alone takes (and locks) the run folder and writes it; the other ranks follow
    // the folder it names (a default one is named by rank 0's clock).
    let opened = match (root, &args.config, &args.resume) {
        (false, ..) => None,
        (true, _, Some(dir)) => Some(open_resumed(registry, dir, &overrides, &memory)?),
        (true, Some(config), None) => Some(open_new(
            registry,
            config,
            args.out.clone(),
            &overrides,
            &memory,
        )?),
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
    let started = match resume {
        true => Some(super::resume::StartedWith::read(&dir)?),
        false => None,
    };
    let (mut loaded, folder, mut manifest) = match opened {
        Some((loaded, folder, mut manifest)) => {
            if let Some(extension) = &extension {
                manifest.config_file = extension.config_file().to_string();
                let previous = std::path::absolute(extension.previous())?;
                manifest.extends = Some(previous.display().to_string());
            }
            (loaded, Some(folder), manifest)
        }
        None => {
            let mut loaded = match (&args.config, resume) {
                (_, true) => registry.load(
                    &dir.join(record::CONFIG),
                    &Overrides {
                        default_model: super::default_model(),
                        ..Overrides::default()
                    },
                )?,
                (Some(config), false) => registry.load(config, &overrides)?,
                (None, false) => bail!("give an experiment config, or --resume RUN_DIR"),
            };
            if resume {
                loaded.resume_from(&dir)?;
            }
            (loaded, None, Manifest::default())
        }
    };
    // Until its first step starts, a new run's folder is given up if the start fails (a
    // model that does not load, a store it cannot reuse), so that the same command can be
    // given again once the cause is fixed. A resumed run's folder is its records: kept.
    let (starting, resumed_folder) = match resume {
        true => (Starting(None), folder),
        false => (Starting(folder), None),
    };
    if let Some(listener) = listener {
        super::serve::serve_run(&dir, listener, args.public)?;
    }
    let exp = loaded.experiment();
    // The model settings the run loads with, recorded in its manifest.
    let mut model_args = args.model.clone();
    let mut llm = if scenarios::needs_model(exp) {
        let started_on = started.as_ref().and_then(|s| s.device.as_deref());
        let device = device_for(&args, ranks, started_on);
        if let Some(was) = started_on
            && device_kind(was) != device_kind(&device)
        {
            bail!(
                "--resume continues a run on the kind of device it started on ({was}): a {} \
                 computes other bits than a {}, so the resumed steps would not be the run's; \
                 drop --device/--devices, or start a new run on {device}",
                device_kind(&device),
                device_kind(was)
            );
        }
        let weights = match started.as_ref().and_then(|s| s.weights) {
            Some(w) => w,
            None if resume => {
                eprintln!(
                    "throng: warning: this run's manifest does not say which weight format it \
                     started with (it predates the record); resuming with --weights {}",
                    crate::quality::name(args.model.engine.weights)
                );
                args.model.engine.weights
            }
            None => args.model.engine.weights,
        };
        let names = super::models_of(exp)?;
        let mut model = ModelArgs {
            model: names
                .first()
                .cloned()
                .unwrap_or_else(|| super::model_of(exp)),
            engine: super::EngineArgs {
                device,
                weights,
                ..args.model.engine.clone()
            },
        };
        if let Some(started) = &started {
            started.apply(&mut model, &dir)?;
        }
        model_args = model.clone();
        if model_given && !names.contains(&args.model.model) {
            eprintln!(
                "throng: warning: --model {} sets the config's default model ([llm] model), \
                 which no agent asks: every arm or policy group of the run names its own ({})",
                args.model.model,
                names.join(", ")
            );
        }
        manifest.device = Some(model.engine.device.clone());
        manifest.weight_format = Some(crate::quality::name(weights));
        let prompts = registry.prompts(exp)?;
        let split = args.split.unwrap_or(exp.config.split);
        if names.len() > 1 {
            // Every model, loaded once; each agent's requests go to its model's engine. Split
            // by models, a rank loads only its own models, and its KV memory is theirs.
            let all: Vec<(String, u64)> = crate::sim::runner::model_agents(exp)
                .into_iter()
                .zip(&names)
                .map(|((_, agents), name)| (name.clone(), agents))
                .collect();
            let agents: Vec<u64> = all.iter().map(|(_, n)| *n).collect();
            let ranks_of = crate::sim::runner::model_ranks(&agents, ranks.size());
            let mine: Vec<(String, u64)> = all
                .iter()
                .zip(&ranks_of)
                .filter(|(_, own)| split != Split::Models || own.contains(&ranks.rank()))
                .map(|(m, _)| m.clone())
                .collect();
            let engines = model.load_engines(exp, &mine)?;
            manifest.model = Some(engines[0].name.clone());
            manifest.weights = Some(engines[0].weights.clone());
            // Models loaded by other ranks are listed without what only their rank knows.
            manifest.models = all
                .iter()
                .map(
                    |(name, agents)| match engines.iter().find(|m| &m.name == name) {
                        Some(m) => record::ModelRecord {
                            name: m.name.clone(),
                            weights: Some(m.weights.clone()),
                            agents: m.agents,
                            kv_bytes: Some(m.kv_bytes),
                        },
                        None => record::ModelRecord {
                            name: name.clone(),
                            weights: None,
                            agents: *agents,
                            kv_bytes: None,
                        },
                    },
                )
                .collect();
            Some(Llm::with_models(
                engines
                    .into_iter()
                    .map(|m| (Some(m.name), m.engine))
                    .collect(),
                prompts,
                exp.config.history,
                exp.config.llm.wave,
            ))
        } else {
            let (engine, described) = model.load_engine_described()?;
            manifest.model = Some(model.model.clone());
            manifest.weights = Some(described);
            manifest.models.clear();
            Some(Llm::new(
                engine,
                prompts,
                exp.config.history,
                exp.config.llm.wave,
            ))
        }
    } else {
        None
    };
    // Earlier runs' decisions, and this run's kept for later ones (see `super::reuse`).
    let mut store = None;
    if let Some(llm) = llm.as_mut() {
        let sources: Vec<PathBuf> = match resume {
            true => record::read_json::<Manifest>(&dir.join(record::MANIFEST))?
                .reuse
                .map(|r| r.sources.into_iter().map(PathBuf::from).collect())
                .unwrap_or_default(),
            false => {
                let mut sources: Vec<PathBuf> = args
                    .reuse
                    .iter()
                    .map(std::path::absolute)
                    .collect::<Result<_, _>>()?;
                // A counterfactual reads its base's decisions, searched last.
                if let Some(cf) = &exp.config.counterfactual {
                    let base = std::path::absolute(&cf.get_ref().base)?;
                    if !sources.contains(&base) {
                        sources.push(base);
                    }
                }
                sources
            }
        };
        let default_name = manifest.model.clone().unwrap_or_default();
        let engines: Vec<(String, &crate::engine::Engine)> = llm
            .engines()
            .map(|(name, e)| (name.map_or_else(|| default_name.clone(), str::to_string), e))
            .collect();
        match &started {
            Some(started) => started.check_models(&dir, &engines)?,
            None => manifest.engine = Some(super::resume::engine_record(&model_args, &engines)?),
        }
        let reuse = super::reuse::open(&sources, &engines)?;
        // Rank 0 keeps every rank's replies.
        if root {
            store = Some(super::reuse::store(&dir, &engines)?);
        }
        drop(engines);
        if !sources.is_empty() {
            let (reused, saved_seconds) = manifest
                .reuse
                .as_ref()
                .map_or((0, 0.0), |r| (r.reused, r.saved_seconds));
            manifest.reuse = Some(record::ReuseRecord {
                sources: sources.iter().map(|d| d.display().to_string()).collect(),
                reused,
                saved_seconds,
            });
            if root {
                record::write_json_atomic(&dir.join(record::MANIFEST), &manifest)?;
            }
        }
        llm.set_reuse(reuse);
    }
    let reuse_record = |llm: &Option<Llm>| {
        let reuse = llm.as_ref()?.reuse()?;
        // A run that read no earlier run has nothing to say of reuse.
        reuse.source_dirs().next()?;
        Some(super::reuse::record(reuse, &dir))
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
    let stop = match signals {
        Signals::Catch => {
            stop_on_signal(ranks.rank(), &dir, Duration::from_secs(args.stop_timeout))
        }
        Signals::Watch(_) => Arc::new(AtomicBool::new(false)),
    };
    // From here the run writes records: its folder is kept whatever happens.
    let _folder = starting.started().or(resumed_folder);
    if let Some(extension) = &mut extension {
        extension.started();
    }
    let options = RunOptions {
        resume,
        stop_after: args.stop_after,
        stop: Some(stop.clone()),
        ranks: ranks.clone(),
        split: args.split,
        store,
    };
    // A panic out of the scenario's code (a Python class's exception, see `Halt`) marks the
    // run failed, then goes on to the caller.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        loaded.run(llm.as_mut(), &dir, &mut manifest, &options, &mut |p| {
            if let Signals::Watch(stop_asked) = &mut signals
                && !stop.load(Ordering::SeqCst)
                && stop_asked()
            {
                stop.store(true, Ordering::SeqCst);
                bar.println("throng: stopping after the current step");
            }
            match p {
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
            }
        })
    }));
    let ended = match ran {
        Ok(ended) => ended,
        Err(payload) => {
            bar.abandon();
            halted(root, &dir, payload)
        }
    };
    let ended = match ended {
        Ok(ended) => ended,
        Err(e) if !root => return Err(e.into()),
        Err(e) => {
            bar.abandon();
            manifest.status = Status::Failed;
            manifest.error = Some(e.to_string());
            let _ = record::write_json_atomic(&dir.join(record::MANIFEST), &manifest);
            let advice = match e.template() {
                // --resume would render the same template again: the fix is in the template.
                Some(template) => format!(
                    "the run stopped at a prompt template, which --resume would render again as it is: \
                     fix {} where it is (the run reads its templates from there) and start a new run: \
                     throng run {}; {}",
                    template.display(),
                    // A template of the run folder's own copies is read through its config.
                    match manifest.config_file.as_str() {
                        _ if template.starts_with(&dir) =>
                            format!("{} --out NEW_FOLDER", dir.join(record::CONFIG).display()),
                        "" => dir.join(record::CONFIG).display().to_string(),
                        file => file.to_string(),
                    },
                    match manifest.steps_done {
                        0 => format!("{} has no finished step, delete it", dir.display()),
                        n => format!(
                            "{} keeps the {n} step{} finished before it, made with the template as it was",
                            dir.display(),
                            if n == 1 { "" } else { "s" }
                        ),
                    }
                ),
                None if manifest.steps_done == 0 => format!(
                    "the run stopped before it finished a step; once the cause is fixed, {} \
                     starts it from the beginning",
                    crate::host::resume_command(&dir)
                ),
                None => format!(
                    "the run stopped; its {} finished step{} kept: {}",
                    manifest.steps_done,
                    if manifest.steps_done == 1 {
                        " is"
                    } else {
                        "s are"
                    },
                    crate::host::resume_command(&dir)
                ),
            };
            return Err(e).context(advice);
        }
    };
    bar.finish();
    let outcome = Outcome {
        dir: dir.clone(),
        ended,
    };
    if !root {
        return Ok(outcome);
    }
    if let Some(reuse) = llm.as_ref().and_then(Llm::reuse) {
        for warning in reuse.warnings() {
            eprintln!("throng: warning: --reuse {warning}");
        }
    }
    manifest.reuse = reuse_record(&llm);
    if let Some(r) = &manifest.reuse {
        eprintln!(
            "throng: reused {} of {} decisions from {} (about {:.1} s of model time saved)",
            r.reused,
            manifest.counters.decisions,
            r.sources.join(", "),
            r.saved_seconds
        );
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
            "{why} after {steps_done} steps, checkpointed; resume with: {}{}",
            crate::host::resume_command(&dir),
            match ranks.size() {
                1 => "",
                _ => " (under mpirun or srun, with any number of ranks)",
            }
        )?;
        return Ok(outcome);
    }
    manifest.status = Status::Finished;
    manifest.finished_unix = Some(record::now_unix());
    manifest.peak_rss_bytes = record::peak_rss_bytes();
    if let Some(llm) = &llm {
        // Over every model's engine: hits over queries, preemptions summed.
        let (mut hit, mut queried, mut preemptions) = (0u64, 0u64, 0u64);
        for (name, engine) in llm.engines() {
            let t = engine.totals();
            hit += t.cache.hit_tokens;
            queried += t.cache.queried_tokens;
            preemptions += t.preemptions;
            if let Some(name) = name {
                eprintln!("throng: model {name}:");
            }
            eprintln!(
                "{}",
                super::generate::summary(
                    engine,
                    manifest.counters.decisions as usize,
                    started.elapsed()
                )
            );
        }
        manifest.prefix_hit_rate = Some(hit as f64 / queried.max(1) as f64);
        manifest.preemptions = Some(preemptions);
    }
    record::write_json_atomic(&dir.join(record::MANIFEST), &manifest)?;
    if manifest.status == Status::Finished {
        // An extension that finished, in this process or in a resume of it, holds every
        // record and decision of the run as it was.
        super::extend::finished(&dir, &manifest);
    }
    if !args.no_report {
        let text = registry.report(&dir).context("writing the report")?;
        out!("{}", text.trim_end())?;
        out!("report: {}", dir.join("report.html").display())?;
    } else {
        out!("run: {}", dir.display())?;
    }
    Ok(outcome)
}

/// Takes the run folder `dir` to continue it: checks it, its manifest, its inputs and its
/// checkpoint before anything heavy (the model) is loaded.
fn open_resumed(
    registry: &Registry,
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
        bail!("{}", missing_config(dir, &manifest));
    }
    check_inputs(dir, &manifest)?;
    let mut loaded = registry.load(&config, overrides)?;
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

/// Refuses to resume a run whose config or templates changed since it started (see
/// [`record::inputs`]), naming each change and the two ways on.
fn check_inputs(dir: &Path, manifest: &Manifest) -> Result<()> {
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
    bail!(
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
fn check_new(
    registry: &Registry,
    config: &Path,
    overrides: &Overrides,
    memory: &super::MemoryCheck,
) -> Result<Box<dyn scenarios::Loaded>> {
    let loaded = registry.load(config, overrides)?;
    memory
        .check(loaded.as_ref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
    if scenarios::needs_model(loaded.experiment()) {
        super::models_of(loaded.experiment())?;
    }
    Ok(loaded)
}

/// Takes a new or empty folder for a new run of `config`: the manifest first, so that the
/// folder is a recognisable run from its first moment, then the config as run.
fn open_new(
    registry: &Registry,
    config: &Path,
    out: Option<PathBuf>,
    overrides: &Overrides,
    memory: &super::MemoryCheck,
) -> Result<(Box<dyn scenarios::Loaded>, RunFolder, Manifest)> {
    let loaded = check_new(registry, config, overrides, memory)?;
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
    let dir = out.unwrap_or_else(|| crate::sim::runner::default_run_dir(&exp.config.name));
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
        counterfactual: super::counterfactual::base_of(exp)?,
        ..Manifest::default()
    };
    let inputs = Inputs::of(registry, exp)?;
    let manifest = Manifest {
        inputs: inputs.fingerprints(),
        ..manifest
    };
    let folder = RunFolder::create(&dir, &manifest)?;
    let written = record::full_disk_at("config", &dir.join(record::CONFIG))
        .map_err(anyhow::Error::from)
        .and_then(|()| inputs.write(&dir));
    if let Err(e) = written {
        // Nothing has run: leave the place as it was, so that the same --out works again.
        folder.abandon();
        return Err(e.context(format!(
            "cannot start the run in {}: its config could not be written (the folder is left as it was)",
            dir.display()
        )));
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

/// What a new run reads, resolved before its folder is written: `config.toml`, the experiment
/// as run (command-line overrides applied), so that `--resume` and readers need nothing else;
/// and a copy of every prompt template, which `config.toml` points at (under `inputs/`), so
/// that a resume runs the templates the run started with, whatever happens to the originals.
struct Inputs {
    /// `config.toml`'s text.
    config: String,
    /// The config file as written, before overrides.
    original: String,
    /// Each template's path in the folder and its text.
    templates: Vec<(String, String)>,
}

impl Inputs {
    fn of(registry: &Registry, exp: &Experiment) -> Result<Self> {
        let folder = Path::new(record::inputs::INPUTS).join("templates");
        let templates = registry
            .prompts(exp)?
            .templates()
            .map(|(name, text)| {
                let path = folder.join(format!("{name}.jinja"));
                (path.display().to_string(), text.to_string())
            })
            .collect();
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
        table.insert(
            "templates".into(),
            toml::Value::String(folder.display().to_string()),
        );
        let llm = table
            .entry("llm")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(llm) = llm {
            llm.insert("model".into(), toml::Value::String(super::model_of(exp)));
        }
        Ok(Self {
            config: toml::to_string_pretty(&table)?,
            original: exp.source.text.clone(),
            templates,
        })
    }

    /// The sha256 of each file the run reads, as the manifest keeps them.
    fn fingerprints(&self) -> BTreeMap<String, String> {
        std::iter::once((record::CONFIG.to_string(), &self.config))
            .chain(
                self.templates
                    .iter()
                    .map(|(path, text)| (path.clone(), text)),
            )
            .map(|(path, text)| (path, record::inputs::fingerprint(text.as_bytes())))
            .collect()
    }

    /// Writes the copies first and `config.toml` last, so that a folder with a `config.toml`
    /// holds every input.
    fn write(&self, dir: &Path) -> Result<()> {
        let write = |file: &str, text: &str| -> Result<()> {
            let path = dir.join(file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", parent.display()))?;
            }
            std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
        };
        for (path, text) in &self.templates {
            write(path, text)?;
        }
        write(record::inputs::STARTED_CONFIG, &self.config)?;
        write(record::CONFIG_ORIGINAL, &self.original)?;
        write(record::CONFIG, &self.config)
    }
}

/// `throng report RUN_DIR`: never into a folder a run is writing.
pub fn report(registry: &Registry, dir: PathBuf) -> Result<()> {
    let _lock = record::lock_for_report(&dir)?;
    let text = registry.report(&dir)?;
    out!("{}", text.trim_end())?;
    out!("report: {}", dir.join("report.html").display())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run folder holding a manifest that says `running`.
    fn running() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let manifest = Manifest {
            status: Status::Running,
            steps_done: 3,
            ..Manifest::default()
        };
        record::write_json_atomic(&dir.path().join(record::MANIFEST), &manifest).unwrap();
        dir
    }

    fn halt(interrupted: bool) -> Box<dyn std::any::Any + Send> {
        Box::new(Halt {
            message: "the scenario's `resolve` raised KeyError: 'pot'".into(),
            interrupted,
            detail: Box::new(42u32),
            dir: None,
        })
    }

    // Guards against a run stopped by its scenario's exception left `running` with no word of
    // why, and against the embedding program losing its exception or the run's folder.
    #[test]
    fn a_halted_run_is_marked_failed_and_the_halt_goes_on_with_its_folder() {
        let dir = running();
        let payload = std::panic::catch_unwind(|| halted(true, dir.path(), halt(false)))
            .expect_err("halted unwinds");
        let halt = payload
            .downcast::<Halt>()
            .expect("the same payload goes on");
        assert_eq!(halt.dir.as_deref(), Some(dir.path()));
        assert_eq!(*halt.detail.downcast::<u32>().unwrap(), 42);
        let manifest: Manifest = record::read_json(&dir.path().join(record::MANIFEST)).unwrap();
        assert_eq!(manifest.status, Status::Failed);
        assert_eq!(manifest.steps_done, 3);
        assert!(manifest.error.unwrap().contains("raised KeyError: 'pot'"));
    }

    // Guards against a Ctrl-C in the scenario's code leaving the run `running` (or calling it
    // failed): it resumes from its last checkpoint like any paused run.
    #[test]
    fn a_run_halted_by_a_ctrl_c_is_marked_paused() {
        let dir = running();
        let _ = std::panic::catch_unwind(|| halted(true, dir.path(), halt(true)));
        let manifest: Manifest = record::read_json(&dir.path().join(record::MANIFEST)).unwrap();
        assert_eq!((manifest.status, manifest.error), (Status::Paused, None));
    }

    // Guards against a bug's panic in a run leaving its manifest `running`.
    #[test]
    fn a_run_stopped_by_a_panic_is_marked_failed_with_its_message() {
        let dir = running();
        let payload: Box<dyn std::any::Any + Send> = Box::new(String::from("index out of bounds"));
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            halted(true, dir.path(), payload)
        }));
        let manifest: Manifest = record::read_json(&dir.path().join(record::MANIFEST)).unwrap();
        assert_eq!(manifest.status, Status::Failed);
        assert!(manifest.error.unwrap().contains("index out of bounds"));
    }
}
