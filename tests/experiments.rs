//! Experiments end to end: configs, records, determinism, resume, the LLM policy on a real
//! model, and the report.

mod common;

use std::path::{Path, PathBuf};
use throng::scenarios;
use throng::sim::experiment::Overrides;
use throng::sim::runner::{Ended, SimOptions};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes an experiment config into `dir` with the repository's templates.
fn config(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    let templates = repo().join("templates/energy_market");
    std::fs::write(
        &path,
        format!("templates = {:?}\n{body}", templates.display().to_string()),
    )
    .unwrap();
    path
}

const SMALL: &str = r#"name = "small"
seed = 7
replicates = 2
steps = 6
policy = "scripted"
agents = [12, 16]

[scenario]
name = "energy_market"
regulated = true

[[arms]]
name = "control"
scenario = { use_personas = false }

[[arms]]
name = "personas"
"#;

fn run(path: &Path, out: &Path, options: SimOptions) -> Ended {
    common::run_experiment(path, &Overrides::default(), out, options, None).0
}

/// The energy market's state rows of a run folder.
fn rows(dir: &Path) -> Vec<throng::scenarios::energy_market::Row> {
    let batches = throng::record::read_state(dir).unwrap();
    throng::record::rows_of(&batches, dir).unwrap()
}

fn bytes(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
}

const RECORDS: [&str; 4] = [
    "state.csv",
    "state.parquet",
    "decisions.jsonl",
    "cells.jsonl",
];

#[test]
fn the_same_config_and_seed_give_byte_identical_records() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config(tmp.path(), SMALL);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    assert_eq!(run(&path, &a, SimOptions::default()), Ended::Finished);
    run(&path, &b, SimOptions::default());
    for name in RECORDS {
        assert_eq!(
            bytes(&a, name),
            bytes(&b, name),
            "{name} differs between two runs"
        );
    }
    // Every company at every step (0 to 6) of every cell (2 arms x 2 replicates).
    assert_eq!(rows(&a).len(), (12 + 16) * 2 * 2 * 7);
}

#[test]
fn an_interrupted_run_resumes_to_the_same_records() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config(tmp.path(), SMALL);
    let (whole, pieces) = (tmp.path().join("whole"), tmp.path().join("pieces"));
    run(&path, &whole, SimOptions::default());
    // Stop after 4 steps (into the second population), as a killed job would...
    assert_eq!(
        run(
            &path,
            &pieces,
            SimOptions {
                stop_after: Some(8),
                ..SimOptions::default()
            }
        ),
        Ended::Paused
    );
    // ...with half a step written after the last checkpoint.
    for name in ["state.csv", "decisions.jsonl", "steps.csv"] {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(pieces.join(name))
            .unwrap();
        f.write_all(b"half a line of a step that never fini")
            .unwrap();
    }
    assert_eq!(
        run(
            &path,
            &pieces,
            SimOptions {
                resume: true,
                stop_after: Some(2),
                ..SimOptions::default()
            }
        ),
        Ended::Paused
    );
    assert_eq!(
        run(
            &path,
            &pieces,
            SimOptions {
                resume: true,
                ..SimOptions::default()
            }
        ),
        Ended::Finished
    );
    for name in RECORDS {
        assert_eq!(
            bytes(&whole, name),
            bytes(&pieces, name),
            "{name} differs after resuming"
        );
    }
}

#[test]
fn a_scripted_run_reports_figures_and_persona_tests() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config(tmp.path(), SMALL);
    let out = tmp.path().join("run");
    run(&path, &out, SimOptions::default());
    let text = scenarios::Registry::builtin().report(&out).unwrap();
    assert!(text.contains("Welch t-test"), "{text}");
    for fig in [
        "fig2_network",
        "fig3_consumer_price",
        "fig4_producer_prices",
        "fig5_step_time",
        "fig6_subpopulations",
        "fig7_profit_by_persona",
        "fig8_renewable_preference",
        "fig9_renewable_fraction",
    ] {
        for ext in ["png", "svg"] {
            let f = out.join(format!("{fig}.{ext}"));
            assert!(
                std::fs::metadata(&f)
                    .map(|m| m.len() > 1000)
                    .unwrap_or(false),
                "{} missing or empty",
                f.display()
            );
        }
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("fig7_profit_by_persona.svg") && html.contains("Welch"));
}

