//! Statistics, figures and HTML reports of finished (or interrupted) runs.

pub mod energy_report;
pub mod plot;
pub mod stats;
