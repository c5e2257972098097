//! The energy market's report, checked against the records by hand: no company drops out of
//! the statistics of the steps it traded in (survivorship bias), intervals and tests are
//! computed over replicate means, Holm's correction covers the report's family, and
//! Experiment 2's price-rise episodes are counted on a market scripted step by step.

mod common;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use throng::scenarios::energy_market::config::{MarketConfig, Role};
use throng::scenarios::energy_market::decision::{Decision, ProducerDecision, UtilityDecision};
use throng::scenarios::energy_market::report::{self, Cell, CellSettings, Run, dynamics};
use throng::scenarios::energy_market::world::Market;
use throng::scenarios::energy_market::{EnergyMarket, Row, rules};
use throng::sim::experiment::Overrides;
use throng::sim::runner::SimOptions;
use throng::sim::scenario::CellInfo;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a scripted experiment written from `body` into `dir/run` and returns that folder.
fn run_scripted(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    let templates = repo().join("templates/energy_market");
    std::fs::write(
        &path,
        format!("templates = {:?}\n{body}", templates.display().to_string()),
    )
    .unwrap();
    let out = dir.join("run");
    common::run_experiment(
        &path,
        &Overrides::default(),
        &out,
        SimOptions::default(),
        None,
    );
    out
}

/// Rows by (replicate, step, agent) of a single-arm, single-population run.
fn by_cell(dir: &Path) -> BTreeMap<usize, Vec<Vec<Row>>> {
    let batches = throng::record::read_state(dir).unwrap();
    let rows: Vec<Row> = throng::record::rows_of(&batches, dir).unwrap();
    let mut out: BTreeMap<usize, Vec<Vec<Row>>> = BTreeMap::new();
    for r in rows {
        let steps = out.entry(r.replicate).or_default();
        if steps.len() <= r.step {
            steps.resize(r.step + 1, Vec::new());
        }
        steps[r.step].push(r);
    }
    for steps in out.values_mut() {
        for s in steps.iter_mut() {
            s.sort_by_key(|r| r.agent);
        }
    }
    out
}

