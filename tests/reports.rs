//! Both built-in studies' reports stand on the base report every scenario gets
//! (`throng::analysis::overview`): their own sections and figures first, then every numeric
//! column's means with intervals, the group levels, and the run's timing, from one page
//! scaffold, one `summary.json` and one `means.csv`.

mod common;

use common::cli::{Ran, output, throng};
use serde_json::Value;
use std::path::Path;

const ENERGY: &str = "tests/fixtures/energy-resume.toml";
const GUESS: &str = "tests/fixtures/guess-resume.toml";

fn run(config: &Path, out: &Path) -> String {
    let Ran { ok, text, .. } = output(throng().arg("run").arg(config).arg("--out").arg(out));
    assert!(ok, "{text}");
    text
}

fn summary(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// The figures `report.html` shows, in its order.
fn shown_figures(page: &str) -> Vec<String> {
    page.split("<img src=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_string())
        .collect()
}

/// What every study's report must hold of the base, beside its own `sections` and numbers.
fn assert_on_the_base(dir: &Path, own_sections: &[&str], own_numbers: &[&str], column: &str) {
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    // One caveat, said once: the study words it, and the base does not add its own.
    assert_eq!(page.matches("Scripted policy").count(), 1, "{page}");
    assert!(
        page.find("Scripted policy").unwrap() < page.find("<h1>").unwrap(),
        "the notes open the page"
    );
    assert_eq!(page.matches("<h1>").count(), 1);
    let base = page
        .find("Every numeric column")
        .expect("the base's breakdowns");
    for section in own_sections {
        let at = page
            .find(section)
            .unwrap_or_else(|| panic!("{section} missing"));
        assert!(at < base, "{section} comes before the base's breakdowns");
    }
    assert!(page.contains("<h2>Timing</h2>"));
    // The study's figures first, then every column's; each one drawn.
    let figures = shown_figures(&page);
    let first_base = figures
        .iter()
        .position(|f| f.starts_with("figures/"))
        .expect("every column's figures");
    assert!(first_base > 0, "the study's own figures: {figures:?}");
    assert!(
        figures[first_base..]
            .iter()
            .all(|f| f.starts_with("figures/"))
    );
    assert!(figures.contains(&format!("figures/mean_{column}.svg")));
    for f in &figures {
        assert!(dir.join(f).is_file(), "{f} is shown but not drawn");
    }
    // summary.json: the study's numbers and the base's, with every figure listed.
    let s = summary(dir);
    for key in own_numbers
        .iter()
        .chain(&["columns", "means", "timing", "notes"])
    {
        assert!(s.get(*key).is_some(), "summary.json lacks {key}");
    }
    assert_eq!(s["figures"].as_array().unwrap().len(), figures.len());
    assert!(s["columns"].as_array().unwrap().iter().any(|c| c == column));
    let csv = std::fs::read_to_string(dir.join("means.csv")).unwrap();
    assert!(
        csv.starts_with("arm,population,by,value,step,column,"),
        "{csv}"
    );
    assert!(csv.contains(&format!(",{column},")));
}

// The energy market keeps its study's figures and tables (key numbers, personas, tests,
// dynamics, producer types), now on the base, which adds every column's means and timing.
#[test]
fn the_energy_markets_report_keeps_its_figures_on_the_base() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("energy");
    let printed = run(&common::cli::repo().join(ENERGY), &out);
    assert!(printed.contains("NOTE: "), "{printed}");
    assert_on_the_base(
        &out,
        &[
            "Key numbers",
            "Utilities by persona",
            "Tests between personas",
            "Experiment 2's dynamics",
            "Producer types against population",
            "Time per step",
        ],
        &["groups", "tests", "bankruptcies", "timings", "manifest"],
        "profit",
    );
}

// The guessing game keeps its round table, equilibrium and figures on the base, and the base's
// mean guess of a round is the game's own: two computations of one number agree.
#[test]
fn the_guessing_games_report_keeps_its_figures_and_agrees_with_the_base() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("guess");
    run(&common::cli::repo().join(GUESS), &out);
    assert_on_the_base(
        &out,
        &["<h2>Rounds</h2>", "Equilibrium"],
        &["rounds", "rules"],
        "guess",
    );
    let s = summary(&out);
    let mut compared = 0;
    for round in s["rounds"].as_array().unwrap() {
        let base = s["means"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| {
                m["by"] == "all"
                    && m["column"] == "guess"
                    && m["arm"] == round["arm"]
                    && m["population"] == round["population"]
                    && m["step"] == round["round"]
            })
            .unwrap_or_else(|| panic!("no base mean for {round}"));
        let (a, b) = (
            round["mean"]["mean"].as_f64().unwrap(),
            base["mean"].as_f64().unwrap(),
        );
        assert!((a - b).abs() < 1e-9, "{round} vs {base}");
        compared += 1;
        // The game's own per-round numbers (aggregates.csv) are on the base too: the winning
        // number's mean over replicates, by arm and population, with its interval.
        let winning = s["aggregates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| {
                m["column"] == "winning_number"
                    && m["arm"] == round["arm"]
                    && m["population"] == round["population"]
                    && m["step"] == round["round"]
            })
            .unwrap_or_else(|| panic!("no aggregate mean for {round}"));
        assert!(winning["mean"].as_f64().unwrap().is_finite(), "{winning}");
    }
    assert_eq!(compared, 2 * 2 * 3, "arms x populations x rounds");
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        page.contains("The study's own measures") && page.contains("aggregate_winning_number"),
        "the aggregates' section and figures"
    );
}

