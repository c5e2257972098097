//! What the energy market's agents are told. Guards the information the study says agents
//! have (suppliers' capacity, neighbours' profit and resources, a utility's share of demand,
//! buyers' unmet demand and supplier lists), the bounds they decide within, and the
//! reference's persona wording. The rendered prompts are kept as snapshots in
//! tests/fixtures/prompts, so that any change to what agents are told shows in review:
//! after an intended change, rerun with THRONG_UPDATE_SNAPSHOTS=1 and commit the files.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;
use throng::scenarios::energy_market::EnergyMarket;
use throng::scenarios::energy_market::config::Role;
use throng::scenarios::energy_market::world::Market;
use throng::sim::population::Population;
use throng::sim::prompt::PromptBook;
use throng::sim::scenario::Scenario;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn market(config: &str) -> EnergyMarket {
    let table: toml::Table = toml::from_str(config).unwrap();
    EnergyMarket::from_table(&table).unwrap()
}

/// A 12-company world of `scenario` after `steps` scripted steps.
fn world(scenario: &EnergyMarket, steps: usize) -> Market {
    let population = Population::plain(12);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut world = scenario.init(&population, &mut rng);
    for _ in 0..steps {
        let decisions: Vec<_> = (0..scenario.num_agents(&world))
            .map(|a| {
                scenario
                    .acts(&world, a)
                    .then(|| scenario.scripted(&world, &population, a, &mut rng))
            })
            .collect();
        scenario.resolve(&mut world, &population, &decisions, &mut rng);
    }
    world
}

/// The system prompt and the role's prompt of `agent`, as the model reads them.
fn prompt(scenario: &EnergyMarket, world: &Market, agent: usize, step: usize) -> String {
    let book = PromptBook::load(
        &repo().join("templates/energy_market"),
        "energy_market",
        EnergyMarket::roles(),
        &[],
    )
    .unwrap();
    let system = book
        .render("system", &scenario.shared_context(world, step))
        .unwrap();
    let turn = scenario.turn(world, &Population::plain(12), agent, step);
    let own = book
        .render(scenario.role(world, agent), &turn.context)
        .unwrap();
    format!("{system}\n---\n{own}\n")
}

/// Compares `text` with the snapshot `name`, or writes it when asked to.
fn snapshot(name: &str, text: &str) {
    let path = repo()
        .join("tests/fixtures/prompts")
        .join(format!("{name}.txt"));
    if std::env::var("THRONG_UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; write it with THRONG_UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert!(
        want == text,
        "the {name} prompt changed (rerun with THRONG_UPDATE_SNAPSHOTS=1 if intended):\n--- snapshot\n{want}\n--- now\n{text}"
    );
}

fn first(
    world: &Market,
    role: Role,
    with: impl Fn(&throng::scenarios::energy_market::world::Company) -> bool,
) -> usize {
    world
        .companies
        .iter()
        .position(|c| c.role == role && with(c))
        .expect("the fixture world has such a company")
}

#[test]
fn a_utility_is_told_capacities_neighbour_profits_its_share_and_its_bounds() {
    let scenario = market("regulated = true\nstarting_resources = 5000.0");
    let world = world(&scenario, 2);
    let u = first(&world, Role::Utility, |c| !c.suppliers.is_empty());
    let text = prompt(&scenario, &world, u, 2);
    let c = &world.companies[u];
    let (p, ..) = c.suppliers[0];
    let supplier = &world.companies[p as usize];
    // Its suppliers' capacity, and every linked producer's.
    assert!(
        text.contains(&format!("capacity {}", supplier.max_capacity)),
        "{text}"
    );
    for &l in &c.links {
        let n = &world.companies[l as usize];
        assert!(
            text.contains(&format!("company {l} ("))
                && text.contains(&format!("profit {}", (n.profit * 100.0).round() / 100.0)),
            "neighbour {l}'s profit missing:\n{text}"
        );
    }
    // Its share of demand under the fixed rules.
    let share = world.demand / world.active_utilities() as f64;
    assert!(
        text.contains(&format!(
            "your share is {} units",
            (share * 100.0).round() / 100.0
        )),
        "{text}"
    );
    // Bounds: the cap, the renewable preference, the producers' per-step limits.
    assert!(text.contains("maximum price of 250"), "{text}");
    assert!(text.contains("Keep the value between 0 and 10"), "{text}");
    assert!(text.contains("at most 25 per unit per step"), "{text}");
    // The reference's persona wording, the name only.
    assert!(
        text.contains("Your persona that drives your decision making on energy sources is: ")
            && text.contains("Consider your persona.")
            && text.contains("covers your expenses and includes a reasonable profit margin"),
        "{text}"
    );
    assert!(!text.contains("You are greedy:") && !text.contains("You care about"));
    snapshot("fixed-utility", &text);
}

