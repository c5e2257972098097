//! The report's numbers, as `summary.json` holds them and the page shows them.

use super::dynamics::Dynamics;
use crate::analysis::stats::{Nested, Summary, Welch};
use crate::record::Manifest;
use crate::scenarios::energy_market::config::Role;
use crate::scenarios::energy_market::settings::CellSettings;
use serde::Serialize;

/// A utility persona's numbers in one arm and population.
#[derive(Debug, Clone, Serialize)]
pub struct PersonaStats {
    pub persona: String,
    pub utilities: usize,
    /// Of them, bankrupt by the last step; and the company-steps after their bankruptcy,
    /// which the statistics leave out (they no longer trade).
    pub bankrupt: usize,
    pub steps_after_bankruptcy: usize,
    /// A utility's mean profit per step it traded in.
    pub profit: Nested,
    pub renewable_mix: Nested,
    /// The renewable share of its purchases.
    pub renewable_share: Nested,
    /// The share weighted by its preference (share x adjust_renewable_mix), Figure 9's.
    pub weighted_share: Nested,
}

/// A producer type's mean price (second half of the run) in one arm and population.
#[derive(Debug, Clone, Serialize)]
pub struct TypeStats {
    pub company_type: String,
    pub price: Nested,
}

/// One arm at one population size, over its replicates.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStats {
    pub arm: String,
    pub population: usize,
    pub replicates: usize,
    pub settings: CellSettings,
    pub last_step: usize,
    pub consumer_price_start: Nested,
    pub consumer_price_end: Nested,
    pub producer_price_start: Nested,
    pub producer_price_end: Nested,
    /// The share of companies bankrupt after the last step, and how many.
    pub bankrupt_end: Option<Summary>,
    pub bankrupt_companies: usize,
    pub companies: usize,
    pub personas: Vec<PersonaStats>,
    pub producer_types: Vec<TypeStats>,
    /// The largest gap between producer types' mean prices in a market: how far apart
    /// subpopulations that should be indistinguishable still are (Experiment 3).
    pub type_gap: Option<Summary>,
    pub dynamics: Dynamics,
}

/// One Welch test of replicate means, in the report's family.
#[derive(Debug, Clone, Serialize)]
pub struct TestRow {
    pub population: usize,
    pub quantity: &'static str,
    /// `arm: persona` on either side.
    pub a: String,
    pub b: String,
    /// Replicates on either side.
    pub n_a: usize,
    pub n_b: usize,
    pub welch: Option<Welch>,
    /// Why there is no test, when there is none.
    pub why_not: Option<&'static str>,
    /// Holm-adjusted p over every test of the report.
    pub holm_p: Option<f64>,
}

/// A company that went bankrupt, and what the tables say of the steps after.
#[derive(Debug, Clone, Serialize)]
pub struct Bankruptcy {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub agent: usize,
    pub role: Role,
    pub kind: String,
    pub persona: String,
    pub step: usize,
    /// Steps after it, in which it is shown as "bankrupt" and does not trade.
    pub steps_after: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PopulationTiming {
    pub population: usize,
    /// Processes (devices) that ran its steps.
    pub ranks: Vec<usize>,
    pub step_seconds: Option<Summary>,
    pub median_seconds: f64,
    pub min_seconds: f64,
    pub max_seconds: f64,
    pub decisions_per_second: f64,
    /// Of those, the LLM policy's and the scripted rules' (`None` for steps recorded before
    /// they were kept apart).
    pub model_decisions_per_second: Option<f64>,
    pub scripted_decisions_per_second: Option<f64>,
}

impl PopulationTiming {
    /// The rates in words: the model's apart from the scripted rules', which cost nothing.
    pub fn rates(&self) -> String {
        match (
            self.model_decisions_per_second,
            self.scripted_decisions_per_second,
        ) {
            (Some(m), Some(0.0)) => format!("{m:.2} model decisions/s"),
            (Some(0.0), Some(s)) => format!("{s:.2} scripted decisions/s"),
            (Some(m), Some(s)) => {
                format!("{m:.2} model decisions/s, {s:.2} scripted decisions/s")
            }
            _ => format!("{:.2} decisions/s", self.decisions_per_second),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub manifest: Manifest,
    /// Set when the run is not finished: steps done out of planned.
    pub unfinished: Option<String>,
    /// Lines a reader must see next: a model smaller than the study's, the scripted policy.
    pub notes: Vec<String>,
    pub groups: Vec<GroupStats>,
    pub tests: Vec<TestRow>,
    pub bankruptcies: Vec<Bankruptcy>,
    pub timings: Vec<PopulationTiming>,
    pub figures: Vec<String>,
}
