//! The `scripted` policy: simple, deterministic rules of thumb, as a classic agent-based
//! model would use, so that a run needs no model (baselines, fast tests, scaling runs).

use super::config::{MarketConfig, Persona, Role};
use super::decision::{Decision, ProducerDecision, UtilityDecision};
use super::world::Market;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Producers chase sales: sold out raises price and output, unsold output lowers both;
/// capacity is bought when output is at capacity and resources allow it twice over.
/// Utilities mark up their purchase price by a margin that depends on the persona, and the
/// environmentally conscious favour renewables. Without personas in the prompts (a control
/// arm) nobody is told its persona, so every utility follows the neutral rule; so does a
/// utility with a persona of the config's own, which these rules know nothing of.
pub fn decide(cfg: &MarketConfig, market: &Market, agent: usize, rng: &mut ChaCha8Rng) -> Decision {
    let c = &market.companies[agent];
    let persona = cfg.use_personas.then(|| cfg.persona(c.persona)).flatten();
    match c.role {
        Role::Producer => {
            let first_step = market.steps == 0;
            let sell_through = if c.production > 0.0 {
                c.sold / c.production
            } else {
                1.0
            };
            let (production_change, price_change) = if first_step || sell_through >= 0.95 {
                (10.0, 1.0)
            } else if sell_through < 0.5 {
                (-((c.production - c.sold) / 2.0).round(), -1.0)
            } else {
                (0.0, 0.0)
            };
            // A little noise, from the agent's own stream, keeps identical producers apart.
            let noise = (rng.random_range(-2..=2) as f64) * 0.5;
            Decision::Producer(ProducerDecision {
                // Whole units, within 0..=capacity (as the integer casts always did).
                production_change: production_change.clamp(
                    -c.production.trunc(),
                    (c.max_capacity - c.production).trunc(),
                ),
                energy_price_change: (price_change + noise).max(c.production_cost - c.energy_price),
                upgrade_capacity: c.production >= c.max_capacity
                    && c.resources >= 2.0 * cfg.capacity_upgrade_cost,
            })
        }
        Role::Utility => {
            let average_price = if c.bought > 0.0 {
                c.costs / c.bought
            } else {
                cfg.starting_energy_price
            };
            let margin = match persona {
                Some(Persona::Greedy) => 0.30,
                Some(Persona::EnvironmentallyConscious) => 0.10,
                Some(Persona::Depressed) => 0.05,
                None => 0.15,
            };
            let mix = match persona {
                Some(Persona::EnvironmentallyConscious) => 8,
                Some(Persona::Greedy) => 0,
                Some(Persona::Depressed) => rng.random_range(0..=3),
                None => 2,
            };
            let cap = cfg
                .consumer_price_max(market.demand)
                .unwrap_or(f64::INFINITY);
            Decision::Utility(UtilityDecision {
                cost_to_consumer: ((average_price * (1.0 + margin) * 100.0).round() / 100.0)
                    .min(cap),
                adjust_renewable_mix: mix,
            })
        }
    }
}