fn load_err(body: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let path = config(tmp.path(), body);
    match scenarios::Registry::builtin().load(&path, &Overrides::default()) {
        Ok(_) => panic!("config should be refused:\n{body}"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with(&path.display().to_string()), "{text}");
            text
        }
    }
}

#[test]
fn bad_configs_name_file_line_and_field() {
    let base = "name = \"x\"\nsteps = 3\nagents = 20\n\n[scenario]\nname = \"energy_market\"\n";
    // Line numbers count the `templates = ...` line the helper adds at the top.
    let err = load_err(&base.replace("steps = 3", "steps = \"ten\""));
    assert!(err.contains(":3:") && err.contains("steps"), "{err}");
    let err = load_err(&base.replace("agents = 20", "agents = -5"));
    assert!(err.contains(":4:") && err.contains("agents"), "{err}");
    let err = load_err(&format!("{base}persona_mix = [\"greedy\", \"angry\"]\n"));
    assert!(
        err.contains(":8:") && err.contains("persona_mix") && err.contains("`angry`"),
        "{err}"
    );
    let err = load_err(&format!(
        "{base}type_mix = [\"CoalMining\", \"WindFarm\"]\n"
    ));
    assert!(err.contains(":8:") && err.contains("`WindFarm`"), "{err}");
    let err = load_err(&format!("{base}max_connections = -2\n"));
    assert!(
        err.contains(":8:") && err.contains("max_connections"),
        "{err}"
    );

    // A templates folder without the utility's template.
    let tmp = tempfile::tempdir().unwrap();
    let partial = tmp.path().join("templates");
    std::fs::create_dir_all(&partial).unwrap();
    for f in ["system.jinja", "producer.jinja"] {
        std::fs::copy(
            repo().join("templates/energy_market").join(f),
            partial.join(f),
        )
        .unwrap();
    }
    let path = tmp.path().join("exp.toml");
    std::fs::write(
        &path,
        base.replacen(
            "name = \"x\"\n",
            &format!(
                "name = \"x\"\ntemplates = {:?}\n",
                partial.display().to_string()
            ),
            1,
        ),
    )
    .unwrap();
    let err = scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":2:") && err.contains("utility.jinja") && err.contains("missing"),
        "{err}"
    );
}

#[test]
// Guards against a misspelt persona silently getting the scripted policy's default (neutral)
// rule: a config may name personas of its own, so `enviromentally conscious` under
// [scenario.personas] would load, be drawn, and decide as a control-arm company would. A
// name a slip away from one of the study's personas is refused at its line, naming the
// study's personas; a persona of one's own still loads.
fn a_misspelt_persona_is_refused_not_given_the_neutral_rule() {
    let base = "name = \"x\"\nsteps = 3\nagents = 20\n\n[scenario]\nname = \"energy_market\"\n";
    for (misspelt, meant) in [
        ("enviromentally conscious", "environmentally conscious"),
        ("Greedy", "greedy"),
        ("depresed", "depressed"),
        ("environmentally-conscious", "environmentally conscious"),
    ] {
        let err = load_err(&format!(
            "{base}persona_mix = [\"greedy\", \"{misspelt}\"]\n\n[scenario.personas]\n\
             greedy = \"g\"\n\"{misspelt}\" = \"m\"\n"
        ));
        assert!(
            err.contains(":12:")
                && err.contains(&format!("personas.{misspelt}"))
                && err.contains(&format!("close to `{meant}`"))
                && err.contains("(environmentally conscious, greedy, depressed)"),
            "{err}"
        );
    }
    // A persona of one's own, far from the study's: loaded, and documented to follow the
    // neutral rule under the scripted policy.
    let tmp = tempfile::tempdir().unwrap();
    let path = config(
        tmp.path(),
        &format!(
            "{base}persona_mix = [\"greedy\", \"stoic\"]\n\n[scenario.personas]\n\
             greedy = \"g\"\nstoic = \"s\"\n"
        ),
    );
    scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .unwrap();
}

