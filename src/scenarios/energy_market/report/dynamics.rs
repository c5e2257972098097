//! Experiment 2's three dynamics, measured on the records (the study describes them from
//! its Figure 4):
//! - (a) a producer that raises its price loses sales and walks the price back;
//! - (b) the cheapest producer creeps its price up while staying the cheapest;
//! - (c) a utility with a single supplier still profits.

use super::data::Cell;
use crate::analysis::stats::{Method, Summary};
use crate::scenarios::energy_market::config::Role;
use serde::Serialize;
use std::collections::BTreeSet;

/// (a) One price rise that lost sales.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Episode {
    pub producer: usize,
    /// The step whose decision raised the price.
    pub raised_at: usize,
    /// The step in which buyers bought less than the step before, the first that saw the
    /// new price.
    pub lost_at: usize,
    /// The first step that cut the price again, if it came before any further rise.
    pub walked_back_at: Option<usize>,
    /// Whether the sales went to a rival: a utility that bought from this producer the step
    /// before bought from another producer in `lost_at`. False when the buyers simply left
    /// (bankrupt, or demand fell), which is not the competition the study describes.
    pub to_rival: bool,
}

impl Episode {
    /// Steps from the rise to the cut.
    pub fn lag(&self) -> Option<usize> {
        self.walked_back_at.map(|u| u - self.raised_at)
    }
}

/// What one producer's price did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PriceMoves {
    pub raises: usize,
    /// Rises followed by lost sales, walked back or not.
    pub episodes: Vec<Episode>,
}

/// Finds (a) in one producer's series. `prices[k]` and `sales[k]` are its price and the units
/// bought from it after step `first + k`; element 0 is the state the first step started
/// from, when nothing has been bought yet. A rise at `k` is seen by buyers at `k + delay` (0 when the market clears on this
/// step's prices, 1 when on last step's); sales lost there, against the step before, make
/// an episode, which is walked back if the next price change after the rise is a cut.
pub(crate) fn price_moves(
    producer: usize,
    first: usize,
    prices: &[f64],
    sales: &[f64],
    delay: usize,
) -> PriceMoves {
    let n = prices.len().min(sales.len());
    let mut moves = PriceMoves::default();
    for k in 1..n {
        if prices[k] <= prices[k - 1] {
            continue;
        }
        moves.raises += 1;
        let v = k + delay;
        if v >= n || sales[v] >= sales[v - 1] {
            continue;
        }
        let next_change = (k + 1..n).find(|&u| prices[u] != prices[u - 1]);
        moves.episodes.push(Episode {
            producer,
            raised_at: first + k,
            lost_at: first + v,
            walked_back_at: next_change
                .filter(|&u| prices[u] < prices[u - 1])
                .map(|u| first + u),
            to_rival: false,
        });
    }
    moves
}

/// (a) for every producer of a cell, over the market's steps (the state before the first
/// of them included as the baseline), each series cut at the producer's bankruptcy.
pub fn cell_price_moves(cell: &Cell) -> Vec<PriceMoves> {
    let first = cell.first_market_step() - 1;
    let agents = cell.steps[0].len();
    (0..agents)
        .filter(|&a| cell.steps[0][a].role == Role::Producer)
        .map(|a| {
            let steps: Vec<usize> = (first..=cell.last_step())
                .take_while(|&s| s == first || cell.traded(s, a))
                .collect();
            let prices: Vec<f64> = steps
                .iter()
                .map(|&s| cell.steps[s][a].energy_price)
                .collect();
            let sales: Vec<f64> = steps.iter().map(|&s| cell.sales(s, a)).collect();
            let mut moves = price_moves(a, first, &prices, &sales, cell.response_delay());
            for e in &mut moves.episodes {
                e.to_rival = lost_to_rival(cell, a, e.lost_at);
            }
            moves
        })
        .collect()
}

/// Whether a utility that bought from `producer` in the step before `step` bought from
/// another producer in `step`.
fn lost_to_rival(cell: &Cell, producer: usize, step: usize) -> bool {
    let (Some(now), Some(before)) = (cell.trades.get(step), cell.trades.get(step - 1)) else {
        return false;
    };
    before.iter().filter(|t| t.producer == producer).any(|t| {
        now.iter()
            .any(|x| x.utility == t.utility && x.producer != producer)
    })
}

/// (b) in one cell: steps in which the market's cheapest producer (alone at the lowest
/// price the step before) raised its price and was still no dearer than any other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Creep {
    /// Steps with a single cheapest producer the step before.
    pub chances: usize,
    pub creeps: usize,
    /// Sum of those rises.
    pub amount: f64,
}