#[test]
fn a_producer_is_told_its_buyers_unmet_demand_and_neighbours_supplier_lists() {
    let scenario = market("regulated = true\nstarting_resources = 5000.0");
    let world = world(&scenario, 2);
    let p = first(&world, Role::Producer, |c| {
        !c.buyers.is_empty()
            && c.links
                .iter()
                .any(|&l| !world.companies[l as usize].suppliers.is_empty())
    });
    let text = prompt(&scenario, &world, p, 2);
    let c = &world.companies[p];
    let (buyer, units, _) = c.buyers[0];
    assert!(
        text.contains(&format!(
            "company {buyer} bought {} units",
            (units * 100.0).round() / 100.0
        )) && text.contains("(its unmet demand: "),
        "{text}"
    );
    let utility = c
        .links
        .iter()
        .map(|&l| &world.companies[l as usize])
        .find(|n| !n.suppliers.is_empty())
        .unwrap();
    let (s, amount, _) = utility.suppliers[0];
    assert!(
        text.contains(&format!(
            "company {s} ({} units)",
            (amount * 100.0).round() / 100.0
        )),
        "a utility neighbour's suppliers:\n{text}"
    );
    assert!(
        text.contains("your price by at most 25 per unit and your production by at most 100 units"),
        "{text}"
    );
    snapshot("fixed-producer", &text);
}

#[test]
fn persona_definitions_are_an_option_and_a_control_has_no_persona() {
    let described = market("describe_personas = true");
    let world = world(&described, 1);
    let text = prompt(&described, &world, 0, 1);
    let persona = described.persona_name(world.companies[0].persona);
    assert!(
        text.contains(&described.cfg.personas[persona]),
        "the definition is told when asked for:\n{text}"
    );
    let control = market("use_personas = false");
    let text = prompt(&control, &world, 0, 1);
    assert!(!text.contains("persona"), "{text}");
}

#[test]
fn reference_prompts_show_the_lagging_cap_and_no_throng_limits() {
    let scenario = market("rules = \"reference\"\nregulated = true");
    // The hidden round: demand 0, no neighbour data, and the cap read from the starting
    // production (0.25 x 100).
    let world0 = world(&scenario, 0);
    let u = first(&world0, Role::Utility, |_| true);
    let hidden = prompt(&scenario, &world0, u, 0);
    assert!(hidden.contains("Market demand: 0 units"), "{hidden}");
    assert!(hidden.contains("Connected companies:\n- none"), "{hidden}");
    assert!(hidden.contains("maximum price of 25"), "{hidden}");
    // After it, the cap shown is 0.25 x the demand of the hidden round: 0.
    let world1 = world(&scenario, 1);
    let first_step = prompt(&scenario, &world1, u, 1);
    assert!(first_step.contains("maximum price of 0"), "{first_step}");
    // After step 1, the cap shown is 0.25 x step 1's demand, not the current demand.
    let world2 = world(&scenario, 2);
    let text = prompt(&scenario, &world2, u, 2);
    assert!(text.contains("maximum price of 250"), "{text}");
    assert_ne!(world2.demand, 1000.0, "demand has moved since step 1");
    assert!(text.contains("You serve the whole demand."), "{text}");
    assert!(
        !text.contains("per unit per step") && !text.contains("Limits of every decision"),
        "{text}"
    );
    snapshot("reference-utility", &text);
    let p = first(&world2, Role::Producer, |_| true);
    let text = prompt(&scenario, &world2, p, 2);
    assert!(!text.contains("at most"), "{text}");
    snapshot("reference-producer", &text);
}
