//! What every scenario's report uses: statistics, figures and HTML pages. Scenario-specific
//! reports live with their scenario.

pub mod caveats;
pub mod html;
pub mod plot;
pub mod stats;