pub fn cell_creep(cell: &Cell) -> Creep {
    let mut out = Creep::default();
    for t in cell.first_market_step()..=cell.last_step() {
        let before: Vec<(usize, f64)> = cell
            .present_rows(t - 1, Role::Producer)
            .map(|r| (r.agent, r.energy_price))
            .collect();
        let Some(low) = before.iter().map(|b| b.1).reduce(f64::min) else {
            continue;
        };
        let cheapest: Vec<usize> = before.iter().filter(|b| b.1 == low).map(|b| b.0).collect();
        let [c] = cheapest[..] else { continue };
        if !cell.traded(t, c) {
            continue;
        }
        out.chances += 1;
        let now = cell.steps[t][c].energy_price;
        let others = cell
            .present_rows(t, Role::Producer)
            .filter(|r| r.agent != c)
            .map(|r| r.energy_price)
            .reduce(f64::min)
            .unwrap_or(f64::INFINITY);
        if now > low && now <= others {
            out.creeps += 1;
            out.amount += now - low;
        }
    }
    out
}

/// (c) One utility in one step, by how many producers it bought from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct UtilityStep {
    pub suppliers: usize,
    pub profit: f64,
    /// Single supplier only: its price less the mean price of the market's producers.
    pub supplier_price_gap: Option<f64>,
    /// Single supplier only: whether it also sold to other utilities that step.
    pub supplier_sells_to_others: Option<bool>,
}

pub(crate) fn cell_utility_steps(cell: &Cell) -> Vec<UtilityStep> {
    let mut out = Vec::new();
    for t in cell.market_steps() {
        let trades = &cell.trades[t];
        let prices: Vec<f64> = cell
            .present_rows(t, Role::Producer)
            .map(|r| r.energy_price)
            .collect();
        let market_price = prices.iter().sum::<f64>() / prices.len().max(1) as f64;
        for u in cell.present_rows(t, Role::Utility) {
            let suppliers: BTreeSet<usize> = trades
                .iter()
                .filter(|x| x.utility == u.agent)
                .map(|x| x.producer)
                .collect();
            let single = (suppliers.len() == 1).then(|| *suppliers.first().expect("one"));
            out.push(UtilityStep {
                suppliers: suppliers.len(),
                profit: u.profit,
                supplier_price_gap: single.map(|p| cell.steps[t][p].energy_price - market_price),
                supplier_sells_to_others: single.map(|p| {
                    trades
                        .iter()
                        .any(|x| x.producer == p && x.utility != u.agent)
                }),
            });
        }
    }
    out
}

/// One producer's episodes of (a) in one market.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProducerEpisodes {
    pub replicate: usize,
    pub raises: usize,
    pub episodes: Vec<Episode>,
}

/// The three dynamics over the replicates of one arm and population.
#[derive(Debug, Clone, Serialize)]
pub struct Dynamics {
    pub producers: usize,
    pub raises: usize,
    /// (a) rises that lost sales, and of those the ones walked back.
    pub episodes: usize,
    pub walked_back: usize,
    /// (a) of the episodes, those whose sales went to a rival (not to buyers leaving).
    pub to_rival: usize,
    /// (a) rises that lost sales in each replicate, in the replicates' order.
    pub episodes_by_replicate: Vec<usize>,
    /// (a) every producer with at least one such episode: which market, which producer, and
    /// each episode's steps (in `summary.json`, for a reader who wants the series).
    pub producers_with_episodes: Vec<ProducerEpisodes>,
    /// (a) per producer, replicate means with their interval.
    pub episodes_per_producer: Option<Summary>,
    /// (a) producers with at least one walked-back episode.
    pub producers_walking_back: usize,
    /// (a) lags of walked-back episodes: `lags[i]` episodes took `i + 1` steps.
    pub lags: Vec<usize>,
    /// (b) per replicate.
    pub creep: Vec<Creep>,
    pub creeps_per_replicate: Option<Summary>,
    /// (c) utility-steps with one supplier, of them profitable, and the same with more.
    pub single_supplier_steps: usize,
    pub single_supplier_profitable: usize,
    pub multi_supplier_steps: usize,
    pub multi_supplier_profitable: usize,
    /// (c) the share of single-supplier steps that were profitable, replicate means.
    pub single_supplier_profitable_share: Option<Summary>,
    pub single_supplier_profit: Option<Summary>,
    /// (c) single-supplier steps whose supplier also sold to others, and its mean price
    /// gap to the market.
    pub supplier_sells_to_others: usize,
    pub supplier_price_gap: Option<Summary>,
}

