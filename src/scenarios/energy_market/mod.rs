//! The energy supply-chain market of the reference study: producers (oil and gas,
//! renewable, nuclear, coal) sell energy to utility providers, which sell it to consumers.

pub mod config;
pub mod decision;
pub mod report;
pub mod rules;
pub mod scripted;
mod settings;
pub mod world;

use crate::host::MemoryPart;
use crate::sim::config::ScenarioProblem;
use crate::sim::population::{Column, Population, PopulationSpec};
use crate::sim::scenario::{
    CellInfo, Descriptor, ParseError, Parsed, Records, Scenario, Sizing, Turn,
};
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
    /// The trades table's, from [`Trade`].
    trade_fields: Vec<FieldRef>,
}

/// The scenario's own table of purchases: `trades.parquet`.
pub(crate) const TRADES: &str = "trades";

/// One purchase in one step: a row of `trades.parquet`. A utility's rows of a step are its
/// suppliers; a producer's, who bought from it and how much.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trade {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub step: usize,
    pub utility: usize,
    pub producer: usize,
    pub producer_type: String,
    pub renewable: bool,
    pub units: f64,
    /// Per unit, as the utility paid it.
    pub price: f64,
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
        let tracing = || {
            TracingOptions::default()
                .allow_null_fields(true)
                .enums_without_data_as_strings(true)
        };
        Self {
            type_names: cfg.company_types.keys().cloned().collect(),
            persona_names: cfg.personas.keys().cloned().collect(),
            producer_schema: Arc::new(decision::producer_schema(&cfg)),
            utility_schema: Arc::new(decision::utility_schema(&cfg, cfg.starting_demand)),
            fields: Vec::<FieldRef>::from_type::<Row>(tracing())
                .expect("invariant: the row type traces"),
            trade_fields: Vec::<FieldRef>::from_type::<Trade>(tracing())
                .expect("invariant: the trade type traces"),
            cfg,
        }
    }

    pub(crate) fn type_name(&self, kind: u16) -> &str {
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

    /// The purchases of the step that led to `world`: one row per utility and supplier.
    pub fn trades(&self, world: &Market, cell: &CellInfo, step: usize) -> Vec<Trade> {
        world
            .companies
            .iter()
            .enumerate()
            .flat_map(|(u, c)| {
                c.suppliers.iter().map(move |&(p, units, price)| {
                    let producer = &world.companies[p as usize];
                    Trade {
                        arm: cell.arm.clone(),
                        population: cell.population,
                        replicate: cell.replicate,
                        step,
                        utility: u,
                        producer: p as usize,
                        producer_type: self.type_name(producer.kind).to_string(),
                        renewable: producer.renewable,
                        units,
                        price,
                    }
                })
            })
            .collect()
    }

    /// What a company sees of a linked one: the state the reference passes to every
    /// neighbour (`connected_companies`): resources and profit; a producer's output, capacity
    /// and price; a utility's price, unmet demand and suppliers.
    fn neighbour(&self, market: &Market, id: u32) -> Value {
        let c = &market.companies[id as usize];
        let mut v = json!({
            "id": id,
            "type": self.type_name(c.kind),
            "role": c.role,
            "resources": num(c.resources),
            "profit": num(c.profit),
            "bankrupt": c.bankrupt,
        });
        match c.role {
            Role::Producer => {
                v["production"] = num(c.production);
                v["max_capacity"] = num(c.max_capacity);
                v["energy_price"] = num(c.energy_price);
            }
            Role::Utility => {
                v["cost_to_consumer"] = num(c.cost_to_consumer);
                v["unmet_demand"] = num(c.unmet_demand);
                v["suppliers"] = Value::Array(
                    c.suppliers
                        .iter()
                        .map(|&(p, amount, _)| json!({"id": p, "amount": num(amount)}))
                        .collect(),
                );
            }
        }
        v
    }

    /// The consumer price cap a utility's prompt shows. The reference prints
    /// `regulator_max * self.production`, and a utility's production is the demand of its
    /// last update, so the cap it reads lags demand by a step (and reads 25, from the starting
    /// production, before anything happened; 0 after the hidden round).
    fn shown_cap(&self, world: &Market, c: &world::Company) -> Option<f64> {
        match self.cfg.rules {
            Rules::Fixed => self.cfg.cap(world.demand),
            Rules::Reference => self.cfg.cap(c.production),
        }
    }

    /// A producer's own figures (`company`) and what it sees of its market (`context`):
    /// its buyers and how far it may move its price and production.
    fn producer_turn(
        &self,
        world: &Market,
        c: &world::Company,
        me: &mut Value,
        context: &mut Value,
    ) {
        for (k, v) in [
            ("production", c.production),
            ("max_capacity", c.max_capacity),
            ("energy_price", c.energy_price),
            ("production_cost", c.production_cost),
            ("sold", c.sold),
        ] {
            me[k] = num(v);
        }
        context["buyers"] = Value::Array(
            c.buyers
                .iter()
                .map(|&(u, amount, price)| {
                    json!({"id": u, "amount": num(amount), "price": num(price),
                           "unmet_demand": num(world.companies[u as usize].unmet_demand)})
                })
                .collect(),
        );
        context["max_price_change"] = json!(self.cfg.price_change_limit().map(num));
        context["max_production_change"] = json!(self.cfg.production_change_limit().map(num));
    }
}

