//! What every scenario's report uses: statistics, figures and HTML pages. Scenario-specific
//! reports live with their scenario.

mod aggregates;
pub mod arm_tests;
pub mod caveats;
mod column_figures;
pub mod counterfactual;
pub mod format;
pub mod html;
mod levels;
mod means;
pub mod overview;
pub mod plot;
mod state;
pub mod stats;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A record file is missing, damaged, or still being written.
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A file of the report itself (its page, a table) could not be written.
    #[error("{path}: {source}")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// A figure's file could not be written.
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
    /// A table of the run lacks a column the report reads, or holds one it cannot read.
    #[error("{}", .problem.text(.table, .column))]
    Column {
        /// The table in words, as the messages name it ("state table").
        table: &'static str,
        column: String,
        problem: ColumnProblem,
    },
    /// A cell's rows skip an agent at a step: its table was cut or mixed with another's.
    #[error("{table}: cell {cell} has no row for {role} {agent} at step {step}")]
    MissingRow {
        table: &'static str,
        cell: String,
        /// What the scenario calls its agents ("company").
        role: &'static str,
        agent: usize,
        step: usize,
    },
    /// The run has not finished a step, so there is nothing to report yet.
    #[error("{dir} has no {what} yet: run at least one step")]
    Empty {
        dir: std::path::PathBuf,
        /// What is missing, in words ("finished round").
        what: &'static str,
    },
    /// The run's scenario is not one this program registered.
    #[error("no report for scenario `{scenario}`: this program knows {known}; {fix}")]
    UnknownScenario {
        scenario: String,
        known: String,
        /// What to run instead, in words, from whoever knows the scenarios a program registers.
        fix: String,
    },
    /// What a study's own report found wrong, in words: for failures none of the kinds above
    /// describes.
    #[error("{0}")]
    Message(String),
}

/// What is wrong with a column a report reads.
#[derive(Debug)]
pub enum ColumnProblem {
    /// The table has no such column.
    Missing,
    /// The table's first part has it, a later part not.
    MissingFromPart,
    /// It holds another type than the runner writes.
    Type {
        found: arrow_schema::DataType,
        expected: arrow_schema::DataType,
    },
    /// Its values could not be read as numbers or labels.
    Unreadable(arrow_schema::ArrowError),
}

impl ColumnProblem {
    fn text(&self, table: &str, column: &str) -> String {
        match self {
            ColumnProblem::Missing => format!(
                "the {table} has no `{column}` column: it was not written by throng's runner"
            ),
            ColumnProblem::MissingFromPart => format!("a part of the {table} lacks `{column}`"),
            ColumnProblem::Type { found, expected } => format!(
                "the {table}'s `{column}` column holds {found}, not {expected}: it was not \
                 written by throng's runner"
            ),
            ColumnProblem::Unreadable(e) => format!("column `{column}`: {e}"),
        }
    }
}
