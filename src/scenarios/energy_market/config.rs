//! The energy market's knobs. Defaults are those of the published reference code
//! (aws-samples "Simulating-Complex-Systems-with-LLM-Driven-Agents", energyABM_LLM_ollama.py).

use crate::sim::config::ScenarioProblem;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How the market clears (see docs/src/energy-market-rules.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rules {
    /// Sound clearing: sales bounded by output, unsold energy earns nothing, a per-unit cap.
    #[default]
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

/// The study's personas, the ones the scripted policy has rules for. A config may name
/// personas of its own (under `personas`): prompts carry them like these, and the scripted
/// policy gives them its neutral rule, as it gives every company of a control arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persona {
    EnvironmentallyConscious,
    Greedy,
    Depressed,
}

impl Persona {
    pub const ALL: [Persona; 3] = [
        Persona::EnvironmentallyConscious,
        Persona::Greedy,
        Persona::Depressed,
    ];

    /// Its name, as configs and prompts write it.
    pub fn name(self) -> &'static str {
        match self {
            Persona::EnvironmentallyConscious => "environmentally conscious",
            Persona::Greedy => "greedy",
            Persona::Depressed => "depressed",
        }
    }

    /// The study's persona named `name`; `None` for a persona of a config's own.
    pub fn of(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The study's persona that `name`, not one of them, is likely a misspelling of: the
    /// same words in another case or with other separators, or one slip away (a letter
    /// missing, added, changed, or two swapped; two slips in the longest name).
    fn misspelt(name: &str) -> Option<Self> {
        let words = name
            .to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        Self::ALL.into_iter().find(|p| {
            let slips = if p.name().len() > 12 { 2 } else { 1 };
            slips_between(&words, p.name()) <= slips
        })
    }
}

/// Letters missing, added, changed or swapped with their neighbour that turn `a` into `b`
/// (the optimal string alignment distance).
fn slips_between(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let change = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + change);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// A bound on decisions that the reference code does not have: a number, or `"none"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "LimitSpec", into = "LimitSpec")]
pub enum Limit {
    Unbounded,
    At(f64),
}

/// A [`Limit`] as written in a config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum LimitSpec {
    Number(f64),
    Word(String),
}

/// A limit that is neither a number >= 0 nor `"none"`, as the config gave it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be a number >= 0 or \"none\", got {0}")]
pub struct NotALimit(String);

impl TryFrom<LimitSpec> for Limit {
    type Error = NotALimit;
    fn try_from(spec: LimitSpec) -> Result<Self, NotALimit> {
        match spec {
            LimitSpec::Number(v) if v.is_finite() && v >= 0.0 => Ok(Limit::At(v)),
            LimitSpec::Word(w) if w == "none" => Ok(Limit::Unbounded),
            LimitSpec::Number(v) => Err(NotALimit(v.to_string())),
            LimitSpec::Word(w) => Err(NotALimit(format!("\"{w}\""))),
        }
    }
}

impl From<Limit> for LimitSpec {
    fn from(limit: Limit) -> Self {
        match limit {
            Limit::Unbounded => LimitSpec::Word("none".into()),
            Limit::At(v) => LimitSpec::Number(v),
        }
    }
}

/// The reference's `np.clip` of `adjust_renewable_mix`, whatever its prompt asks for.
pub(crate) const REFERENCE_MIX_CLIP: i64 = 100;

/// The largest amount a knob may set (resources, prices, costs, units of energy, demand): a
/// trillion, a thousand million times the reference's amounts. A larger one is a typo, not a
/// market.
pub(crate) const MAX_AMOUNT: f64 = 1e12;
/// The largest `regulator_max`: a cap per unit of 100 x the demand.
pub(crate) const MAX_REGULATOR: f64 = 100.0;
/// The largest `renewable_discount`: a renewable price divided by up to 1 + 10 x the mix.
pub(crate) const MAX_DISCOUNT: f64 = 10.0;

