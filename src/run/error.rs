//! Why a run could not start, or stopped: each message names the problem and the fix. Each
//! part of throng whose error a run meets has its own variant, kept whole with its causes,
//! so that a caller can tell a bad config from a failed model by matching (the Python package
//! raises `ConfigError` or `ModelError` by it, [`RunError::part`]).

use crate::analysis::ReportError;
use crate::cluster::ClusterError;
use crate::engine::EngineError;
use crate::model::ModelError;
use crate::record::{FolderError, RecordError};
use crate::serve::ServeError;
use crate::sim::config::ConfigError;
use crate::sim::footprint::SizeError;
use crate::sim::runner::SimError;
use std::fmt::Display;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The options, the config or the run folder refuse the run, or what it asks cannot be
    /// done: the message says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Boxed, as the engine's is: the two are the largest, and every run function returns this.
    #[error(transparent)]
    Model(Box<ModelError>),
    #[error(transparent)]
    Engine(Box<EngineError>),
    /// A device that cannot be opened.
    #[error(transparent)]
    Device(#[from] candle_core::Error),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Folder(#[from] FolderError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A run folder's TOML or JSON that does not read or write.
    #[error(transparent)]
    TomlRead(#[from] toml::de::Error),
    #[error(transparent)]
    TomlWrite(#[from] toml::ser::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// What failed, in the run's words, over the error that made it fail.
    #[error("{message}")]
    Context {
        message: String,
        #[source]
        source: Box<RunError>,
    },
}

impl From<ModelError> for RunError {
    fn from(e: ModelError) -> Self {
        RunError::Model(Box::new(e))
    }
}

impl From<EngineError> for RunError {
    fn from(e: EngineError) -> Self {
        RunError::Engine(Box::new(e))
    }
}

impl RunError {
    /// `message` over `cause`.
    pub fn context(message: impl Display, cause: impl Into<RunError>) -> Self {
        Self::Context {
            message: message.to_string(),
            source: Box::new(cause.into()),
        }
    }

    /// The part of throng that failed: this error, or under its contexts the one they wrap.
    pub fn part(&self) -> &RunError {
        match self {
            RunError::Context { source, .. } => source.part(),
            other => other,
        }
    }

    /// The message with its chain of causes on one line (`what: why: why`), a cause whose
    /// words the one before it already gave left out: for a line of a log, such as a rank's.
    pub(crate) fn one_line(&self) -> String {
        crate::causes::causes(self).join(": ")
    }
}

/// `return Err(RunError::Refused(format!(...)))`.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::run::RunError::Refused(format!($($arg)*)).into())
    };
}
pub(crate) use refuse;

/// Says what failed over an error, as [`RunError::Context`].
pub trait Context<T> {
    fn context(self, message: impl Display) -> Result<T, RunError>;
    fn with_context<M: Display>(self, message: impl FnOnce() -> M) -> Result<T, RunError>;
}

impl<T, E: Into<RunError>> Context<T> for Result<T, E> {
    fn context(self, message: impl Display) -> Result<T, RunError> {
        self.map_err(|e| RunError::context(message, e))
    }

    fn with_context<M: Display>(self, message: impl FnOnce() -> M) -> Result<T, RunError> {
        self.map_err(|e| RunError::context(message(), e))
    }
}
