//! What producers and utilities decide. Each role has its own type; its JSON schema is
//! derived from the type (so the two cannot disagree) and then given the domain's bounds,
//! which the constrained decoder enforces.

use super::config::{MarketConfig, Rules};
use super::world::Company;
use crate::sim::scenario::ParseError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A producer's move.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProducerDecision {
    /// Units of production to add (negative to cut). Whole units under the fixed rules; a
    /// float under the reference rules, as in the published code.
    #[serde(serialize_with = "whole_as_integer")]
    #[schemars(with = "f64")]
    pub production_change: f64,
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

/// Writes a whole number of units as a JSON integer (`10`, not `10.0`), so that records
/// read as they did when the field was an integer, and fractions as they are.
fn whole_as_integer<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        s.serialize_i64(*x as i64)
    } else {
        s.serialize_f64(*x)
    }
}

/// `schema` with `field` bounded to `[min, max]` (either side optional) in steps of `step`.
fn bound(schema: &mut Value, field: &str, min: Option<f64>, max: Option<f64>, step: Option<f64>) {
    let prop = &mut schema["properties"][field];
    if let Some(min) = min {
        prop["minimum"] = json!(min);
    }
    if let Some(max) = max {
        prop["maximum"] = json!(max);
    }
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
    let m = cfg.production_change_limit().map(f64::round);
    match cfg.rules {
        // Whole units, as models and the scripted policy write them.
        Rules::Fixed => {
            s["properties"]["production_change"]["type"] = json!("integer");
            s["properties"]["production_change"]["format"] = json!("int64");
            bound(&mut s, "production_change", m.map(|m| -m), m, None);
        }
        Rules::Reference => bound(&mut s, "production_change", m.map(|m| -m), m, Some(0.1)),
    }
    let p = cfg.price_change_limit();
    bound(&mut s, "energy_price_change", p.map(|p| -p), p, Some(0.5));
    s
}

/// The utility's schema; when regulated, its price cannot exceed the cap at `demand`.
pub fn utility_schema(cfg: &MarketConfig, demand: f64) -> Value {
    let mut s = derived::<UtilityDecision>();
    let top = cfg
        .consumer_price_max(demand)
        .map(|top| (top * 100.0).floor() / 100.0);
    bound(&mut s, "cost_to_consumer", Some(0.0), top, Some(0.01));
    let (lo, hi) = cfg.renewable_mix_range();
    bound(
        &mut s,
        "adjust_renewable_mix",
        Some(lo as f64),
        Some(hi as f64),
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
) -> Result<(Decision, Vec<String>), ParseError> {
    let mut clamps = Vec::new();
    match company.role {
        super::config::Role::Producer => {
            let mut d: ProducerDecision = serde_json::from_value(value.clone())?;
            let wanted = company.production + d.production_change;
            let fitted = wanted.clamp(0.0, company.max_capacity);
            if fitted != wanted {
                let change = match cfg.rules {
                    Rules::Fixed => (fitted - company.production).round(),
                    Rules::Reference => fitted - company.production,
                };
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
            let mut d: UtilityDecision = serde_json::from_value(value.clone())?;
            let top = cfg.consumer_price_max(demand).unwrap_or(f64::INFINITY);
            if d.cost_to_consumer > top || d.cost_to_consumer < 0.0 {
                let fitted = d.cost_to_consumer.clamp(0.0, top);
                clamps.push(format!(
                    "cost_to_consumer {} -> {fitted} (allowed 0..={top})",
                    d.cost_to_consumer
                ));
                d.cost_to_consumer = fitted;
            }
            let (lo, hi) = cfg.renewable_mix_range();
            if !(lo..=hi).contains(&d.adjust_renewable_mix) {
                let fitted = d.adjust_renewable_mix.clamp(lo, hi);
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
        assert_eq!(p["properties"]["energy_price_change"]["maximum"], 25.0);
        assert_eq!(p["properties"]["production_change"]["maximum"], 100.0);
    }

    #[test]
    fn reference_schemas_have_the_reference_bounds_only() {
        // No per-step limits, a float production change, the mix clipped to +/-100, and no
        // consumer price ceiling without regulation.
        let cfg = MarketConfig {
            rules: Rules::Reference,
            ..MarketConfig::default()
        };
        let p = producer_schema(&cfg);
        let change = &p["properties"]["production_change"];
        assert_eq!(change["type"], "number");
        assert!(change.get("maximum").is_none() && change.get("minimum").is_none());
        assert!(
            p["properties"]["energy_price_change"]
                .get("maximum")
                .is_none()
        );
        let u = utility_schema(&cfg, 1000.0);
        assert!(u["properties"]["cost_to_consumer"].get("maximum").is_none());
        assert_eq!(u["properties"]["adjust_renewable_mix"]["minimum"], -100.0);
        assert_eq!(u["properties"]["adjust_renewable_mix"]["maximum"], 100.0);
    }

    #[test]
    fn whole_production_changes_are_written_as_integers() {
        let d = ProducerDecision {
            production_change: 10.0,
            energy_price_change: 0.0,
            upgrade_capacity: false,
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"production_change":10,"energy_price_change":0.0,"upgrade_capacity":false}"#
        );
        let d = ProducerDecision {
            production_change: 2.5,
            ..d
        };
        assert!(serde_json::to_string(&d).unwrap().contains(":2.5,"));
    }
}