/// The market's persona mix can come from a population: exact quotas of the named personas.
#[test]
fn a_population_sets_the_market_personas() {
    let tmp = tempfile::tempdir().unwrap();
    let path = config(
        tmp.path(),
        "name = \"pop\"\nsteps = 1\npolicy = \"scripted\"\nagents = 40\n\n[scenario]\nname = \"energy_market\"\n\n[population.attributes.persona]\nshares = { greedy = 25, depressed = 75 }\n",
    );
    let out = tmp.path().join("run");
    run(&path, &out, SimOptions::default());
    let at_start: Vec<_> = rows(&out).into_iter().filter(|r| r.step == 0).collect();
    assert_eq!(
        at_start.iter().filter(|r| r.persona == "greedy").count(),
        10
    );
    assert_eq!(
        at_start.iter().filter(|r| r.persona == "depressed").count(),
        30
    );
    let err = load_err(
        "name = \"x\"\nsteps = 1\nagents = 20\n\n[scenario]\nname = \"energy_market\"\n\n[population.attributes.persona]\nshares = { greedy = 50, angry = 50 }\n",
    );
    assert!(err.contains(":10:") && err.contains("`angry`"), "{err}");
}

#[test]
fn the_shipped_experiments_load() {
    for entry in std::fs::read_dir(repo().join("experiments")).unwrap() {
        let path = entry.unwrap().path();
        let exp = scenarios::Registry::builtin()
            .load(&path, &Overrides::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let scenario = &exp.experiment().scenario;
        assert!(
            (name.starts_with("exp") && scenario == "energy_market")
                || (name.starts_with("guess") && scenario == "guess"),
            "{name}: {scenario}"
        );
    }
}

#[test]
fn exp1_with_smollm2_decides_every_turn_within_its_schema() {
    let Some(model) = common::smollm2() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let engine = common::engine(
        model.to_str().unwrap(),
        throng::engine::EngineConfig::default(),
    );
    let (ended, manifest) = common::run_experiment(
        &repo().join("experiments/exp1-unregulated.toml"),
        &Overrides {
            replicates: Some(1),
            steps: Some(3),
            ..Overrides::default()
        },
        &out,
        SimOptions::default(),
        Some(engine),
    );
    assert_eq!(ended, Ended::Finished);
    assert_eq!(manifest.counters.fallbacks, 0, "every decision parsed");
    // Every company that was in the market at a step decided once (bankrupt ones sit out).
    let rows = rows(&out);
    assert_eq!(rows.len(), 20 * 4, "a row per company per step, 0 to 3");
    let active_turns = rows.iter().filter(|r| r.step < 3 && !r.bankrupt).count() as u64;
    assert_eq!(manifest.counters.decisions, active_turns);
    let cfg = throng::scenarios::energy_market::config::MarketConfig::default();
    let schemas = [
        (
            "producer",
            throng::scenarios::energy_market::decision::producer_schema(&cfg),
        ),
        (
            "utility",
            throng::scenarios::energy_market::decision::utility_schema(&cfg, 1000.0),
        ),
    ];
    let text = std::fs::read_to_string(out.join("decisions.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len() as u64, active_turns);
    for r in &records {
        let schema = &schemas
            .iter()
            .find(|(role, _)| r["role"] == *role)
            .unwrap()
            .1;
        assert!(
            jsonschema::validator_for(schema)
                .unwrap()
                .is_valid(&r["value"]),
            "{r}"
        );
        assert!(
            r["text"].is_string() && r["prompt_hash"].is_string() && r["latency_ms"].is_number()
        );
    }
    scenarios::Registry::builtin().report(&out).unwrap();
    assert!(out.join("report.html").exists() && out.join("fig3_consumer_price.png").exists());
}