/// Prompts show money to the cent: long float tails only cost tokens.
fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// A number for a prompt: to the cent, and whole values without a decimal point
/// (`50000`, not `50000.0`).
fn num(x: f64) -> Value {
    let x = round2(x);
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

/// The population attribute that sets companies' personas.
const PERSONA: &str = "persona";

impl Scenario for EnergyMarket {
    type World = Market;
    type Decision = Decision;
    /// Unused: [`Records::state`] lays out the market's own table.
    type Row = ();

    const NAME: &'static str = "energy_market";

    fn roles() -> &'static [&'static str] {
        &["producer", "utility"]
    }

    /// Its trades, a table of their own.
    fn descriptor() -> Descriptor {
        Descriptor::new(Self::NAME, Self::roles()).with_tables(&[TRADES])
    }

    fn records(&self) -> &dyn Records<Self> {
        self
    }

    fn sizing(&self) -> Option<&dyn Sizing> {
        Some(self)
    }

    /// None: [`Records::state`] lays out the market's whole table.
    fn row(&self, _world: &Market, _agent: usize, _step: usize) -> Option<()> {
        None
    }

    fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        MarketConfig::from_table(table).map(Self::new)
    }

    /// A population may set personas (attribute `persona`, with the config's persona names
    /// as categories) in place of the uniform `persona_mix` draw.
    fn check_population(
        &self,
        population: &PopulationSpec,
        _sizes: &[usize],
    ) -> Result<(), ScenarioProblem> {
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
            "consumer_price_cap": num(c.consumer_price_cap),
            "regulator_max": num(c.regulator_max),
            "capacity_upgrade_cost": num(c.capacity_upgrade_cost),
            "capacity_upgrade_amount": num(c.capacity_upgrade_amount),
            "production_cost_penalty": num(c.production_cost_penalty),
            "max_renewable_mix": num(c.max_renewable_mix),
            "max_price_change": c.price_change_limit().map(num),
            "max_production_change": c.production_change_limit().map(num),
            "max_consumer_price": c.consumer_price_ceiling().map(num),
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
        // The reference's hidden round passes no market conditions, and nobody has been
        // told about its neighbours yet.
        let hidden = world.in_hidden_round(&self.cfg);
        let demand = if hidden { 0.0 } else { world.demand };
        let mut me = json!({
            "id": agent,
            "type": self.type_name(c.kind),
            "renewable": c.renewable,
            "resources": num(c.resources),
            "profit": num(c.profit),
            "revenue": num(c.revenue),
            "costs": num(c.costs),
        });
        let mut context = json!({
            "step": step + 1,
            "demand": num(demand),
            "persona": self.cfg.use_personas.then_some(persona),
            "persona_description": (self.cfg.use_personas && self.cfg.describe_personas)
                .then(|| self.cfg.personas[persona].clone()),
            "neighbours": if hidden {
                Vec::new()
            } else {
                c.links.iter().map(|&id| self.neighbour(world, id)).collect::<Vec<_>>()
            },
        });
        match c.role {
            Role::Producer => self.producer_turn(world, c, &mut me, &mut context),
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
                    me[k] = num(v);
                }
                me["suppliers"] = Value::Array(
                    c.suppliers
                        .iter()
                        .map(|&(p, amount, price)| {
                            let s = &world.companies[p as usize];
                            json!({"id": p, "type": self.type_name(s.kind),
                                   "amount": num(amount), "price": num(price),
                                   "max_capacity": num(s.max_capacity)})
                        })
                        .collect(),
                );
                // Under the fixed rules the active utilities split demand equally; under the
                // reference's, each serves all of it.
                let utilities = world.active_utilities();
                let share = match self.cfg.rules {
                    Rules::Fixed => demand / utilities.max(1) as f64,
                    Rules::Reference => demand,
                };
                context["split_demand"] = json!(self.cfg.rules == Rules::Fixed);
                context["utilities"] = json!(utilities);
                context["demand_share"] = num(share);
                context["price_cap"] = json!(self.shown_cap(world, c).map(num));
                context["max_consumer_price"] = json!(self.cfg.consumer_price_ceiling().map(num));
                context["max_renewable_mix"] = num(self.cfg.max_renewable_mix);
            }
        }
        context["company"] = me;
        let schema = match c.role {
            Role::Producer => self.producer_schema.clone(),
            // The reference cap follows demand, so its schema changes every step.
            Role::Utility if self.cfg.regulated && self.cfg.rules == Rules::Reference => {
                Arc::new(decision::utility_schema(&self.cfg, demand))
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
    ) -> Result<Parsed<Decision>, ParseError> {
        let (decision, clamps) =
            decision::parse(&self.cfg, &world.companies[agent], world.demand, value)?;
        Ok(Parsed { decision, clamps })
    }

    fn no_change(&self, world: &Market, agent: usize) -> Decision {
        let c = &world.companies[agent];
        match c.role {
            Role::Producer => Decision::Producer(decision::ProducerDecision {
                production_change: 0.0,
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

    fn resolve(
        &self,
        world: &mut Market,
        _population: &Population,
        decisions: &[Option<Decision>],
        rng: &mut ChaCha8Rng,
    ) {
        rules::resolve(&self.cfg, world, decisions, rng);
    }
}

/// The market's records: its state table in its own layout, its trades, and its network.
impl Records<EnergyMarket> for EnergyMarket {
    /// The market keeps the column layout of its first records (company type before role,
    /// arm as plain text), which the runner's keys would reorder.
    fn state(
        &self,
        world: &Market,
        _population: &Population,
        cell: &CellInfo,
        step: usize,
    ) -> Option<RecordBatch> {
        Some(
            serde_arrow::to_record_batch(&self.fields, &self.rows(world, cell, step))
                .expect("invariant: rows fit the traced schema"),
        )
    }

    fn table(
        &self,
        name: &str,
        world: &Market,
        cell: &CellInfo,
        step: usize,
    ) -> Option<RecordBatch> {
        (name == TRADES).then(|| {
            serde_arrow::to_record_batch(&self.trade_fields, &self.trades(world, cell, step))
                .expect("invariant: trades fit the traced schema")
        })
    }

    /// The network, and the arm's settings that the report needs to read the records.
    fn describe(&self, world: &Market) -> Value {
        json!({
            "market": settings::CellSettings::of(&self.cfg),
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

impl Sizing for EnergyMarket {
    fn memory(&self, agents: f64, _steps: f64) -> Vec<MemoryPart> {
        let draws = self.cfg.max_connections as f64;
        // A company's links are distinct others; it draws up to max_connections of them.
        let links = draws.min((agents - 1.0).max(0.0));
        vec![
            MemoryPart::new(
                "the companies, and a step's state and trade rows",
                "agents or replicates",
                agents * COMPANY_BYTES,
            ),
            MemoryPart::new(
                "the companies' links, and the trades along them",
                "max_connections, agents or replicates",
                agents * links * LINK_BYTES,
            ),
            // The draws of one company before duplicates go (a vector grown by doubling).
            MemoryPart::once(
                "drawing a company's links",
                "max_connections",
                draws * 2.0 * std::mem::size_of::<u32>() as f64,
            ),
        ]
    }
}

/// A company of a cell: itself, the share of the network (`cells.jsonl`), and its rows in a
/// step's state and checkpoint as they are built (measured at about 2.2 kB beside its links).
const COMPANY_BYTES: f64 = 2304.0;
/// A link of a company: itself, its utility's purchases and its producer's sales along it,
/// their trade rows and its place in `cells.jsonl` (measured at about 150 bytes).
const LINK_BYTES: f64 = 160.0;