/// A number as a config would write it: `-1e308` rather than 309 digits.
fn written(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-4..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// `1e12` as `10^12`, other bounds as written.
fn range_end(x: f64) -> String {
    if x >= 1e6 && x.log10().fract() == 0.0 {
        format!("10^{}", x.log10() as i32)
    } else {
        format!("{x}")
    }
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
    /// Personas by name, each with a one-sentence definition, which prompts carry only when
    /// `describe_personas` is set (the study deliberately left its personas undefined). The
    /// study's are [`Persona`]s; others are a config's own (see [`MarketConfig::persona`]).
    pub personas: BTreeMap<String, String>,
    pub describe_personas: bool,
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
    /// Throng's bounds on decisions, which the reference code does not have (each a number
    /// or `"none"`; unset, the fixed rules' value below, or none under the reference rules).
    /// The decoder enforces them through the decision schemas. A producer's output change
    /// per step (100):
    pub max_production_change: Option<Limit>,
    /// A producer's price change per step (25).
    pub max_price_change: Option<Limit>,
    /// The highest consumer price, cap or no cap (1000).
    pub max_consumer_price: Option<Limit>,
    /// The top of the renewable preference the prompts ask for (0 to this). The fixed rules
    /// enforce it; the reference rules, as the published code, clip to +/-100 only.
    pub max_renewable_mix: f64,
    /// Reference rules: before step 1, the published code's `get_network_data` runs a round
    /// with demand 0 and no neighbour data, in which every company decides and producers
    /// are paid. Set, the first step of a run is that round (default: on under the reference
    /// rules; the fixed rules have none).
    pub hidden_round: Option<bool>,
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
            personas: Persona::ALL
                .into_iter()
                .map(|p| {
                    let definition = match p {
                        Persona::EnvironmentallyConscious => {
                            "You care about the environment and prefer clean energy, even at some cost."
                        }
                        Persona::Greedy => {
                            "You are greedy: you want as much money as possible, as fast as possible."
                        }
                        Persona::Depressed => {
                            "You are depressed: you doubt that anything you do will matter."
                        }
                    };
                    (p.name().to_string(), definition.to_string())
                })
                .collect(),
            describe_personas: false,
            persona_mix: Persona::ALL.map(|p| p.name().to_string()).to_vec(),
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
            max_production_change: None,
            max_price_change: None,
            max_consumer_price: None,
            max_renewable_mix: 10.0,
            hidden_round: None,
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
        self.check_personas()?;
        if self.min_connections > self.max_connections {
            return Err(ScenarioProblem::new(
                "min_connections",
                format!(
                    "{} is above max_connections ({})",
                    self.min_connections, self.max_connections
                ),
            ));
        }
        for (field, value, (low, high)) in self.numbers() {
            if !(value.is_finite() && (low..=high).contains(&value)) {
                return Err(ScenarioProblem::new(
                    field,
                    format!(
                        "must be a number from {} to {}, got {}",
                        range_end(low),
                        range_end(high),
                        written(value)
                    ),
                ));
            }
        }
        if self.hidden_round == Some(true) && self.rules != Rules::Reference {
            return Err(ScenarioProblem::new(
                "hidden_round",
                "the hidden round is a quirk of the reference code: it needs rules = \"reference\"",
            ));
        }
        Ok(())
    }

    /// The personas: none a slip away from a study persona's name, and a mix of known ones.
    fn check_personas(&self) -> Result<(), ScenarioProblem> {
        // A persona of a config's own is valid, so a misspelt study persona would be one,
        // and silently get the scripted policy's neutral rule: names a slip away from the
        // study's are refused.
        for name in self.personas.keys() {
            if Persona::of(name).is_none()
                && let Some(meant) = Persona::misspelt(name)
            {
                return Err(ScenarioProblem::new(
                    format!("personas.{name}"),
                    format!(
                        "`{name}` is not one of the study's personas ({}) but close to `{}`: \
                         spell it `{}`, or give a persona of your own a name of its own (the \
                         scripted policy follows the study's personas and gives any other \
                         its neutral rule)",
                        Persona::ALL.map(Persona::name).join(", "),
                        meant.name(),
                        meant.name()
                    ),
                ));
            }
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
        Ok(())
    }

    /// Every number of the market with its range: amounts of money, energy and prices from 0
    /// to [`MAX_AMOUNT`], and the few factors within their own ranges.
    fn numbers(&self) -> Vec<(&'static str, f64, (f64, f64))> {
        let amount = (0.0, MAX_AMOUNT);
        let mut numbers = vec![
            ("starting_resources", self.starting_resources, amount),
            ("starting_production", self.starting_production, amount),
            ("starting_energy_price", self.starting_energy_price, amount),
            (
                "starting_consumer_price",
                self.starting_consumer_price,
                amount,
            ),
            ("production_cost", self.production_cost, amount),
            ("max_capacity", self.max_capacity, amount),
            ("capacity_upgrade_cost", self.capacity_upgrade_cost, amount),
            (
                "capacity_upgrade_amount",
                self.capacity_upgrade_amount,
                amount,
            ),
            (
                "production_cost_penalty",
                self.production_cost_penalty,
                amount,
            ),
            ("starting_demand", self.starting_demand, amount),
            ("demand_step", self.demand_step, amount),
            ("consumer_price_cap", self.consumer_price_cap, amount),
            ("regulator_max", self.regulator_max, (0.0, MAX_REGULATOR)),
            (
                "renewable_discount",
                self.renewable_discount,
                (0.0, MAX_DISCOUNT),
            ),
            (
                "max_renewable_mix",
                self.max_renewable_mix,
                (0.0, REFERENCE_MIX_CLIP as f64),
            ),
        ];
        for (field, limit) in [
            ("max_production_change", self.max_production_change),
            ("max_price_change", self.max_price_change),
            ("max_consumer_price", self.max_consumer_price),
        ] {
            if let Some(Limit::At(v)) = limit {
                numbers.push((field, v, amount));
            }
        }
        numbers
    }

    fn limit(&self, knob: Option<Limit>, fixed_default: f64) -> Option<f64> {
        match (knob, self.rules) {
            (Some(Limit::At(v)), _) => Some(v),
            (Some(Limit::Unbounded), _) | (None, Rules::Reference) => None,
            (None, Rules::Fixed) => Some(fixed_default),
        }
    }

    /// The most a producer's output may change in one step, if bounded.
    pub(crate) fn production_change_limit(&self) -> Option<f64> {
        self.limit(self.max_production_change, 100.0)
    }

    /// The most a producer's price may change in one step, if bounded.
    pub(crate) fn price_change_limit(&self) -> Option<f64> {
        self.limit(self.max_price_change, 25.0)
    }

    /// The highest consumer price whatever the regulation, if bounded.
    pub(crate) fn consumer_price_ceiling(&self) -> Option<f64> {
        self.limit(self.max_consumer_price, 1000.0)
    }

    /// The study's persona at `index` of `personas` (a company's `persona`); `None` for a
    /// persona of the config's own.
    pub fn persona(&self, index: u16) -> Option<Persona> {
        self.personas
            .keys()
            .nth(usize::from(index))
            .and_then(|name| Persona::of(name))
    }

    /// The most a utility may charge per unit at `demand`: the cap when regulated, and the
    /// ceiling.
    pub(crate) fn consumer_price_max(&self, demand: f64) -> Option<f64> {
        match (self.cap(demand), self.consumer_price_ceiling()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The values `adjust_renewable_mix` may take: 0 to `max_renewable_mix` under the fixed
    /// rules; the reference clips to +/-100 only (so a negative mix is possible, and ranks
    /// renewables first).
    pub(crate) fn renewable_mix_range(&self) -> (i64, i64) {
        match self.rules {
            Rules::Fixed => (0, self.max_renewable_mix.floor() as i64),
            Rules::Reference => (-REFERENCE_MIX_CLIP, REFERENCE_MIX_CLIP),
        }
    }

    /// Whether the first step is the reference's hidden round (demand 0).
    pub fn hidden_round(&self) -> bool {
        self.hidden_round.unwrap_or(self.rules == Rules::Reference)
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
        let e = MarketConfig::from_table(&table("max_price_change = \"lots\"")).unwrap_err();
        assert_eq!(e.field, "max_price_change");
        assert!(e.message.contains("\"none\""), "{e:?}");
        let e = MarketConfig::from_table(&table("max_price_change = -3")).unwrap_err();
        assert_eq!(e.field, "max_price_change");
        let e = MarketConfig::from_table(&table("hidden_round = true")).unwrap_err();
        assert_eq!(e.field, "hidden_round");
        assert!(e.message.contains("reference"), "{e:?}");
    }

    #[test]
    fn personas_a_slip_from_the_studys_are_refused_and_others_are_a_configs_own() {
        let personas =
            |body: &str| MarketConfig::from_table(&table(&format!("[personas]\n{body}")));
        for (name, meant) in [
            ("\"greedy \"", "greedy"),
            ("GREEDY", "greedy"),
            ("greed", "greedy"),
            ("\"depressde\"", "depressed"),
            ("\"environmentally_conscious\"", "environmentally conscious"),
            ("\"enviromentaly conscious\"", "environmentally conscious"),
        ] {
            let e = personas(&format!("{name} = \"x\"")).unwrap_err();
            assert_eq!(e.field, format!("personas.{}", name.trim_matches('"')));
            assert!(e.message.contains(&format!("close to `{meant}`")), "{e:?}");
        }
        let own = MarketConfig::from_table(&table(
            "persona_mix = [\"stoic\", \"depressive\"]\n[personas]\nstoic = \"s\"\ndepressive = \"d\"",
        ))
        .unwrap();
        assert_eq!((own.persona(0), own.persona(1)), (None, None));
        let study = MarketConfig::default();
        assert_eq!(
            (0..3).map(|i| study.persona(i)).collect::<Vec<_>>(),
            // The map's order: by name.
            [
                Some(Persona::Depressed),
                Some(Persona::EnvironmentallyConscious),
                Some(Persona::Greedy)
            ]
        );
    }

    #[test]
    fn throngs_limits_default_by_rules_and_can_be_set_or_lifted() {
        // Fixed rules: throng's bounds. Reference rules: the published code's (none).
        let fixed = MarketConfig::from_table(&toml::Table::new()).unwrap();
        assert_eq!(fixed.price_change_limit(), Some(25.0));
        assert_eq!(fixed.production_change_limit(), Some(100.0));
        assert_eq!(fixed.consumer_price_ceiling(), Some(1000.0));
        assert_eq!(fixed.renewable_mix_range(), (0, 10));
        assert!(!fixed.hidden_round());
        let reference = MarketConfig::from_table(&table("rules = \"reference\"")).unwrap();
        assert_eq!(reference.price_change_limit(), None);
        assert_eq!(reference.production_change_limit(), None);
        assert_eq!(reference.consumer_price_ceiling(), None);
        assert_eq!(reference.renewable_mix_range(), (-100, 100));
        assert!(reference.hidden_round());
        let set = MarketConfig::from_table(&table(
            "rules = \"reference\"\nmax_price_change = 10\nhidden_round = false",
        ))
        .unwrap();
        assert_eq!(set.price_change_limit(), Some(10.0));
        assert!(!set.hidden_round());
        let lifted = MarketConfig::from_table(&table("max_consumer_price = \"none\"")).unwrap();
        assert_eq!(lifted.consumer_price_ceiling(), None);
        assert_eq!(lifted.consumer_price_max(1000.0), None);
    }
}