/// By hand: a utility's mean profit over the steps it traded in, i.e. every step `s >= 1`
/// it entered solvent (not bankrupt after step `s - 1`).
fn mean_profit_while_trading(steps: &[Vec<Row>], agent: usize) -> f64 {
    let v: Vec<f64> = (1..steps.len())
        .filter(|&s| !steps[s - 1][agent].bankrupt)
        .map(|s| steps[s][agent].profit)
        .collect();
    v.iter().sum::<f64>() / v.len() as f64
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn sd(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// A cap of 1 per unit against purchase prices of about 50: every utility that buys
/// anything in step 1 loses far more than its 100 of resources, and is bankrupt in that step.
const CRASH: &str = r#"name = "crash"
seed = 11
replicates = 3
steps = 3
policy = "scripted"
agents = 16

[scenario]
name = "energy_market"
regulated = true
consumer_price_cap = 1.0
starting_resources = 100.0
"#;

#[test]
fn a_utility_bankrupt_in_step_1_still_counts_its_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_scripted(tmp.path(), CRASH);
    let summary = report::report(&dir).unwrap();
    let cells = by_cell(&dir);

    // By hand, per persona: each replicate's utilities, their mean profit while trading, and
    // the step-1 profits of every utility (all were solvent at the start).
    let mut per_persona: BTreeMap<String, Vec<Vec<f64>>> = BTreeMap::new();
    let mut step1: BTreeMap<String, Vec<Vec<f64>>> = BTreeMap::new();
    let mut broke_in_step_1 = Vec::new();
    for (&replicate, steps) in &cells {
        for r in steps[0].iter().filter(|r| r.role == Role::Utility) {
            let groups = per_persona.entry(r.persona.clone()).or_default();
            groups.resize(cells.len(), Vec::new());
            groups[replicate].push(mean_profit_while_trading(steps, r.agent));
            let first = step1.entry(r.persona.clone()).or_default();
            first.resize(cells.len(), Vec::new());
            first[replicate].push(steps[1][r.agent].profit);
            if steps[1][r.agent].bankrupt {
                broke_in_step_1.push((replicate, r.agent, steps[1][r.agent].profit));
            }
        }
    }
    assert!(
        broke_in_step_1.len() >= 3,
        "the config bankrupts utilities in step 1: {broke_in_step_1:?}"
    );
    assert!(broke_in_step_1.iter().all(|b| b.2 < -100.0));

    let group = &summary.groups[0];
    for (persona, groups) in &per_persona {
        let stats = group
            .personas
            .iter()
            .find(|p| &p.persona == persona)
            .unwrap_or_else(|| panic!("{persona} has no row"));
        let utilities: usize = groups.iter().map(Vec::len).sum();
        // Every utility is in its persona's numbers, bankrupt or not.
        assert_eq!(stats.utilities, utilities);
        let agents = stats.profit.agents.unwrap();
        assert_eq!(agents.n, utilities, "{persona}: every utility counts");
        let means: Vec<f64> = groups
            .iter()
            .filter(|g| !g.is_empty())
            .map(|g| mean(g))
            .collect();
        let r = stats.profit.replicates.unwrap();
        assert_eq!(r.n, means.len());
        assert!((r.mean - mean(&means)).abs() < 1e-9, "{persona}: {r:?}");
        for &(replicate, agent, loss) in &broke_in_step_1 {
            if cells[&replicate][0][agent].persona == *persona {
                assert!(
                    agents.min <= loss,
                    "{persona}: the step-1 loss {loss} is in"
                );
            }
        }
    }

    // Figure 7's point at step 1 is the mean of the replicates' step-1 means, the bankrupted
    // utilities' losses included.
    let run = Run::read(&dir).unwrap();
    let fig7 = report::figures::profit_by_persona(&run);
    assert_eq!(fig7.panels.len(), 1);
    for (persona, groups) in &step1 {
        let band = fig7.panels[0]
            .series
            .iter()
            .find(|b| &b.name == persona)
            .unwrap();
        let (x, y, ..) = band.points[0];
        assert_eq!(x, 1.0);
        let means: Vec<f64> = groups
            .iter()
            .filter(|g| !g.is_empty())
            .map(|g| mean(g))
            .collect();
        assert!((y - mean(&means)).abs() < 1e-9, "{persona}: {y}");
    }

    // The Welch tests of profit count every replicate that had utilities of each persona.
    for t in summary
        .tests
        .iter()
        .filter(|t| t.quantity == "utility profit")
    {
        let persona = |side: &str| side.split_once(": ").unwrap().1.to_string();
        let n = |side: &str| {
            per_persona[&persona(side)]
                .iter()
                .filter(|g| !g.is_empty())
                .count()
        };
        assert_eq!((t.n_a, t.n_b), (n(&t.a), n(&t.b)), "{t:?}");
    }

    // Bankruptcy is listed, and the steps after it are shown as bankrupt, not left out.
    for &(replicate, agent, _) in &broke_in_step_1 {
        let b = summary
            .bankruptcies
            .iter()
            .find(|b| b.replicate == replicate && b.agent == agent)
            .unwrap();
        assert_eq!((b.step, b.steps_after), (1, 2));
    }
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("Bankruptcies") && html.contains("later steps (bankrupt)"));
    assert!(dir.join("fig3b_bankruptcies.png").exists());
}

const THREE_REPLICATES: &str = r#"name = "three"
seed = 5
replicates = 3
steps = 4
policy = "scripted"
agents = 24

[scenario]
name = "energy_market"
regulated = true
starting_resources = 10000.0
"#;

