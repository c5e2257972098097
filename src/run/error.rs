//! Why a run could not start, or stopped: each message names the problem and the fix. A
//! part of throng's own error (a config's, a model's, a record's) stays whole as a cause, so
//! that a caller can tell a bad config from a failed model (the Python package raises
//! `ConfigError` or `ModelError` by it).

use std::error::Error;
use std::fmt::Display;

/// An error of any part of throng, kept whole with its own causes.
pub type Cause = Box<dyn Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The options, the config or the run folder refuse the run, or what it asks cannot be
    /// done: the message says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    /// An error of a part of throng, in its own words. It is also its own first cause, so
    /// that its type can be found along [`Error::source`] (a printer of causes skips a cause
    /// whose words it has just given).
    #[error("{0}")]
    Failed(#[source] Cause),
    /// What failed, in the run's words, over the error that made it fail.
    #[error("{message}")]
    Context {
        message: String,
        #[source]
        source: Cause,
    },
}

impl RunError {
    /// `message` over `cause`.
    pub fn context(message: impl Display, cause: impl Into<Cause>) -> Self {
        Self::Context {
            message: message.to_string(),
            source: cause.into(),
        }
    }

    /// The message with its chain of causes on one line (`what: why: why`), a cause whose
    /// words the one before it already gave left out: for a line of a log, such as a rank's.
    pub(crate) fn one_line(&self) -> String {
        let mut text = self.to_string();
        let mut said = text.clone();
        let mut cause = self.source();
        while let Some(c) = cause {
            let words = c.to_string();
            if !said.contains(&words) {
                text.push_str(": ");
                text.push_str(&words);
            }
            said = words;
            cause = c.source();
        }
        text
    }
}

/// `return Err(RunError::Refused(format!(...)))`.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err($crate::run::RunError::Refused(format!($($arg)*)))
    };
}
pub(crate) use refuse;

/// An error of a part of throng, as a [`RunError::Failed`].
macro_rules! failed_from {
    ($($error:ty),* $(,)?) => {
        $(impl From<$error> for RunError {
            fn from(e: $error) -> Self {
                RunError::Failed(Box::new(e))
            }
        })*
    };
}

failed_from!(
    std::io::Error,
    crate::sim::config::ConfigError,
    crate::model::ModelError,
    crate::record::RecordError,
    crate::record::FolderError,
    crate::sim::runner::RunError,
    crate::sim::plan::SizeError,
    crate::sim::plan::PlacementError,
    crate::cluster::ClusterError,
    crate::serve::ServeError,
    crate::engine::EngineError,
    crate::analysis::ReportError,
    toml::de::Error,
    toml::ser::Error,
    serde_json::Error,
);

/// Says what failed over an error, as [`RunError::Context`].
pub trait Context<T> {
    fn context(self, message: impl Display) -> Result<T, RunError>;
    fn with_context<M: Display>(self, message: impl FnOnce() -> M) -> Result<T, RunError>;
}

impl<T, E: Error + Send + Sync + 'static> Context<T> for Result<T, E> {
    fn context(self, message: impl Display) -> Result<T, RunError> {
        self.map_err(|e| RunError::context(message, e))
    }

    fn with_context<M: Display>(self, message: impl FnOnce() -> M) -> Result<T, RunError> {
        self.map_err(|e| RunError::context(message(), e))
    }
}
