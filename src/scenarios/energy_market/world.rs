//! The market's state: companies, their links, and demand.

use super::config::{MarketConfig, Role};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// One company. Indices (`kind`, `persona`) point into the config's lists, so that a
/// million companies stay small.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Company {
    pub kind: u16,
    pub persona: u16,
    pub role: Role,
    pub renewable: bool,
    /// Companies it is linked to (its neighbours and, for a utility, its possible suppliers).
    pub links: Vec<u32>,
    /// Out of the market after its resources went negative (fixed rules only).
    pub bankrupt: bool,
    pub resources: f64,
    /// Units produced (producers) or demanded (utilities) last step.
    pub production: f64,
    pub max_capacity: f64,
    /// Producer's price per unit.
    pub energy_price: f64,
    /// Utility's price per unit to consumers.
    pub cost_to_consumer: f64,
    pub production_cost: f64,
    // What happened last step.
    pub profit: f64,
    pub revenue: f64,
    pub costs: f64,
    /// Units a producer sold.
    pub sold: f64,
    /// Units a utility bought (and delivered).
    pub bought: f64,
    /// Of which from renewable producers.
    pub bought_renewable: f64,
    pub unmet_demand: f64,
    pub renewable_mix: f64,
    pub upgraded: bool,
    /// A utility's purchases: (producer, units, price).
    pub suppliers: Vec<(u32, f64, f64)>,
    /// A producer's sales, as its buyers recorded them: (utility, units, price).
    #[serde(default)]
    pub buyers: Vec<(u32, f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Market {
    pub companies: Vec<Company>,
    pub demand: f64,
    /// Steps resolved so far.
    pub steps: usize,
}

impl Market {
    /// A market of `n` companies: company 0 of `first_type`, the others drawn from
    /// `type_mix`, personas from `persona_mix`, each linked to 2 to 8 (by default) others.
    pub fn new(cfg: &MarketConfig, n: usize, rng: &mut ChaCha8Rng) -> Self {
        let type_names: Vec<&String> = cfg.company_types.keys().collect();
        let persona_names: Vec<&String> = cfg.personas.keys().collect();
        let index_of = |names: &[&String], name: &str| {
            names
                .iter()
                .position(|n| *n == name)
                .expect("invariant: checked by config") as u16
        };
        let mut companies: Vec<Company> = (0..n)
            .map(|i| {
                let kind_name = if i == 0 {
                    cfg.first_type.as_str()
                } else {
                    cfg.type_mix[rng.random_range(0..cfg.type_mix.len())].as_str()
                };
                let persona_name = &cfg.persona_mix[rng.random_range(0..cfg.persona_mix.len())];
                let kind = &cfg.company_types[kind_name];
                Company {
                    kind: index_of(&type_names, kind_name),
                    persona: index_of(&persona_names, persona_name),
                    role: kind.role,
                    renewable: kind.renewable,
                    links: Vec::new(),
                    bankrupt: false,
                    resources: cfg.starting_resources,
                    production: cfg.starting_production,
                    max_capacity: cfg.max_capacity,
                    energy_price: if kind.role == Role::Producer {
                        cfg.starting_energy_price
                    } else {
                        0.0
                    },
                    cost_to_consumer: if kind.role == Role::Utility {
                        cfg.starting_consumer_price
                    } else {
                        0.0
                    },
                    production_cost: cfg.production_cost,
                    profit: 0.0,
                    revenue: 0.0,
                    costs: 0.0,
                    sold: 0.0,
                    bought: 0.0,
                    bought_renewable: 0.0,
                    unmet_demand: 0.0,
                    renewable_mix: 0.0,
                    upgraded: false,
                    suppliers: Vec::new(),
                    buyers: Vec::new(),
                }
            })
            .collect();
        // As the reference: each company draws its number of links, then that many random
        // companies, skipping itself (so links can be fewer, and are directed).
        for (i, company) in companies.iter_mut().enumerate() {
            let draws = rng.random_range(cfg.min_connections..=cfg.max_connections);
            let mut links: Vec<u32> = (0..draws)
                .map(|_| rng.random_range(0..n) as u32)
                .filter(|&j| j as usize != i)
                .collect();
            links.sort_unstable();
            links.dedup();
            // The draws may have been many more than the distinct links they left.
            links.shrink_to_fit();
            company.links = links;
        }
        Self {
            companies,
            demand: cfg.starting_demand,
            steps: 0,
        }
    }

    /// Whether the coming step is the reference's hidden round (demand 0, before step 1).
    pub fn in_hidden_round(&self, cfg: &MarketConfig) -> bool {
        cfg.hidden_round() && self.steps == 0
    }

    /// Each producer's buyers, from the utilities' purchases of the last step.
    pub(super) fn record_buyers(&mut self) {
        for c in &mut self.companies {
            c.buyers.clear();
        }
        for u in 0..self.companies.len() {
            for i in 0..self.companies[u].suppliers.len() {
                let (p, units, price) = self.companies[u].suppliers[i];
                self.companies[p as usize]
                    .buyers
                    .push((u as u32, units, price));
            }
        }
    }

    pub fn active_utilities(&self) -> usize {
        self.companies
            .iter()
            .filter(|c| c.role == Role::Utility && !c.bankrupt)
            .count()
    }
}
