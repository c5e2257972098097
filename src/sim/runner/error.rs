//! Why a run stopped.

use crate::cluster::ClusterError;
use crate::record::RecordError;
use crate::sim::policy::PolicyError;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("{0}")]
    Resume(String),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("rank {rank}: {message}")]
    Rank { rank: usize, message: String },
}

impl RunError {
    /// The prompt template the run stopped at (a variable it is not given, a filter that
    /// fails), if that is why it stopped: resuming would render the same template again, so
    /// the fix is in the template, not in `--resume`.
    pub fn template(&self) -> Option<&Path> {
        match self {
            RunError::Policy(PolicyError::Prompt(crate::sim::prompt::PromptError::Template {
                path,
                ..
            })) => Some(path),
            _ => None,
        }
    }
}
