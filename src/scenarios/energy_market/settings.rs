//! What the report needs to know of a cell's arm, which the scenario keeps in `cells.jsonl`.

use super::config::{MarketConfig, Rules};
use serde::{Deserialize, Serialize};

/// What the report needs to know of a cell's arm, kept in `cells.jsonl` (older runs, which
/// lack it, read as the fixed rules with personas).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CellSettings {
    pub rules: Rules,
    pub regulated: bool,
    /// Step 1 of the records is the reference's hidden round (demand 0).
    pub hidden_round: bool,
    pub use_personas: bool,
    pub max_renewable_mix: f64,
}

impl Default for CellSettings {
    fn default() -> Self {
        Self::of(&MarketConfig::default())
    }
}

impl CellSettings {
    pub fn of(cfg: &MarketConfig) -> Self {
        Self {
            rules: cfg.rules,
            regulated: cfg.regulated,
            hidden_round: cfg.hidden_round(),
            use_personas: cfg.use_personas,
            max_renewable_mix: cfg.max_renewable_mix,
        }
    }
}
