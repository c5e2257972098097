//! The energy supply-chain market of the reference study: producers (oil and gas,
//! renewable, nuclear, coal) sell energy to utility providers, which sell it to consumers.

pub mod config;
pub mod decision;
pub mod report;
pub mod rules;
pub mod scripted;
pub mod world;

use crate::sim::config::ScenarioProblem;
use crate::sim::population::{Column, Population, PopulationSpec};
use crate::sim::scenario::{CellInfo, Parsed, Scenario, Turn};
use arrow_array::RecordBatch;
use arrow_schema::FieldRef;
use config::{MarketConfig, Role};
use decision::Decision;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use world::Market;

pub use config::Rules;

/// The energy market with one arm's settings.
#[derive(Debug, Clone)]
pub struct EnergyMarket {
    pub cfg: MarketConfig,
    type_names: Vec<String>,
    persona_names: Vec<String>,
    producer_schema: Arc<Value>,
    /// The fixed rules' utility schema (the reference cap moves with demand).
    utility_schema: Arc<Value>,
    /// The state table's columns, traced once from [`Row`].
    fields: Vec<FieldRef>,
}

/// One company after one step: a row of `state.csv` / `state.parquet`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub step: usize,
    pub agent: usize,
    pub company_type: String,
    pub role: Role,
    pub persona: String,
    pub renewable: bool,
    pub bankrupt: bool,
    pub demand: f64,
    pub resources: f64,
    pub production: f64,
    pub max_capacity: f64,
    pub energy_price: f64,
    pub cost_to_consumer: f64,
    pub production_cost: f64,
    pub revenue: f64,
    pub costs: f64,
    pub profit: f64,
    pub sold: f64,
    pub bought: f64,
    pub unmet_demand: f64,
    pub renewable_mix: f64,
    /// Share of a utility's purchases that came from renewable producers.
    pub renewable_fraction: f64,
    pub upgraded: bool,
}

impl EnergyMarket {
    pub fn new(cfg: MarketConfig) -> Self {
        use serde_arrow::schema::{SchemaLike, TracingOptions};
        Self {
            type_names: cfg.company_types.keys().cloned().collect(),
            persona_names: cfg.personas.keys().cloned().collect(),
            producer_schema: Arc::new(decision::producer_schema(&cfg)),
            utility_schema: Arc::new(decision::utility_schema(&cfg, cfg.starting_demand)),
            fields: Vec::<FieldRef>::from_type::<Row>(
                TracingOptions::default()
                    .allow_null_fields(true)
                    .enums_without_data_as_strings(true),
            )
            .expect("invariant: the row type traces"),
            cfg,
        }
    }

    pub fn type_name(&self, kind: u16) -> &str {
        &self.type_names[kind as usize]
    }

    pub fn persona_name(&self, persona: u16) -> &str {
        &self.persona_names[persona as usize]
    }

    /// The state table rows of `world` after `step`: one per company.
    pub fn rows(&self, world: &Market, cell: &CellInfo, step: usize) -> Vec<Row> {
        world
            .companies
            .iter()
            .enumerate()
            .map(|(agent, c)| Row {
                arm: cell.arm.clone(),
                population: cell.population,
                replicate: cell.replicate,
                step,
                agent,
                company_type: self.type_name(c.kind).to_string(),
                role: c.role,
                persona: self.persona_name(c.persona).to_string(),
                renewable: c.renewable,
                bankrupt: c.bankrupt,
                demand: world.demand,
                resources: c.resources,
                production: c.production,
                max_capacity: c.max_capacity,
                energy_price: c.energy_price,
                cost_to_consumer: c.cost_to_consumer,
                production_cost: c.production_cost,
                revenue: c.revenue,
                costs: c.costs,
                profit: c.profit,
                sold: c.sold,
                bought: c.bought,
                unmet_demand: c.unmet_demand,
                renewable_mix: c.renewable_mix,
                renewable_fraction: if c.bought > 0.0 {
                    c.bought_renewable / c.bought
                } else {
                    0.0
                },
                upgraded: c.upgraded,
            })
            .collect()
    }

