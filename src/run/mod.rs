//! A run of an experiment, from its config (or its folder, to continue it) to its records and
//! report: the application layer of the library, which the command line (`throng run`) and
//! the Python package (`throng.run`) call with typed [`RunOptions`], and which answers with an
//! [`Outcome`] or a [`RunError`], its progress told to an [`Observer`].
//!
//! [`run`] goes through its phases in turn: [`prepare`] checks what can be checked before
//! anything is written; [`open`] takes the run folder (a new one, or the one to continue);
//! [`engines::load`] loads the model and [`engines::attach_reuse`] the decisions of earlier runs;
//! [`steps::run_steps`] runs the steps; [`finish::finish`] records how the run ended and
//! writes its report.

pub mod base_run;
mod engines;
mod error;
pub mod extend;
mod finish;
mod folder;
mod inputs;
mod job;
mod live;
mod memory;
mod observe;
mod options;
mod outcome;
pub mod resume;
mod settings;
mod signals;
mod steps;
pub mod stores;

pub(crate) use error::refuse;
pub use error::{Context, RunError};
pub use live::DEFAULT_ADDR as DEFAULT_LIVE_ADDR;
pub use memory::MemoryCheck;
pub use observe::{Bar, Observer, Quiet};
pub use options::{EngineChoices, RunOptions};
pub use outcome::Outcome;
pub use settings::{
    EngineSettings, ModelSettings, RunModel, default_model, kv_shares, model_of, models_of,
    parse_device,
};

use crate::cluster::Ranks;
use crate::host::Program;
use crate::record::{self, Manifest};
use crate::scenarios::{self, Registry};
use crate::sim::experiment::Overrides;
use job::{Job, Opened};
use options::GivenSettings;
use resume::StartedWith;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs (or continues, or extends) the experiment `options` name over the scenarios of
/// `registry`, telling `observer` how it goes; under `mpirun` or `srun`, as one rank of the
/// job. A run whose steps begin is recorded whatever happens: an error after that is marked
/// in its manifest. A panic out of the scenario's code (a [`crate::sim::scenario::Halt`])
/// marks the run failed, then goes on to the caller.
pub fn run(
    registry: &Registry,
    options: RunOptions,
    observer: &mut dyn Observer,
) -> Result<Outcome, RunError> {
    let ranks = Ranks::join(options.rank_timeout.max(Duration::from_secs(1)))?;
    let local = ranks.topology().local_size;
    if options.threads.is_none() && local > 1 {
        // Ranks sharing a machine share its cores, rather than each starting one thread per
        // core.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads((cores / local).max(1))
            .build_global();
    }
    let result = run_ranked(registry, options, &ranks, observer);
    if let Err(e) = &result
        && ranks.size() > 1
    {
        // Other ranks may be waiting for this one: end the whole job, not this process
        // alone (MPI's finalisation would wait for them).
        eprintln!("throng: rank {}: error: {}", ranks.rank(), e.one_line());
        ranks.abort(1);
    }
    result
}

/// Writes the report of the run in `dir` (never into a folder a run is writing); returns its
/// key numbers as text.
/// `program` is how a refusal names the program to run later.
pub fn report(registry: &Registry, dir: &Path, program: &Program) -> Result<String, RunError> {
    let _lock = record::lock_for_report(dir, program)?;
    Ok(registry.report(dir)?)
}

fn run_ranked(
    registry: &Registry,
    options: RunOptions,
    ranks: &Ranks,
    observer: &mut dyn Observer,
) -> Result<Outcome, RunError> {
    let mut job = Job {
        registry,
        given: GivenSettings::of(&options),
        engine: options.engine.settings(),
        options,
        ranks,
    };
    let prepared = prepare(&mut job)?;
    let mut opened = open(&job, prepared)?;
    let (mut llm, model) = engines::load(&job, &mut opened)?;
    let attached = engines::attach_reuse(&job, &mut opened, llm.as_mut(), &model)?;
    let ran = steps::run_steps(&job, &mut opened, llm.as_mut(), attached.store, observer)?;
    let reuse = attached.reuse.lock().unwrap_or_else(|e| e.into_inner());
    finish::finish(&job, &mut opened, llm.as_ref(), &reuse, ran)
}

/// What [`prepare`] found: how the config is overridden, the memory check, the live page's
/// listener, and the finished run an extension moved aside.
struct Prepared {
    overrides: Overrides,
    memory: MemoryCheck,
    listener: Option<std::net::TcpListener>,
    extension: Option<extend::MovedAside>,
}