pub fn dynamics(cells: &[&Cell]) -> Dynamics {
    let moves: Vec<Vec<PriceMoves>> = cells.iter().map(|c| cell_price_moves(c)).collect();
    let all = || moves.iter().flatten();
    let episodes: Vec<&Episode> = all().flat_map(|m| &m.episodes).collect();
    let mut lags = Vec::new();
    for lag in episodes.iter().filter_map(|e| e.lag()) {
        if lags.len() < lag {
            lags.resize(lag, 0);
        }
        lags[lag - 1] += 1;
    }
    let per_producer: Vec<f64> = moves
        .iter()
        .filter(|m| !m.is_empty())
        .map(|m| m.iter().map(|p| p.episodes.len()).sum::<usize>() as f64 / m.len() as f64)
        .collect();
    let creep: Vec<Creep> = cells.iter().map(|c| cell_creep(c)).collect();
    let steps: Vec<Vec<UtilityStep>> = cells.iter().map(|c| cell_utility_steps(c)).collect();
    let single = || steps.iter().flatten().filter(|s| s.suppliers == 1);
    let multi = || steps.iter().flatten().filter(|s| s.suppliers > 1);
    let share_per_replicate: Vec<f64> = steps
        .iter()
        .filter_map(|s| {
            let singles: Vec<&UtilityStep> = s.iter().filter(|s| s.suppliers == 1).collect();
            (!singles.is_empty()).then(|| {
                singles.iter().filter(|s| s.profit > 0.0).count() as f64 / singles.len() as f64
            })
        })
        .collect();
    let mean_profit_per_replicate: Vec<f64> = steps
        .iter()
        .filter_map(|s| {
            let p: Vec<f64> = s
                .iter()
                .filter(|s| s.suppliers == 1)
                .map(|s| s.profit)
                .collect();
            (!p.is_empty()).then(|| p.iter().sum::<f64>() / p.len() as f64)
        })
        .collect();
    let gap_per_replicate: Vec<f64> = steps
        .iter()
        .filter_map(|s| {
            let g: Vec<f64> = s.iter().filter_map(|s| s.supplier_price_gap).collect();
            (!g.is_empty()).then(|| g.iter().sum::<f64>() / g.len() as f64)
        })
        .collect();
    Dynamics {
        producers: all().count(),
        raises: all().map(|m| m.raises).sum(),
        episodes: episodes.len(),
        walked_back: episodes
            .iter()
            .filter(|e| e.walked_back_at.is_some())
            .count(),
        to_rival: episodes.iter().filter(|e| e.to_rival).count(),
        episodes_by_replicate: moves
            .iter()
            .map(|m| m.iter().map(|p| p.episodes.len()).sum())
            .collect(),
        producers_with_episodes: cells
            .iter()
            .zip(&moves)
            .flat_map(|(c, m)| {
                m.iter()
                    .filter(|p| !p.episodes.is_empty())
                    .map(|p| ProducerEpisodes {
                        replicate: c.replicate,
                        raises: p.raises,
                        episodes: p.episodes.clone(),
                    })
            })
            .collect(),
        episodes_per_producer: Summary::with(Method::BootstrapPercentile, &per_producer),
        producers_walking_back: all()
            .filter(|m| m.episodes.iter().any(|e| e.walked_back_at.is_some()))
            .count(),
        lags,
        creeps_per_replicate: Summary::with(
            Method::BootstrapPercentile,
            &creep.iter().map(|c| c.creeps as f64).collect::<Vec<_>>(),
        ),
        creep,
        single_supplier_steps: single().count(),
        single_supplier_profitable: single().filter(|s| s.profit > 0.0).count(),
        multi_supplier_steps: multi().count(),
        multi_supplier_profitable: multi().filter(|s| s.profit > 0.0).count(),
        single_supplier_profitable_share: Summary::with(
            Method::BootstrapPercentile,
            &share_per_replicate,
        ),
        single_supplier_profit: Summary::of(&mean_profit_per_replicate),
        supplier_sells_to_others: single()
            .filter(|s| s.supplier_sells_to_others == Some(true))
            .count(),
        supplier_price_gap: Summary::of(&gap_per_replicate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_that_loses_sales_and_is_cut_is_one_episode_with_its_lag() {
        // Steps 0..=6: rise at 1 (sales fall at 1), held at 2, cut at 3 -> lag 2. Rise at 4
        // without lost sales: no episode. Rise at 5 that loses sales, then another rise at
        // 6: not walked back.
        let prices = [50.0, 55.0, 55.0, 52.0, 53.0, 54.0, 56.0];
        let sales = [0.0, 100.0, 60.0, 80.0, 90.0, 70.0, 70.0];
        // With the market clearing on this step's prices, the rise at 1 is seen at 1, but
        // sales at 0 are the start (nothing sold yet), so it cannot lose; at 5 it does.
        let m = price_moves(7, 0, &prices, &sales, 0);
        assert_eq!(m.raises, 4);
        assert_eq!(
            m.episodes,
            vec![Episode {
                producer: 7,
                raised_at: 5,
                lost_at: 5,
                walked_back_at: None,
                to_rival: false,
            }]
        );
        // Seen a step later (the reference's clearing): the rise at 1 loses at 2 and is cut
        // at 3, lag 2; the rise at 4 loses at 5 but the next change is another rise.
        let m = price_moves(7, 0, &prices, &sales, 1);
        assert_eq!(m.episodes.len(), 2);
        assert_eq!(m.episodes[0].lost_at, 2);
        assert_eq!(m.episodes[0].walked_back_at, Some(3));
        assert_eq!(m.episodes[0].lag(), Some(2));
        assert_eq!((m.episodes[1].raised_at, m.episodes[1].lost_at), (4, 5));
        assert_eq!(m.episodes[1].walked_back_at, None);
        // Steps are reported as the run's: offset by the first step of the series.
        assert_eq!(
            price_moves(7, 10, &prices, &sales, 1).episodes[0].raised_at,
            11
        );
    }
}
