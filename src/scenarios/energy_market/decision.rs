//! What producers and utilities decide. Each role has its own type; its JSON schema is
//! derived from the type (so the two cannot disagree) and then given the domain's bounds,
//! which the constrained decoder enforces.

use super::config::MarketConfig;
use super::world::Company;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A producer's move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProducerDecision {
    /// Units of production to add (negative to cut).
    pub production_change: i64,
    /// Change of your price per unit.
    pub energy_price_change: f64,
    /// Whether to buy more capacity this step.
    pub upgrade_capacity: bool,
}

/// A utility's move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UtilityDecision {
    /// Your price per unit to consumers.
    pub cost_to_consumer: f64,
    /// How much you favour renewable producers over price, from 0 (price only) to 10.
    pub adjust_renewable_mix: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Decision {
    Producer(ProducerDecision),
    Utility(UtilityDecision),
}

/// `schema` with `field` bounded to `[min, max]` in steps of `step`.
fn bound(schema: &mut Value, field: &str, min: f64, max: f64, step: Option<f64>) {
    let prop = &mut schema["properties"][field];
    prop["minimum"] = json!(min);
    prop["maximum"] = json!(max);
    if let Some(step) = step {
        // JSON numbers may have endless decimals, which small models write; a step keeps
        // replies short and the decoder finishing.
        prop["multipleOf"] = json!(step);
    }
}

fn derived<T: JsonSchema>() -> Value {
    let mut schema =
        serde_json::to_value(schemars::schema_for!(T)).expect("invariant: schemas serialise");
    if let Some(o) = schema.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
    }
    schema
}

pub fn producer_schema(cfg: &MarketConfig) -> Value {
    let mut s = derived::<ProducerDecision>();
    let m = cfg.max_production_change.round();
    bound(&mut s, "production_change", -m, m, None);
    bound(
        &mut s,
        "energy_price_change",
        -cfg.max_price_change,
        cfg.max_price_change,
        Some(0.5),
    );
    s
}

/// The utility's schema; when regulated, its price cannot exceed the cap at `demand`.
pub fn utility_schema(cfg: &MarketConfig, demand: f64) -> Value {
    let mut s = derived::<UtilityDecision>();
    let top = cfg
        .cap(demand)
        .unwrap_or(cfg.max_consumer_price)
        .min(cfg.max_consumer_price);
    bound(
        &mut s,
        "cost_to_consumer",
        0.0,
        (top * 100.0).floor() / 100.0,
        Some(0.01),
    );
    bound(
        &mut s,
        "adjust_renewable_mix",
        0.0,
        cfg.max_renewable_mix.floor(),
        None,
    );
    s
}

/// A decision from a model's value, clamped so that the rules can apply it as it is; each
/// change is listed in words.
pub fn parse(
    cfg: &MarketConfig,
    company: &Company,
    demand: f64,
    value: &Value,
) -> Result<(Decision, Vec<String>), String> {
    let mut clamps = Vec::new();
    match company.role {
        super::config::Role::Producer => {
            let mut d: ProducerDecision =
                serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            let wanted = company.production + d.production_change as f64;
            let fitted = wanted.clamp(0.0, company.max_capacity);
            if fitted != wanted {
                let change = (fitted - company.production).round() as i64;
                clamps.push(format!(
                    "production_change {} -> {change} (production stays within 0..={})",
                    d.production_change, company.max_capacity
                ));
                d.production_change = change;
            }
            let price = company.energy_price + d.energy_price_change;
            if price < company.production_cost {
                let change = company.production_cost - company.energy_price;
                clamps.push(format!(
                    "energy_price_change {} -> {change} (price floor at production cost {})",
                    d.energy_price_change, company.production_cost
                ));
                d.energy_price_change = change;
            }
            if d.upgrade_capacity && company.resources < cfg.capacity_upgrade_cost {
                clamps.push(format!(
                    "upgrade_capacity true -> false (resources {:.0} < {})",
                    company.resources, cfg.capacity_upgrade_cost
                ));
                d.upgrade_capacity = false;
            }
            Ok((Decision::Producer(d), clamps))
        }
        super::config::Role::Utility => {
            let mut d: UtilityDecision =
                serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
            let top = cfg
                .cap(demand)
                .unwrap_or(f64::INFINITY)
                .min(cfg.max_consumer_price);
            if d.cost_to_consumer > top || d.cost_to_consumer < 0.0 {
                let fitted = d.cost_to_consumer.clamp(0.0, top);
                clamps.push(format!(
                    "cost_to_consumer {} -> {fitted} (allowed 0..={top})",
                    d.cost_to_consumer
                ));
                d.cost_to_consumer = fitted;
            }
            let max_mix = cfg.max_renewable_mix as i64;
            if !(0..=max_mix).contains(&d.adjust_renewable_mix) {
                let fitted = d.adjust_renewable_mix.clamp(0, max_mix);
                clamps.push(format!(
                    "adjust_renewable_mix {} -> {fitted}",
                    d.adjust_renewable_mix
                ));
                d.adjust_renewable_mix = fitted;
            }
            Ok((Decision::Utility(d), clamps))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_come_from_the_types_with_the_domain_bounds() {
        let cfg = MarketConfig {
            regulated: true,
            ..MarketConfig::default()
        };
        let p = producer_schema(&cfg);
        assert_eq!(p["properties"]["production_change"]["type"], "integer");
        assert_eq!(p["properties"]["upgrade_capacity"]["type"], "boolean");
        assert_eq!(p["additionalProperties"], false);
        assert_eq!(p["required"].as_array().unwrap().len(), 3);
        let u = utility_schema(&cfg, 1000.0);
        assert_eq!(u["properties"]["cost_to_consumer"]["maximum"], 250.0);
        assert_eq!(u["properties"]["adjust_renewable_mix"]["maximum"], 10.0);
        let unregulated = utility_schema(&MarketConfig::default(), 1000.0);
        assert_eq!(
            unregulated["properties"]["cost_to_consumer"]["maximum"],
            1000.0
        );
    }
}