    fn neighbour(&self, market: &Market, id: u32) -> Value {
        let c = &market.companies[id as usize];
        let mut v = json!({
            "id": id,
            "type": self.type_name(c.kind),
            "role": c.role,
            "resources": round2(c.resources),
            "profit": round2(c.profit),
            "bankrupt": c.bankrupt,
        });
        match c.role {
            Role::Producer => {
                v["production"] = json!(round2(c.production));
                v["energy_price"] = json!(round2(c.energy_price));
            }
            Role::Utility => v["cost_to_consumer"] = json!(round2(c.cost_to_consumer)),
        }
        v
    }
}

/// Prompts show money to the cent: long float tails only cost tokens.
fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The population attribute that sets companies' personas.
const PERSONA: &str = "persona";

impl Scenario for EnergyMarket {
    type World = Market;
    type Decision = Decision;

    const NAME: &'static str = "energy_market";

    fn roles() -> &'static [&'static str] {
        &["producer", "utility"]
    }

    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        MarketConfig::from_table(table).map(Self::new)
    }

    /// A population may set personas (attribute `persona`, with the config's persona names
    /// as categories) in place of the uniform `persona_mix` draw.
    fn check_population(&self, population: &PopulationSpec) -> Result<(), ScenarioProblem> {
        for attribute in &population.attributes {
            let field = format!("population.attributes.{}", attribute.name());
            match attribute {
                crate::sim::population::Attribute::Categorical {
                    name, categories, ..
                } if name == PERSONA => {
                    if let Some(bad) = categories
                        .iter()
                        .find(|c| !self.cfg.personas.contains_key(*c))
                    {
                        return Err(ScenarioProblem::new(
                            format!("{field}.shares"),
                            format!(
                                "unknown persona `{bad}` (known: {}; define new ones under [scenario.personas])",
                                self.persona_names.join(", ")
                            ),
                        ));
                    }
                }
                other => {
                    return Err(ScenarioProblem::new(
                        field,
                        format!(
                            "the energy market uses only a categorical `{PERSONA}` attribute, not `{}`",
                            other.name()
                        ),
                    ));
                }
            }
        }
        if population.personas.is_some() {
            return Err(ScenarioProblem::new(
                "population.personas",
                "the energy market's personas are named, not written by the model: remove [population.personas]",
            ));
        }
        Ok(())
    }

    fn shared_context(&self, _world: &Market, _step: usize) -> minijinja::Value {
        let c = &self.cfg;
        minijinja::Value::from(minijinja::value::Serde(json!({
            "rules": c.rules,
            "regulated": c.regulated,
            "consumer_price_cap": c.consumer_price_cap,
            "regulator_max": c.regulator_max,
            "capacity_upgrade_cost": c.capacity_upgrade_cost,
            "capacity_upgrade_amount": c.capacity_upgrade_amount,
            "production_cost_penalty": c.production_cost_penalty,
            "max_renewable_mix": c.max_renewable_mix,
            "use_personas": c.use_personas,
        })))
    }

    fn init(&self, population: &Population, rng: &mut ChaCha8Rng) -> Market {
        let mut market = Market::new(&self.cfg, population.size, rng);
        if let Some(Column::Categorical { categories, codes }) = population.column(PERSONA) {
            for (company, &code) in market.companies.iter_mut().zip(codes) {
                let name = &categories[code as usize];
                company.persona = self
                    .persona_names
                    .iter()
                    .position(|p| p == name)
                    .expect("invariant: checked by check_population")
                    as u16;
            }
        }
        market
    }

    fn num_agents(&self, world: &Market) -> usize {
        world.companies.len()
    }

    fn acts(&self, world: &Market, agent: usize) -> bool {
        !world.companies[agent].bankrupt
    }

    fn role(&self, world: &Market, agent: usize) -> &'static str {
        match world.companies[agent].role {
            Role::Producer => "producer",
            Role::Utility => "utility",
        }
    }

    fn turn(&self, world: &Market, _population: &Population, agent: usize, step: usize) -> Turn {
        let c = &world.companies[agent];
        let persona = self.persona_name(c.persona);
        let mut me = json!({
            "id": agent,
            "type": self.type_name(c.kind),
            "renewable": c.renewable,
            "resources": round2(c.resources),
            "profit": round2(c.profit),
            "revenue": round2(c.revenue),
            "costs": round2(c.costs),
        });
        match c.role {
            Role::Producer => {
                for (k, v) in [
                    ("production", c.production),
                    ("max_capacity", c.max_capacity),
                    ("energy_price", c.energy_price),
                    ("production_cost", c.production_cost),
                    ("sold", c.sold),
                ] {
                    me[k] = json!(round2(v));
                }
            }
            Role::Utility => {
                for (k, v) in [
                    ("cost_to_consumer", c.cost_to_consumer),
                    ("bought", c.bought),
                    ("unmet_demand", c.unmet_demand),
                    ("renewable_mix", c.renewable_mix),
                    (
                        "average_purchase_price",
                        if c.bought > 0.0 {
                            c.costs / c.bought
                        } else {
                            0.0
                        },
                    ),
                ] {
                    me[k] = json!(round2(v));
                }
                me["suppliers"] = Value::Array(
                    c.suppliers
                        .iter()
                        .map(|&(p, amount, price)| {
                            json!({"id": p, "type": self.type_name(world.companies[p as usize].kind),
                                   "amount": round2(amount), "price": round2(price)})
                        })
                        .collect(),
                );
            }
        }
        let context = json!({
            "step": step + 1,
            "demand": round2(world.demand),
            "price_cap": self.cfg.cap(world.demand).map(round2),
            "company": me,
            "persona": self.cfg.use_personas.then_some(persona),
            "persona_description": self.cfg.use_personas.then(|| self.cfg.personas[persona].clone()),
            "neighbours": c.links.iter().map(|&id| self.neighbour(world, id)).collect::<Vec<_>>(),
        });
        let schema = match c.role {
            Role::Producer => self.producer_schema.clone(),
            // The reference cap follows demand, so its schema changes every step.
            Role::Utility if self.cfg.regulated && self.cfg.rules == Rules::Reference => {
                Arc::new(decision::utility_schema(&self.cfg, world.demand))
            }
            Role::Utility => self.utility_schema.clone(),
        };
        Turn {
            context: minijinja::Value::from(minijinja::value::Serde(&context)),
            schema,
        }
    }

    fn parse(
        &self,
        world: &Market,
        agent: usize,
        value: &Value,
    ) -> Result<Parsed<Decision>, String> {
        let (decision, clamps) =
            decision::parse(&self.cfg, &world.companies[agent], world.demand, value)?;
        Ok(Parsed { decision, clamps })
    }

    fn no_change(&self, world: &Market, agent: usize) -> Decision {
        let c = &world.companies[agent];
        match c.role {
            Role::Producer => Decision::Producer(decision::ProducerDecision {
                production_change: 0,
                energy_price_change: 0.0,
                upgrade_capacity: false,
            }),
            Role::Utility => Decision::Utility(decision::UtilityDecision {
                cost_to_consumer: c.cost_to_consumer,
                adjust_renewable_mix: c.renewable_mix as i64,
            }),
        }
    }

    fn scripted(
        &self,
        world: &Market,
        _population: &Population,
        agent: usize,
        rng: &mut ChaCha8Rng,
    ) -> Decision {
        scripted::decide(&self.cfg, world, agent, rng)
    }

    fn resolve(&self, world: &mut Market, decisions: &[Option<Decision>], rng: &mut ChaCha8Rng) {
        rules::resolve(&self.cfg, world, decisions, rng);
    }

    fn state(
        &self,
        world: &Market,
        _population: &Population,
        cell: &CellInfo,
        step: usize,
    ) -> RecordBatch {
        serde_arrow::to_record_batch(&self.fields, &self.rows(world, cell, step))
            .expect("invariant: rows fit the traced schema")
    }

    fn describe(&self, world: &Market) -> Value {
        json!({
            "companies": world.companies.iter().enumerate().map(|(i, c)| json!({
                "id": i,
                "type": self.type_name(c.kind),
                "role": c.role,
                "persona": self.persona_name(c.persona),
                "renewable": c.renewable,
                "links": c.links,
            })).collect::<Vec<_>>()
        })
    }
}
