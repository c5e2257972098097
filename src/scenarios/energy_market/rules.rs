//! How a step's decisions change the market: the fixed rules (throng's default) and the
//! reference code's rules, side by side. docs/src/energy-market-rules.md lists the
//! differences rule by rule.

use super::config::{MarketConfig, REFERENCE_MIX_CLIP, Role, Rules};
use super::decision::{Decision, ProducerDecision};
use super::world::{Company, Market};
use rand::Rng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Applies every company's decision at once, then moves demand.
pub fn resolve(
    cfg: &MarketConfig,
    market: &mut Market,
    decisions: &[Option<Decision>],
    rng: &mut ChaCha8Rng,
) {
    let hidden = market.in_hidden_round(cfg);
    match cfg.rules {
        Rules::Fixed => fixed(cfg, market, decisions, rng),
        Rules::Reference => reference(cfg, market, decisions, hidden),
    }
    market.record_buyers();
    // Inelastic consumers: demand drifts by a uniform step, whatever the prices. The
    // reference's hidden round passes no market conditions and leaves demand as it was.
    if !hidden {
        market.demand =
            (market.demand + rng.random_range(-cfg.demand_step..=cfg.demand_step)).max(0.0);
    }
    market.steps += 1;
}

/// A producer's own move, the same under both rule sets: output within 0..=capacity, price
/// not below cost, production paid for (at the cost before any upgrade), capacity bought if
/// affordable.
fn produce(cfg: &MarketConfig, c: &mut Company, d: &ProducerDecision) {
    c.production = (c.production + d.production_change).clamp(0.0, c.max_capacity);
    c.energy_price = (c.energy_price + d.energy_price_change).max(c.production_cost);
    c.costs = c.production_cost * c.production;
    if d.upgrade_capacity && c.resources >= cfg.capacity_upgrade_cost {
        c.resources -= cfg.capacity_upgrade_cost;
        c.max_capacity += cfg.capacity_upgrade_amount;
        c.production_cost += cfg.production_cost_penalty;
        c.upgraded = true;
    }
}

/// Producers set output and price; each utility, in a random order, serves its share of
/// demand by buying from its linked producers, cheapest first (renewables ranked cheaper by
/// its preference), never more than a producer has left. Producers earn only what they sell
/// but pay for all they produce; utilities earn their price on what they deliver; a company
/// whose resources go negative leaves the market.
fn fixed(
    cfg: &MarketConfig,
    market: &mut Market,
    decisions: &[Option<Decision>],
    rng: &mut ChaCha8Rng,
) {
    let demand = market.demand;
    for (c, decision) in market.companies.iter_mut().zip(decisions) {
        c.profit = 0.0;
        c.revenue = 0.0;
        c.costs = 0.0;
        c.sold = 0.0;
        c.bought = 0.0;
        c.bought_renewable = 0.0;
        c.unmet_demand = 0.0;
        c.upgraded = false;
        c.suppliers.clear();
        if c.bankrupt {
            c.production = 0.0;
            continue;
        }
        match decision {
            Some(Decision::Producer(d)) => produce(cfg, c, d),
            Some(Decision::Utility(d)) => {
                let top = cfg.consumer_price_max(demand).unwrap_or(f64::INFINITY);
                c.cost_to_consumer = d.cost_to_consumer.clamp(0.0, top);
                let (lo, hi) = cfg.renewable_mix_range();
                c.renewable_mix = d.adjust_renewable_mix.clamp(lo, hi) as f64;
            }
            None if c.role == Role::Producer => c.costs = c.production_cost * c.production,
            None => {}
        }
    }
    let utilities: Vec<usize> = (0..market.companies.len())
        .filter(|&i| market.companies[i].role == Role::Utility && !market.companies[i].bankrupt)
        .collect();
    let share = if utilities.is_empty() {
        0.0
    } else {
        demand / utilities.len() as f64
    };
    let mut stock: Vec<f64> = market
        .companies
        .iter()
        .map(|c| {
            if c.role == Role::Producer && !c.bankrupt {
                c.production
            } else {
                0.0
            }
        })
        .collect();
    let mut order = utilities;
    order.shuffle(rng);
    for u in order {
        let offers = offers(cfg, market, u);
        let mut need = share;
        for (_, p) in offers {
            if need <= 0.0 {
                break;
            }
            let amount = need.min(stock[p as usize]);
            if amount <= 0.0 {
                continue;
            }
            stock[p as usize] -= amount;
            need -= amount;
            let (price, renewable) = {
                let producer = &mut market.companies[p as usize];
                producer.sold += amount;
                producer.revenue += amount * producer.energy_price;
                (producer.energy_price, producer.renewable)
            };
            let utility = &mut market.companies[u];
            utility.bought += amount;
            if renewable {
                utility.bought_renewable += amount;
            }
            utility.costs += amount * price;
            utility.suppliers.push((p, amount, price));
        }
        let utility = &mut market.companies[u];
        utility.production = share;
        utility.unmet_demand = need.max(0.0);
        utility.revenue = utility.cost_to_consumer * utility.bought;
    }
    for c in market.companies.iter_mut().filter(|c| !c.bankrupt) {
        c.profit = c.revenue - c.costs;
        c.resources += c.profit;
        if c.resources < 0.0 {
            c.bankrupt = true;
        }
    }
}

