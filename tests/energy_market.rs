//! The market's rules, specified by their invariants over many random steps, and the
//! reference rules' documented quirks, each against a step computed by hand.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use throng::scenarios::energy_market::config::{MarketConfig, Persona, Role, Rules};
use throng::scenarios::energy_market::decision::{Decision, ProducerDecision, UtilityDecision};
use throng::scenarios::energy_market::rules;
use throng::scenarios::energy_market::world::Market;

/// Wild but well-formed decisions: big swings, upgrades, prices far above any cap.
fn random_decisions(market: &Market, rng: &mut ChaCha8Rng) -> Vec<Option<Decision>> {
    market
        .companies
        .iter()
        .map(|c| {
            if c.bankrupt {
                return None;
            }
            Some(match c.role {
                Role::Producer => Decision::Producer(ProducerDecision {
                    production_change: rng.random_range(-150..=150) as f64,
                    energy_price_change: rng.random_range(-40.0..40.0),
                    upgrade_capacity: rng.random_bool(0.2),
                }),
                Role::Utility => Decision::Utility(UtilityDecision {
                    cost_to_consumer: rng.random_range(0.0..600.0),
                    adjust_renewable_mix: rng.random_range(0..=10),
                }),
            })
        })
        .collect()
}

#[test]
fn fixed_rules_never_sell_what_was_not_made_and_keep_the_books() {
    for seed in 0..40u64 {
        let cfg = MarketConfig {
            regulated: seed % 2 == 0,
            starting_resources: if seed % 3 == 0 { 60_000.0 } else { 1000.0 },
            ..MarketConfig::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut market = Market::new(&cfg, 10 + (seed as usize % 30), &mut rng);
        for step in 0..25 {
            let demand = market.demand;
            let before: f64 = market.companies.iter().map(|c| c.resources).sum();
            let was_bankrupt: Vec<bool> = market.companies.iter().map(|c| c.bankrupt).collect();
            let decisions = random_decisions(&market, &mut rng);
            rules::resolve(&cfg, &mut market, &decisions, &mut rng);
            let ctx = format!("seed {seed} step {step}");
            let active_utilities = was_bankrupt
                .iter()
                .zip(&market.companies)
                .filter(|(b, c)| !**b && c.role == Role::Utility)
                .count();
            let share = if active_utilities > 0 {
                demand / active_utilities as f64
            } else {
                0.0
            };
            let (mut sold, mut bought, mut paid_by_consumers, mut production_costs, mut upgrades) =
                (0.0, 0.0, 0.0, 0.0, 0.0);
            for (c, &bankrupt_before) in market.companies.iter().zip(&was_bankrupt) {
                assert!(!bankrupt_before || c.bankrupt, "{ctx}: bankruptcy is final");
                match c.role {
                    Role::Producer => {
                        assert!(
                            c.sold <= c.production + 1e-9,
                            "{ctx}: sold {} of {}",
                            c.sold,
                            c.production
                        );
                        assert!(
                            c.production <= c.max_capacity + 1e-9,
                            "{ctx}: production above capacity"
                        );
                        // The floor is the cost when the price was set; an upgrade raises the cost after.
                        let floor = c.production_cost
                            - if c.upgraded {
                                cfg.production_cost_penalty
                            } else {
                                0.0
                            };
                        assert!(c.production >= 0.0, "{ctx}: negative production");
                        if !bankrupt_before {
                            assert!(c.energy_price >= floor - 1e-9, "{ctx}: price below cost");
                        }
                        if bankrupt_before {
                            assert_eq!(
                                (c.production, c.sold),
                                (0.0, 0.0),
                                "{ctx}: bankrupt producers stop"
                            );
                        }
                        sold += c.sold;
                        production_costs += c.costs;
                        if c.upgraded {
                            upgrades += cfg.capacity_upgrade_cost;
                        }
                    }
                    Role::Utility => {
                        assert!(
                            c.bought <= share + 1e-6,
                            "{ctx}: bought {} of a share of {share}",
                            c.bought
                        );
                        if let Some(cap) = cfg.cap(demand) {
                            assert!(
                                c.cost_to_consumer <= cap + 1e-9,
                                "{ctx}: price {} above cap {cap}",
                                c.cost_to_consumer
                            );
                        }
                        bought += c.bought;
                        paid_by_consumers += c.revenue;
                    }
                }
            }
            assert!(
                (sold - bought).abs() < 1e-6,
                "{ctx}: sold {sold} != bought {bought}"
            );
            let after: f64 = market.companies.iter().map(|c| c.resources).sum();
            let expected = paid_by_consumers - production_costs - upgrades;
            assert!(
                ((after - before) - expected).abs() < 1e-6 * (1.0 + before.abs()),
                "{ctx}: money moved {} but consumers paid {paid_by_consumers}, production cost {production_costs}, upgrades {upgrades}",
                after - before
            );
        }
    }
}

#[test]
fn reference_rules_keep_the_reference_quirks() {
    // A real step, not the hidden round (tested on its own below).
    let cfg = MarketConfig {
        rules: Rules::Reference,
        regulated: true,
        hidden_round: Some(false),
        ..MarketConfig::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut market = Market::new(&cfg, 3, &mut rng);
    // Two utilities both linked to one producer.
    for (i, c) in market.companies.iter_mut().enumerate() {
        c.role = if i == 2 {
            Role::Producer
        } else {
            Role::Utility
        };
        c.renewable = false;
        c.links = if i == 2 { vec![] } else { vec![2] };
        c.energy_price = if i == 2 { 50.0 } else { 0.0 };
    }
    let decisions = vec![
        Some(Decision::Utility(UtilityDecision {
            cost_to_consumer: 400.0,
            adjust_renewable_mix: 0,
        })),
        Some(Decision::Utility(UtilityDecision {
            cost_to_consumer: 40.0,
            adjust_renewable_mix: 0,
        })),
        Some(Decision::Producer(ProducerDecision {
            production_change: 0.0,
            energy_price_change: 0.0,
            upgrade_capacity: false,
        })),
    ];
    let demand = market.demand;
    rules::resolve(&cfg, &mut market, &decisions, &mut rng);
    let [u0, u1, p] = [
        &market.companies[0],
        &market.companies[1],
        &market.companies[2],
    ];
    assert_eq!(
        (u0.bought, u1.bought),
        (100.0, 100.0),
        "both buy the producer's whole output"
    );
    assert_eq!(
        p.revenue,
        50.0 * 100.0,
        "the producer is paid for all it made"
    );
    assert_eq!(
        u0.cost_to_consumer,
        0.25 * demand,
        "the cap scales with demand"
    );
    assert_eq!(
        u0.revenue,
        0.25 * demand * demand,
        "utilities sell the whole demand"
    );
}

#[test]
fn in_the_fixed_market_renewable_preference_ranks_renewables_cheaper() {
    let cfg = MarketConfig::default();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut market = Market::new(&cfg, 3, &mut rng);
    for (i, c) in market.companies.iter_mut().enumerate() {
        c.role = if i == 0 {
            Role::Utility
        } else {
            Role::Producer
        };
        c.renewable = i == 2;
        c.links = if i == 0 { vec![1, 2] } else { vec![] };
        c.energy_price = [0.0, 50.0, 60.0][i];
        c.production = 2000.0;
        c.max_capacity = 2000.0;
    }
    let decide = |mix| {
        vec![
            Some(Decision::Utility(UtilityDecision {
                cost_to_consumer: 70.0,
                adjust_renewable_mix: mix,
            })),
            Some(Decision::Producer(ProducerDecision {
                production_change: 0.0,
                energy_price_change: 0.0,
                upgrade_capacity: false,
            })),
            Some(Decision::Producer(ProducerDecision {
                production_change: 0.0,
                energy_price_change: 0.0,
                upgrade_capacity: false,
            })),
        ]
    };
    let mut price_only = market.clone();
    rules::resolve(&cfg, &mut price_only, &decide(0), &mut rng);
    let share =
        |c: &throng::scenarios::energy_market::world::Company| c.bought_renewable / c.bought;
    assert_eq!(share(&price_only.companies[0]), 0.0);
    rules::resolve(&cfg, &mut market, &decide(10), &mut rng);
    assert_eq!(
        share(&market.companies[0]),
        1.0,
        "60 / (1 + 0.1 * 10) = 30 < 50"
    );
    assert_eq!(market.companies[1].sold, 0.0, "unsold energy earns nothing");
    assert_eq!(market.companies[1].revenue, 0.0);
    assert!(market.companies[1].profit < 0.0, "but was paid for");
}

/// A reference market of one utility (0) linked to a fossil producer (1) and a renewable
/// one (2), both at price 50 and output 100.
fn reference_trio(regulated: bool) -> (MarketConfig, Market) {
    let cfg = MarketConfig {
        rules: Rules::Reference,
        regulated,
        ..MarketConfig::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut market = Market::new(&cfg, 3, &mut rng);
    for (i, c) in market.companies.iter_mut().enumerate() {
        c.role = if i == 0 {
            Role::Utility
        } else {
            Role::Producer
        };
        c.renewable = i == 2;
        c.links = if i == 0 { vec![1, 2] } else { vec![] };
        c.energy_price = if i == 0 { 0.0 } else { 50.0 };
    }
    (cfg, market)
}

fn producer(change: f64, price: f64) -> Option<Decision> {
    Some(Decision::Producer(ProducerDecision {
        production_change: change,
        energy_price_change: price,
        upgrade_capacity: false,
    }))
}

fn utility(price: f64, mix: i64) -> Option<Decision> {
    Some(Decision::Utility(UtilityDecision {
        cost_to_consumer: price,
        adjust_renewable_mix: mix,
    }))
}

#[test]
fn the_reference_hidden_round_has_demand_zero_and_pays_producers() {
    let (cfg, mut market) = reference_trio(true);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    assert!(market.in_hidden_round(&cfg));
    rules::resolve(
        &cfg,
        &mut market,
        &[utility(40.0, 0), producer(10.5, 5.0), producer(0.0, 0.0)],
        &mut rng,
    );
    let [u, p, _] = [
        &market.companies[0],
        &market.companies[1],
        &market.companies[2],
    ];
    // By hand: the utility serves demand 0, buys nothing, and its price is capped at
    // 0.25 x 0 = 0; the producer makes 110.5 units at 55, paid for all: 6077.5 - 3315.
    assert_eq!(
        (u.production, u.bought, u.cost_to_consumer),
        (0.0, 0.0, 0.0)
    );
    assert_eq!((u.profit, u.resources), (0.0, 1000.0));
    assert_eq!((p.production, p.energy_price), (110.5, 55.0));
    assert_eq!((p.revenue, p.costs, p.profit), (6077.5, 3315.0, 2762.5));
    assert_eq!(p.resources, 3762.5);
    assert_eq!(
        market.demand, 1000.0,
        "the hidden round leaves demand alone"
    );
    assert!(!market.in_hidden_round(&cfg), "there is only one");

    // Step 1 proper: the utility buys by last step's prices and outputs (the fossil producer
    // at 50 first, then the other at 55, 210.5 units in all) and is paid for the whole
    // demand of 1000, 789.5 of which went unmet.
    rules::resolve(
        &cfg,
        &mut market,
        &[utility(40.0, 0), producer(0.0, 0.0), producer(0.0, 0.0)],
        &mut rng,
    );
    let u = &market.companies[0];
    assert_eq!(u.bought, 210.5);
    assert_eq!(u.costs, 50.0 * 100.0 + 55.0 * 110.5);
    assert_eq!(u.unmet_demand, 789.5);
    assert_eq!(u.revenue, 40.0 * 1000.0, "paid for demand it did not serve");
    assert_ne!(market.demand, 1000.0, "demand moves after every real step");
}

#[test]
fn without_the_hidden_round_the_first_step_is_a_real_one() {
    let (mut cfg, mut market) = reference_trio(true);
    cfg.hidden_round = Some(false);
    rules::resolve(
        &cfg,
        &mut market,
        &[utility(40.0, 0), producer(0.0, 0.0), producer(0.0, 0.0)],
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    assert_eq!(market.companies[0].bought, 200.0);
}

#[test]
fn the_reference_clips_the_renewable_mix_to_a_hundred_either_way() {
    let (mut cfg, market) = reference_trio(false);
    cfg.hidden_round = Some(false);
    // The renewable producer (2) is dearer than the fossil one by 1 per unit.
    let mut market = market;
    market.companies[2].energy_price = 51.0;
    let run = |mix: i64| {
        let mut m = market.clone();
        rules::resolve(
            &cfg,
            &mut m,
            &[utility(40.0, mix), producer(0.0, 0.0), producer(0.0, 0.0)],
            &mut ChaCha8Rng::seed_from_u64(0),
        );
        m.companies[0].clone()
    };
    // A mix of -150 is clipped to -100: 51 x (1 - 100) < 0 ranks the renewable first.
    let negative = run(-150);
    assert_eq!(negative.renewable_mix, -100.0);
    assert_eq!(negative.suppliers[0].0, 2, "renewable first");
    // A mix of 150 is clipped to 100 (not to the prompt's 10): 51 x 101 ranks it last.
    let positive = run(150);
    assert_eq!(positive.renewable_mix, 100.0);
    assert_eq!(positive.suppliers[0].0, 1);
    // The same clip when a model's reply is parsed; the fixed rules keep 0 to 10.
    let world = market.clone();
    let value = serde_json::json!({"cost_to_consumer": 10.0, "adjust_renewable_mix": 50});
    let (d, clamps) = throng::scenarios::energy_market::decision::parse(
        &cfg,
        &world.companies[0],
        1000.0,
        &value,
    )
    .unwrap();
    assert_eq!(d, utility(10.0, 50).unwrap());
    assert!(clamps.is_empty());
    let fixed = MarketConfig::default();
    let (d, clamps) = throng::scenarios::energy_market::decision::parse(
        &fixed,
        &world.companies[0],
        1000.0,
        &value,
    )
    .unwrap();
    assert_eq!(d, utility(10.0, 10).unwrap());
    assert_eq!(clamps.len(), 1);
}

#[test]
fn the_reference_keeps_fractional_production_changes() {
    let (cfg, market) = reference_trio(false);
    // Parsed from a model: 12.25 units stay 12.25; past capacity, the change is cut to what
    // fits, fraction and all (100.5 + 99.5 = 200).
    let mut c = market.companies[1].clone();
    c.production = 100.5;
    let parse = |cfg: &MarketConfig, change: f64| {
        let value = serde_json::json!({"production_change": change, "energy_price_change": 0.0, "upgrade_capacity": false});
        throng::scenarios::energy_market::decision::parse(cfg, &c, 1000.0, &value)
            .unwrap()
            .0
    };
    assert_eq!(parse(&cfg, 12.25), producer(12.25, 0.0).unwrap());
    assert_eq!(parse(&cfg, 150.0), producer(99.5, 0.0).unwrap());
    // The fixed rules deal in whole units.
    assert_eq!(
        parse(&MarketConfig::default(), 150.0),
        producer(100.0, 0.0).unwrap()
    );
}

#[test]
fn scripted_utilities_act_on_their_persona_only_when_told_it() {
    // A greedy utility marks up 30% and ignores renewables; in a control arm, where its
    // prompt would not name its persona, it follows the neutral rule (15%, preference 2).
    let mut cfg = MarketConfig::default();
    let mut market = Market::new(&cfg, 2, &mut ChaCha8Rng::seed_from_u64(0));
    let greedy = cfg.personas.keys().position(|p| p == "greedy").unwrap();
    market.companies[0].persona = greedy as u16;
    market.companies[0].role = Role::Utility;
    market.companies[0].bought = 100.0;
    market.companies[0].costs = 5000.0;
    let decide = |cfg: &MarketConfig| {
        throng::scenarios::energy_market::scripted::decide(
            cfg,
            &market,
            0,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
    };
    assert_eq!(decide(&cfg), utility(65.0, 0).unwrap());
    cfg.use_personas = false;
    assert_eq!(decide(&cfg), utility(57.5, 2).unwrap());
}

#[test]
// Guards the typed personas of the scripted policy: each of the study's personas gets its
// own rule, found by its name in the config, and a persona of the config's own the neutral
// rule (15%, preference 2), as its documentation says, not some study persona's.
fn scripted_utilities_follow_the_study_personas_and_give_others_the_neutral_rule() {
    let mut cfg = MarketConfig::default();
    cfg.personas
        .insert("stoic".into(), "You take what comes.".into());
    let mut market = Market::new(&cfg, 2, &mut ChaCha8Rng::seed_from_u64(0));
    market.companies[0].role = Role::Utility;
    market.companies[0].bought = 100.0;
    market.companies[0].costs = 5000.0;
    let mut decide = |name: &str| {
        market.companies[0].persona = cfg.personas.keys().position(|p| p == name).unwrap() as u16;
        throng::scenarios::energy_market::scripted::decide(
            &cfg,
            &market,
            0,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
    };
    assert_eq!(decide("greedy"), utility(65.0, 0).unwrap());
    assert_eq!(
        decide("environmentally conscious"),
        utility(55.0, 8).unwrap()
    );
    let Decision::Utility(depressed) = decide("depressed") else {
        panic!("a utility decides as one");
    };
    assert_eq!(depressed.cost_to_consumer, 52.5);
    assert!((0..=3).contains(&depressed.adjust_renewable_mix));
    assert_eq!(decide("stoic"), utility(57.5, 2).unwrap());
    let names: Vec<_> = Persona::ALL.map(Persona::name).to_vec();
    assert_eq!(
        cfg.personas
            .keys()
            .filter(|k| Persona::of(k).is_some())
            .count(),
        names.len(),
        "the default config defines every study persona: {names:?}"
    );
}