#[test]
fn intervals_and_tests_come_from_three_replicate_means() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_scripted(tmp.path(), THREE_REPLICATES);
    let summary = report::report(&dir).unwrap();
    let cells = by_cell(&dir);
    assert_eq!(cells.len(), 3);
    let group = &summary.groups[0];

    // Profit of a persona present in all three markets: Student's t over the 3 replicate
    // means, t(0.975, 2) = 4.3026527297 (scipy.stats.t.ppf).
    let mut checked = 0;
    for p in &group.personas {
        let means: Vec<f64> = cells
            .values()
            .filter_map(|steps| {
                let v: Vec<f64> = steps[0]
                    .iter()
                    .filter(|r| r.role == Role::Utility && r.persona == p.persona)
                    .map(|r| mean_profit_while_trading(steps, r.agent))
                    .collect();
                (!v.is_empty()).then(|| mean(&v))
            })
            .collect();
        if means.len() != 3 {
            continue;
        }
        let r = p.profit.replicates.unwrap();
        let half = 4.302_652_729_749 * sd(&means) / 3f64.sqrt();
        assert_eq!(r.n, 3);
        assert!((r.mean - mean(&means)).abs() < 1e-9, "{r:?}");
        assert!((r.ci_low - (mean(&means) - half)).abs() < 1e-6, "{r:?}");
        assert!((r.ci_high - (mean(&means) + half)).abs() < 1e-6, "{r:?}");
        checked += 1;
    }
    assert!(checked > 0, "some persona is in every market");

    // The consumer price at the end, a bounded quantity: the bootstrap percentile interval
    // of 3 distinct means is their range (each resample of all-lowest has chance 1/27, over
    // 2.5%).
    let end: Vec<f64> = cells
        .values()
        .map(|steps| {
            let last = steps.len() - 1;
            let v: Vec<f64> = steps[last]
                .iter()
                .filter(|r| r.role == Role::Utility && !steps[last - 1][r.agent].bankrupt)
                .map(|r| r.cost_to_consumer)
                .collect();
            mean(&v)
        })
        .collect();
    let r = group.consumer_price_end.replicates.unwrap();
    assert_eq!(r.n, 3);
    assert!((r.mean - mean(&end)).abs() < 1e-9);
    let lo = end.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = end.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(r.interval(), Some((lo, hi)));

    // Holm by hand over the report's family: sort the raw p-values, multiply the i-th
    // smallest (from 0) by m - i, keep the running maximum, cap at 1.
    let tested: Vec<&report::TestRow> =
        summary.tests.iter().filter(|t| t.welch.is_some()).collect();
    assert!(tested.len() >= 3, "{} tests", tested.len());
    let mut order: Vec<usize> = (0..tested.len()).collect();
    order.sort_by(|&a, &b| {
        tested[a]
            .welch
            .unwrap()
            .p
            .total_cmp(&tested[b].welch.unwrap().p)
    });
    let m = tested.len();
    let mut running: f64 = 0.0;
    for (i, &k) in order.iter().enumerate() {
        running = running.max(((m - i) as f64 * tested[k].welch.unwrap().p).min(1.0));
        let got = tested[k].holm_p.unwrap();
        assert!(
            (got - running).abs() < 1e-12,
            "test {k}: {got} vs {running}"
        );
    }
}

/// One utility (0) linked to producers A (1, price 50) and B (2, price 52), 100 units each,
/// and a demand of 100: the utility buys everything from whichever is cheaper this step.
fn duopoly() -> (MarketConfig, Market) {
    let cfg = MarketConfig {
        demand_step: 0.0,
        starting_resources: 10_000.0,
        ..MarketConfig::default()
    };
    let mut market = Market::new(&cfg, 3, &mut ChaCha8Rng::seed_from_u64(1));
    market.demand = 100.0;
    for (i, c) in market.companies.iter_mut().enumerate() {
        c.role = if i == 0 {
            Role::Utility
        } else {
            Role::Producer
        };
        c.renewable = false;
        c.links = if i == 0 { vec![1, 2] } else { vec![0] };
        c.production = if i == 0 { 0.0 } else { 100.0 };
        c.energy_price = [0.0, 50.0, 52.0][i];
    }
    (cfg, market)
}