/// The offers utility `u` sees, `(price as ranked, producer)`: its linked producers still in
/// the market, cheapest first, a renewable one's price discounted by the utility's
/// preference for renewables; ties go to the lower id.
fn offers(cfg: &MarketConfig, market: &Market, u: usize) -> Vec<(f64, u32)> {
    let mix = market.companies[u].renewable_mix;
    let mut offers: Vec<(f64, u32)> = market.companies[u]
        .links
        .iter()
        .filter(|&&p| {
            let p = &market.companies[p as usize];
            p.role == Role::Producer && !p.bankrupt
        })
        .map(|&p| {
            let producer = &market.companies[p as usize];
            let discount = if producer.renewable {
                1.0 + cfg.renewable_discount * mix
            } else {
                1.0
            };
            (producer.energy_price / discount, p)
        })
        .collect();
    offers.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    offers
}

/// energyABM_LLM_ollama.py's `update_state`, with its quirks: producers are paid for all
/// they produce; every utility serves the whole demand, buying from its linked producers by
/// last step's price and output (a renewable's price multiplied by `mix + 1`, so a
/// preference for renewables ranks them as dearer, and a negative one, which the clip to
/// +/-100 allows, as cheaper) and paying last step's price, so two utilities can buy the same
/// output, and is paid for the whole demand even when some of it goes unmet; the cap is
/// `regulator_max` times the demand; nobody goes bankrupt. In the `hidden` round (the one
/// `get_network_data` runs before step 1) demand is 0: utilities buy and sell nothing and
/// their price is capped at 0, while producers produce and are paid as in any step.
fn reference(
    cfg: &MarketConfig,
    market: &mut Market,
    decisions: &[Option<Decision>],
    hidden: bool,
) {
    let demand = if hidden { 0.0 } else { market.demand };
    let before = market.companies.clone();
    for (c, decision) in market.companies.iter_mut().zip(decisions) {
        c.upgraded = false;
        match decision {
            Some(Decision::Producer(d)) => {
                produce(cfg, c, d);
                // Paid for everything it made.
                c.sold = c.production;
                c.revenue = c.energy_price * c.production;
                c.profit = c.revenue - c.costs;
            }
            Some(Decision::Utility(d)) => {
                c.production = demand;
                c.renewable_mix =
                    d.adjust_renewable_mix
                        .clamp(-REFERENCE_MIX_CLIP, REFERENCE_MIX_CLIP) as f64;
                let mut offers: Vec<(f64, u32)> = c
                    .links
                    .iter()
                    .filter(|&&p| before[p as usize].role != Role::Utility)
                    .map(|&p| {
                        let s = &before[p as usize];
                        let metric = if s.renewable {
                            s.energy_price * (c.renewable_mix + 1.0)
                        } else {
                            s.energy_price
                        };
                        (metric, p)
                    })
                    .collect();
                // Python's sort is stable: equal metrics keep link order.
                offers.sort_by(|a, b| a.0.total_cmp(&b.0));
                c.suppliers.clear();
                c.bought = 0.0;
                c.bought_renewable = 0.0;
                c.costs = 0.0;
                let mut remaining = demand;
                for (_, p) in offers {
                    if remaining <= 0.0 {
                        break;
                    }
                    let s = &before[p as usize];
                    let amount = remaining.min(s.production);
                    remaining -= amount;
                    c.bought += amount;
                    if s.renewable {
                        c.bought_renewable += amount;
                    }
                    c.costs += s.energy_price * amount;
                    c.suppliers.push((p, amount, s.energy_price));
                }
                let top = cfg.consumer_price_max(demand).unwrap_or(f64::INFINITY);
                c.cost_to_consumer = d.cost_to_consumer.min(top);
                c.revenue = c.cost_to_consumer * demand;
                c.profit = c.revenue - c.costs;
                c.unmet_demand = (c.production - c.bought).max(0.0);
            }
            None => c.profit = 0.0,
        }
        c.resources += c.profit;
    }
}
