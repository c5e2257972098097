//! `throng run CONFIG` and `throng run --resume RUN_DIR`: the flags become the library's
//! [`RunOptions`], [`crate::run::run`] runs them, and what it says at the end is printed.

use super::{GivenArgs, ModelArgs};
use crate::host::Program;
use crate::run::{Bar, EngineChoices, RunOptions};
use crate::scenarios::Registry;
use crate::sim::config::{PolicyKind, Split};
use anyhow::Result;
use std::path::PathBuf;
use std::time::Duration;

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

impl RunArgs {
    /// The library's options these flags give; `threads`: the global --threads, if given.
    /// A setting with a default counts as given only when its flag was on the command line
    /// (a resumed or extended run takes the others from its manifest).
    pub fn options(
        self,
        threads: Option<usize>,
        given: &GivenArgs,
        program: Program,
    ) -> RunOptions {
        let engine = &self.model.engine;
        RunOptions {
            config: self.config,
            resume: self.resume,
            out: self.out,
            policy: self.policy,
            replicates: self.replicates,
            steps: self.steps,
            agents: self.agents,
            model: given.has("model").then(|| self.model.model.clone()),
            engine: EngineChoices {
                device: given.has("device").then(|| engine.device.clone()),
                weights: given.has("weights").then_some(engine.weights),
                tokenizer: engine.tokenizer.clone(),
                kv_memory: engine.kv_memory.map(|b| b.as_u64()),
                kv_format: given.has("kv_format").then_some(engine.kv_format),
                max_batch_tokens: engine.max_batch_tokens,
                max_seqs: Some(engine.max_seqs),
                prefix_caching: Some(!engine.no_prefix_cache),
                kv_policy: Some(engine.kv_policy),
            },
            reuse: self.reuse,
            report: !self.no_report,
            stop_after: self.stop_after,
            split: self.split,
            devices: self.devices,
            rank_timeout: Duration::from_secs(self.rank_timeout),
            stop_timeout: Duration::from_secs(self.stop_timeout),
            serve: self.serve,
            public: self.public,
            threads,
            catch_signals: true,
            // The command line is where a test asks a run to crash (tests/faults.rs).
            faults: crate::sim::runner::Faults::from_env(),
            program,
        }
    }
}

/// `threads`: the global --threads, if given.
pub fn run(
    registry: &Registry,
    args: RunArgs,
    threads: Option<usize>,
    given: &GivenArgs,
    program: Program,
) -> Result<()> {
    let options = args.options(threads, given, program);
    let outcome = crate::run::run(registry, options, &mut Bar::default())?;
    for line in outcome.lines() {
        out!("{line}")?;
    }
    Ok(())
}

/// `throng report RUN_DIR`.
pub fn report(registry: &Registry, dir: PathBuf, program: &Program) -> Result<()> {
    let text = crate::run::report(registry, &dir, program)?;
    out!("{}", text.trim_end())?;
    out!("report: {}", dir.join("report.html").display())?;
    Ok(())
}
