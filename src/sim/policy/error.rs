//! What can go wrong while agents decide.

use crate::engine::RequestError;
use crate::sim::prompt::PromptError;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("cannot restore the policy from the checkpoint: {0}")]
    Checkpoint(String),
    #[error("the engine: {0}")]
    Engine(#[from] RequestError),
    #[error(
        "no engine here serves model `{0}`: load every model the config names (a rank loads \
         those of its agents)"
    )]
    NoModel(String),
    #[error("the decision store: {0}")]
    Store(#[from] crate::record::RecordError),
    /// A scripted decision the scenario's check refuses (see
    /// [`crate::sim::scenario::Scenario::check_scripted`]); `step` is 1-based, as the progress shows it.
    #[error(
        "the scripted decision of agent {agent} at step {step} (arm `{arm}`, replicate \
         {replicate}) is not one the turn allows: {problem}; fix the scenario's `scripted`"
    )]
    Scripted {
        agent: usize,
        step: usize,
        arm: String,
        replicate: usize,
        problem: crate::sim::scenario::DecisionProblem,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}