// A grouped game shows its levels on the page, outside the folded breakdowns, where its note
// ("the levels below compare them") sends the reader.
#[test]
fn a_grouped_games_levels_are_on_the_page() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("groups.toml");
    std::fs::write(
        &config,
        format!(
            r#"name = "grouped"
seed = 3
replicates = 2
steps = 2
policy = "scripted"
templates = {:?}
agents = 120

[scenario]
name = "guess"
group = "team"

[[population.groups]]
level = "team"
size = 6

[[population.groups]]
level = "league"
size = 4
"#,
            common::cli::repo()
                .join("templates/guess")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    let out = tmp.path().join("run");
    run(&config, &out);
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    let levels = page.find("Group levels at step 2").expect("the levels");
    assert!(levels < page.find("<details>").unwrap(), "not folded away");
    assert!(page.contains("<td>team</td>") && page.contains("<td>league</td>"));
    assert_eq!(page.matches("Group levels at step").count(), 1);
}

// Guards against issue 30, item 23: the base report gave a 0/1 column Student's t interval
// over replicates, which left [0, 1] (a share of winners shown as [-0.38, 1.05]). A share's
// interval is Wilson's, within [0, 1]; a column that is never negative is never given a
// negative bound, and the report says where one was cut.
#[test]
fn intervals_keep_to_the_range_a_columns_values_can_take() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("shares.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"shares\"\nseed = 5\nreplicates = 3\nsteps = 4\npolicy = \"scripted\"\n\
             agents = 5\ntemplates = {:?}\n\n[scenario]\nname = \"guess\"\n\n\
             [population.attributes.education]\nshares = {{ school = 60, university = 40 }}\n",
            common::cli::repo()
                .join("templates/guess")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    let out = tmp.path().join("run");
    run(&config, &out);
    let mut reader = csv::Reader::from_path(out.join("means.csv")).unwrap();
    let header = reader.headers().unwrap().clone();
    let at = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (column, low, high, mean) = (at("column"), at("ci_low"), at("ci_high"), at("mean"));
    let mut shares = 0;
    for row in reader.records() {
        let row = row.unwrap();
        let (Ok(lo), Ok(hi)) = (row[low].parse::<f64>(), row[high].parse::<f64>()) else {
            continue;
        };
        let m: f64 = row[mean].parse().unwrap();
        assert!(lo <= m && m <= hi, "{row:?}");
        match &row[column] {
            "won" => {
                shares += 1;
                assert!((0.0..=1.0).contains(&lo) && hi <= 1.0, "{row:?}");
            }
            "guess" => assert!(lo >= 0.0, "{row:?}"),
            _ => {}
        }
    }
    assert!(shares > 0, "a share with an interval");
}