/// Checks what can be checked before anything is written or moved: the options against each
/// other, the sources of reused decisions, an extension's plan, the memory the run needs and
/// the live page's port.
fn prepare(job: &mut Job) -> Result<Prepared, RunError> {
    if !job.options.reuse.is_empty() {
        stores::check_sources(&job.options.reuse)?;
    }
    // A finished run given more steps or replicates is made again with them, reusing its
    // decisions (see `extend`).
    let extension = match extend::asked(&job.options) {
        true => Some(extend::plan(
            &mut job.options,
            &mut job.engine,
            job.given,
            job.ranks.size(),
        )?),
        false => None,
    };
    let o = &job.options;
    let overrides = Overrides {
        policy: o.policy,
        replicates: o.replicates,
        steps: o.steps,
        agents: o.agents.clone(),
        model: o.model.clone(),
        default_model: default_model(),
    };
    check_resume(o, job.given)?;
    // A resumed run stays on the kind of device it started on (see `StartedWith`).
    let started_on = match &o.resume {
        Some(dir) => StartedWith::read(dir).ok().and_then(|s| s.device),
        None => None,
    };
    let memory = MemoryCheck {
        processes: job.ranks.topology().local_size,
        model_on_cpu: engines::device_kind(&engines::device_for(job, started_on.as_deref()))
            == "cpu",
        kv_memory: job.engine.kv_memory,
    };
    // The live page's port is taken before anything is written or moved: a busy port refuses
    // the run and leaves nothing behind.
    let listener = match (job.ranks.is_root(), o.serve) {
        (true, Some(addr)) => {
            Some(crate::serve::listen(addr, o.public).context("--serve: the live page's address")?)
        }
        _ => None,
    };
    // An extension is checked as the new run it is while the finished run is in its place,
    // and only then moved aside.
    let extension = match extension {
        Some(plan) => {
            let config = o
                .config
                .as_ref()
                .expect("invariant: an extension has a config");
            folder::check_new(job.registry, config, &overrides, &memory)?;
            Some(plan.move_aside(&mut job.options)?)
        }
        None => None,
    };
    Ok(Prepared {
        overrides,
        memory,
        listener,
        extension,
    })
}

/// Refuses options a resume does not take: it continues the run in its own folder, as it was
/// configured, reading the decision stores it started with.
fn check_resume(o: &RunOptions, given: GivenSettings) -> Result<(), RunError> {
    if let (Some(dir), Some(out)) = (&o.resume, &o.out) {
        refuse!(
            "--resume continues the run in its own folder, {}: drop --out {} (to continue it \
             elsewhere, copy the folder there and resume the copy)",
            dir.display(),
            out.display()
        );
    }
    if o.resume.is_some() {
        resume::refuse_flags(given)?;
        if !o.reuse.is_empty() {
            refuse!(
                "--resume reads the decision stores the run started with (its manifest's `reuse`): drop --reuse"
            );
        }
    }
    Ok(())
}

/// Takes the run folder: rank 0 alone takes (and locks) it and writes it; the other ranks
/// follow the folder it names (a default one is named by rank 0's clock). Serves the live
/// page once the folder is known.
fn open(job: &Job, prepared: Prepared) -> Result<Opened, RunError> {
    let Prepared {
        overrides,
        memory,
        listener,
        extension,
    } = prepared;
    let o = &job.options;
    let opened = match (job.ranks.is_root(), &o.config, &o.resume) {
        (false, ..) => None,
        (true, _, Some(dir)) => Some(folder::open_resumed(
            job.registry,
            dir,
            &overrides,
            &memory,
        )?),
        (true, Some(config), None) => Some(folder::open_new(
            job.registry,
            config,
            o.out.clone(),
            &overrides,
            &memory,
            &o.program,
        )?),
        (true, None, None) => refuse!("give an experiment config, or --resume RUN_DIR"),
    };
    let dir = shared_dir(job.ranks, opened.as_ref().map(|(_, f, _)| f.dir()))?;
    let resume = o.resume.is_some();
    let started = match resume {
        true => Some(StartedWith::read(&dir)?),
        false => None,
    };
    let (loaded, folder, manifest) = match opened {
        Some((loaded, folder, mut manifest)) => {
            if let Some(extension) = &extension {
                manifest.config_file = extension.config_file().to_string();
                let previous = std::path::absolute(extension.previous())?;
                manifest.extends = Some(previous.display().to_string());
            }
            (loaded, Some(folder), manifest)
        }
        None => (follow(job, &overrides, &dir)?, None, Manifest::default()),
    };
    // Until its first step starts, a new run's folder is given up if the start fails (a
    // model that does not load, a store it cannot reuse), so that the same command can be
    // given again once the cause is fixed. A resumed run's folder is its records: kept.
    let (starting, resumed_folder) = match resume {
        true => (folder::Starting(None), folder),
        false => (folder::Starting(folder), None),
    };
    if let Some(listener) = listener {
        live::serve_run(&dir, listener, o.public)?;
    }
    Ok(Opened {
        dir,
        loaded,
        starting,
        resumed_folder,
        kept: None,
        manifest,
        started,
        resume,
        extension,
    })
}

/// The run folder, rank 0's (`dir`) sent to every rank.
fn shared_dir(ranks: &Ranks, dir: Option<&Path>) -> Result<PathBuf, RunError> {
    let dir = dir.map_or_else(PathBuf::new, Path::to_path_buf);
    if ranks.size() == 1 {
        return Ok(dir);
    }
    // As bytes, not text: the folder's name need not be UTF-8.
    let bytes = ranks.broadcast(dir.as_os_str().as_encoded_bytes().to_vec())?;
    // SAFETY: the bytes are rank 0's `as_encoded_bytes`, and every rank of a job runs the
    // same throng build on the same platform.
    Ok(PathBuf::from(unsafe {
        std::ffi::OsString::from_encoded_bytes_unchecked(bytes)
    }))
}

/// The experiment of a rank other than 0, which follows the folder rank 0 took.
fn follow(
    job: &Job,
    overrides: &Overrides,
    dir: &Path,
) -> Result<Box<dyn scenarios::Loaded>, RunError> {
    let resume = job.options.resume.is_some();
    let mut loaded = match (&job.options.config, resume) {
        (_, true) => job.registry.load(
            &dir.join(record::CONFIG),
            &Overrides {
                default_model: default_model(),
                ..Overrides::default()
            },
        )?,
        (Some(config), false) => job.registry.load(config, overrides)?,
        (None, false) => refuse!("give an experiment config, or --resume RUN_DIR"),
    };
    if resume {
        loaded.resume_from(dir)?;
    }
    Ok(loaded)
}