#[test]
fn a_price_rise_that_loses_sales_is_counted_with_its_lag() {
    let (cfg, mut market) = duopoly();
    let scenario = EnergyMarket::new(cfg.clone());
    let info = CellInfo {
        arm: "base".into(),
        population: 3,
        replicate: 0,
    };
    // A's price changes, step by step: hold; rise above B (loses its sales); hold; cut back
    // below B (walked back, 2 steps after the rise); creep up while still cheapest; rise
    // above B (loses them again); cut, though not below B (walked back after 1 step).
    let a_changes = [0.0, 5.0, 0.0, -5.0, 1.0, 2.0, -0.5];
    let mut steps = vec![scenario.rows(&market, &info, 0)];
    let mut trades = vec![Vec::new()];
    for (s, &change) in a_changes.iter().enumerate() {
        let decisions = [
            Some(Decision::Utility(UtilityDecision {
                cost_to_consumer: 100.0,
                adjust_renewable_mix: 0,
            })),
            Some(Decision::Producer(ProducerDecision {
                production_change: 0.0,
                energy_price_change: change,
                upgrade_capacity: false,
            })),
            Some(Decision::Producer(ProducerDecision {
                production_change: 0.0,
                energy_price_change: 0.0,
                upgrade_capacity: false,
            })),
        ];
        rules::resolve(
            &cfg,
            &mut market,
            &decisions,
            &mut ChaCha8Rng::seed_from_u64(2),
        );
        steps.push(scenario.rows(&market, &info, s + 1));
        trades.push(scenario.trades(&market, &info, s + 1));
    }
    let cell = Cell {
        arm: info.arm.clone(),
        population: 3,
        replicate: 0,
        settings: CellSettings::of(&cfg),
        steps,
        trades,
    };
    // The units A sold, from the trades table: 100 whenever it was the cheaper.
    let sold: Vec<f64> = (1..=7).map(|s| cell.sales(s, 1)).collect();
    assert_eq!(sold, [100.0, 0.0, 0.0, 100.0, 100.0, 0.0, 0.0]);

    // (a): three rises (steps 2, 5, 6); the ones at 2 and 6 lost sales in the same step
    // (the fixed rules clear on this step's prices) and were cut at 4 and 7.
    let moves = dynamics::cell_price_moves(&cell);
    assert_eq!(moves.len(), 2, "one series per producer");
    let a = &moves[0];
    assert_eq!(a.raises, 3);
    let episodes: Vec<(usize, usize, Option<usize>, Option<usize>)> = a
        .episodes
        .iter()
        .map(|e| (e.raised_at, e.lost_at, e.walked_back_at, e.lag()))
        .collect();
    assert_eq!(
        episodes,
        [(2, 2, Some(4), Some(2)), (6, 6, Some(7), Some(1))]
    );
    assert_eq!(moves[1].raises, 0, "B never changed its price");

    // (b): A, alone cheapest after step 4, raised its price in step 5 and stayed cheapest.
    let creep = dynamics::cell_creep(&cell);
    assert_eq!((creep.creeps, creep.amount), (1, 1.0));
    // (c): the utility always bought from one producer, and always profited.
    let d = dynamics::dynamics(&[&cell]);
    assert_eq!(
        (d.episodes, d.walked_back, d.lags.clone()),
        (2, 2, vec![1, 1])
    );
    assert_eq!(d.episodes_by_replicate, [2]);
    assert_eq!(
        d.to_rival, 2,
        "both times the utility bought from B instead"
    );
    assert_eq!(d.producers_with_episodes.len(), 1);
    assert_eq!(d.producers_with_episodes[0].episodes, a.episodes);
    assert_eq!(
        (d.single_supplier_steps, d.single_supplier_profitable),
        (7, 7)
    );
    assert_eq!(d.supplier_sells_to_others, 0);
}
