//! Why a run stopped.

use crate::cluster::ClusterError;
use crate::record::RecordError;
use crate::sim::policy::PolicyError;
use crate::sim::scenario::TableError;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
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
    #[error("scenario `{scenario}`: {source}")]
    Table {
        scenario: String,
        #[source]
        source: TableError,
    },
}

impl SimError {
    /// Scenario `scenario`'s rows that are no table.
    pub(crate) fn table(scenario: impl Into<String>, source: TableError) -> Self {
        SimError::Table {
            scenario: scenario.into(),
            source,
        }
    }

    /// The prompt template the run stopped at (a variable it is not given, a filter that
    /// fails), if that is why it stopped: resuming would render the same template again, so
    /// the fix is in the template, not in `--resume`.
    pub fn template(&self) -> Option<&Path> {
        match self {
            SimError::Policy(PolicyError::Prompt(crate::sim::prompt::PromptError::Template {
                path,
                ..
            })) => Some(path),
            _ => None,
        }
    }
}
