//! The energy market's knobs. Defaults are those of the published reference code
//! (aws-samples "Simulating-Complex-Systems-with-LLM-Driven-Agents", energyABM_LLM_ollama.py).

use crate::sim::config::ScenarioProblem;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How the market clears (see the README, "Energy market rules").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rules {
    /// Sound clearing: sales bounded by output, unsold energy earns nothing, a per-unit cap.
    Fixed,
    /// The reference code's rules, bugs included, for comparison with the published figures.
    Reference,
}

/// Producers sell energy; utilities buy it and sell it to consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Producer,
    Utility,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompanyType {
    pub role: Role,
    /// Utilities may prefer renewable producers (`adjust_renewable_mix`).
    #[serde(default)]
    pub renewable: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MarketConfig {
    pub rules: Rules,
    /// Whether the consumer price is capped.
    pub regulated: bool,
    /// Fixed rules: the most a utility may charge consumers per unit when regulated. The
    /// default is the reference's cap at the start (0.25 x 1000 units of demand), held fixed.
    pub consumer_price_cap: f64,
    /// Reference rules: the cap is `regulator_max` times the current demand.
    pub regulator_max: f64,
    /// Company types by name.
    pub company_types: BTreeMap<String, CompanyType>,
    /// The type of company 0 (the reference always makes it a utility).
    pub first_type: String,
    /// Types drawn, uniformly, for every other company.
    pub type_mix: Vec<String>,
    /// Personas by name, each with the sentence its prompt carries.
    pub personas: BTreeMap<String, String>,
    /// Personas drawn, uniformly, for every company.
    pub persona_mix: Vec<String>,
    /// Whether prompts carry the persona (false: a control arm; personas are still drawn,
    /// so that the same groups can be compared).
    pub use_personas: bool,
    pub starting_resources: f64,
    pub starting_production: f64,
    /// A producer's starting price per unit.
    pub starting_energy_price: f64,
    /// A utility's starting price to consumers per unit.
    pub starting_consumer_price: f64,
    pub production_cost: f64,
    pub max_capacity: f64,
    pub capacity_upgrade_cost: f64,
    pub capacity_upgrade_amount: f64,
    /// Added to the cost per unit by every upgrade (maintenance).
    pub production_cost_penalty: f64,
    pub starting_demand: f64,
    /// Demand moves by a uniform draw in `[-demand_step, demand_step]` every step.
    pub demand_step: f64,
    /// Each company is linked to a uniform number of others in this range.
    pub min_connections: usize,
    pub max_connections: usize,
    /// Fixed rules: a renewable producer's price, as a utility ranks it, is divided by
    /// `1 + renewable_discount * adjust_renewable_mix`.
    pub renewable_discount: f64,
    /// Bounds of the decision schemas, which the decoder enforces.
    pub max_production_change: f64,
    pub max_price_change: f64,
    pub max_consumer_price: f64,
    pub max_renewable_mix: f64,
}

impl Default for MarketConfig {
    fn default() -> Self {
        let types = [
            ("OilAndGas", Role::Producer, false),
            ("RenewableEnergy", Role::Producer, true),
            ("NuclearPower", Role::Producer, false),
            ("CoalMining", Role::Producer, false),
            ("UtilityProvider", Role::Utility, false),
        ];
        Self {
            rules: Rules::Fixed,
            regulated: false,
            consumer_price_cap: 250.0,
            regulator_max: 0.25,
            company_types: types
                .iter()
                .map(|(n, role, renewable)| {
                    (
                        n.to_string(),
                        CompanyType {
                            role: *role,
                            renewable: *renewable,
                        },
                    )
                })
                .collect(),
            first_type: "UtilityProvider".into(),
            type_mix: types.iter().map(|(n, ..)| n.to_string()).collect(),
            personas: [
                (
                    "environmentally conscious",
                    "You care about the environment and prefer clean energy, even at some cost.",
                ),
                (
                    "greedy",
                    "You are greedy: you want as much money as possible, as fast as possible.",
                ),
                (
                    "depressed",
                    "You are depressed: you doubt that anything you do will matter.",
                ),
            ]
            .iter()
            .map(|(n, d)| (n.to_string(), d.to_string()))
            .collect(),
            persona_mix: vec![
                "environmentally conscious".into(),
                "greedy".into(),
                "depressed".into(),
            ],
            use_personas: true,
            starting_resources: 1000.0,
            starting_production: 100.0,
            starting_energy_price: 50.0,
            starting_consumer_price: 20.0,
            production_cost: 30.0,
            max_capacity: 200.0,
            capacity_upgrade_cost: 50000.0,
            capacity_upgrade_amount: 10.0,
            production_cost_penalty: 10.0,
            starting_demand: 1000.0,
            demand_step: 50.0,
            min_connections: 2,
            max_connections: 8,
            renewable_discount: 0.1,
            max_production_change: 100.0,
            max_price_change: 25.0,
            max_consumer_price: 1000.0,
            max_renewable_mix: 10.0,
        }
    }
}

impl MarketConfig {
    /// Reads and checks the `[scenario]` table of an experiment.
    pub fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        let cfg: MarketConfig = ScenarioProblem::parse(table)?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), ScenarioProblem> {
        let known_types = || {
            self.company_types
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (field, name) in std::iter::once(("first_type", &self.first_type))
            .chain(self.type_mix.iter().map(|t| ("type_mix", t)))
        {
            if !self.company_types.contains_key(name) {
                return Err(ScenarioProblem::new(
                    field,
                    format!(
                        "unknown company type `{name}` (known: {}; define new ones under company_types)",
                        known_types()
                    ),
                ));
            }
        }
        if self.type_mix.is_empty() {
            return Err(ScenarioProblem::new(
                "type_mix",
                "needs at least one company type",
            ));
        }
        if !self
            .type_mix
            .iter()
            .any(|t| self.company_types[t].role == Role::Producer)
        {
            return Err(ScenarioProblem::new(
                "type_mix",
                "needs at least one producer type",
            ));
        }
        for name in &self.persona_mix {
            if !self.personas.contains_key(name) {
                let known = self.personas.keys().cloned().collect::<Vec<_>>().join(", ");
                return Err(ScenarioProblem::new(
                    "persona_mix",
                    format!(
                        "unknown persona `{name}` (known: {known}; define new ones under personas)"
                    ),
                ));
            }
        }
        if self.persona_mix.is_empty() {
            return Err(ScenarioProblem::new(
                "persona_mix",
                "needs at least one persona",
            ));
        }
        if self.min_connections > self.max_connections {
            return Err(ScenarioProblem::new(
                "min_connections",
                format!(
                    "{} is above max_connections ({})",
                    self.min_connections, self.max_connections
                ),
            ));
        }
        let non_negative = [
            ("consumer_price_cap", self.consumer_price_cap),
            ("regulator_max", self.regulator_max),
            ("starting_production", self.starting_production),
            ("starting_energy_price", self.starting_energy_price),
            ("starting_consumer_price", self.starting_consumer_price),
            ("production_cost", self.production_cost),
            ("max_capacity", self.max_capacity),
            ("capacity_upgrade_cost", self.capacity_upgrade_cost),
            ("capacity_upgrade_amount", self.capacity_upgrade_amount),
            ("production_cost_penalty", self.production_cost_penalty),
            ("starting_demand", self.starting_demand),
            ("demand_step", self.demand_step),
            ("renewable_discount", self.renewable_discount),
            ("max_production_change", self.max_production_change),
            ("max_price_change", self.max_price_change),
            ("max_consumer_price", self.max_consumer_price),
            ("max_renewable_mix", self.max_renewable_mix),
        ];
        if let Some((field, value)) = non_negative
            .iter()
            .find(|(_, v)| !(v.is_finite() && *v >= 0.0))
        {
            return Err(ScenarioProblem::new(
                *field,
                format!("must be a number >= 0, got {value}"),
            ));
        }
        Ok(())
    }

    /// The consumer price cap per unit at `demand`, when regulated.
    pub fn cap(&self, demand: f64) -> Option<f64> {
        match (self.regulated, self.rules) {
            (false, _) => None,
            (true, Rules::Fixed) => Some(self.consumer_price_cap),
            (true, Rules::Reference) => Some(self.regulator_max * demand),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_are_the_reference_constants() {
        let c = MarketConfig::from_table(&toml::Table::new()).unwrap();
        assert_eq!(c.rules, Rules::Fixed);
        assert_eq!(
            (
                c.starting_resources,
                c.starting_production,
                c.production_cost
            ),
            (1000.0, 100.0, 30.0)
        );
        assert_eq!(
            (c.max_capacity, c.capacity_upgrade_cost, c.regulator_max),
            (200.0, 50000.0, 0.25)
        );
        assert_eq!(c.company_types.len(), 5);
        assert_eq!(c.persona_mix.len(), 3);
    }

    #[test]
    fn unknown_names_are_named() {
        let e =
            MarketConfig::from_table(&table("persona_mix = [\"greedy\", \"angry\"]")).unwrap_err();
        assert_eq!(e.field, "persona_mix");
        assert!(e.message.contains("`angry`"), "{e:?}");
        let e = MarketConfig::from_table(&table("type_mix = [\"WindFarm\"]")).unwrap_err();
        assert!(e.message.contains("`WindFarm`"), "{e:?}");
        let e = MarketConfig::from_table(&table("min_connections = -1")).unwrap_err();
        assert_eq!(e.field, "min_connections");
        let e = MarketConfig::from_table(&table("rules = \"fair\"")).unwrap_err();
        assert_eq!(e.field, "rules");
    }
}
