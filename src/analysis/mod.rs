//! What every scenario's report uses: statistics, figures and HTML pages. Scenario-specific
//! reports live with their scenario.

pub mod caveats;
pub mod html;
pub mod overview;
pub mod plot;
pub mod stats;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A record file is missing, damaged, or still being written.
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A figure's file could not be written.
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
    /// What a scenario's own report found wrong, in words.
    #[error("{0}")]
    Message(String),
}

impl From<String> for ReportError {
    fn from(message: String) -> Self {
        ReportError::Message(message)
    }
}
