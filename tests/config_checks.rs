//! Config values that load but make no sense are refused when the config is read, at their
//! file, line and field, before any run folder is written: numbers that are not finite or lie
//! outside their documented ranges.

use std::path::{Path, PathBuf};
use std::process::Command;
use throng::sim::config::ConfigError;
use throng::sim::experiment::Overrides;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A config of `scenario` with `body` after the header lines; returns its path.
fn write(dir: &Path, scenario: &str, body: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"checks\"\nsteps = 1\nagents = 4\npolicy = \"scripted\"\ntemplates = {:?}\n{body}",
            repo().join("templates").join(scenario).display().to_string()
        )
        .replace("SCENARIO", scenario),
    )
    .unwrap();
    path
}

fn load(scenario: &str, body: &str) -> Result<(), ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), scenario, body);
    throng::scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .map(|_| ())
}

/// The 1-based line of `body` (after the 5 header lines) that contains `needle`.
fn line_of(body: &str, needle: &str) -> usize {
    5 + 1
        + body
            .lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not in {body}"))
}

/// Asserts that `body` is refused at the line holding `needle`, naming `field` and `words`.
fn refused(scenario: &str, body: &str, needle: &str, field: &str, words: &str) {
    let err = load(scenario, body).expect_err(body);
    let text = err.to_string();
    assert_eq!(err.line(), Some(line_of(body, needle)), "{text}\n{body}");
    assert!(
        text.contains(&format!("`{field}`")) && text.contains(words),
        "{text}\n{body}"
    );
    assert!(!text.contains('\n'), "one line: {text}");
}

const MARKET: [&str; 15] = [
    "starting_resources",
    "starting_production",
    "starting_energy_price",
    "starting_consumer_price",
    "production_cost",
    "max_capacity",
    "capacity_upgrade_cost",
    "capacity_upgrade_amount",
    "production_cost_penalty",
    "starting_demand",
    "demand_step",
    "consumer_price_cap",
    "max_production_change",
    "max_price_change",
    "max_consumer_price",
];

// Guards against issue 17, item 4: `starting_resources = nan` gave every company NaN
// resources (nobody could go bankrupt; "0 of 20 bankrupt"), and `-1e308` was accepted too.
#[test]
fn every_market_number_must_be_finite_and_within_its_range() {
    let hostile = ["nan", "inf", "-inf", "-1e308", "-1", "1e13", "1e308"];
    for knob in MARKET {
        for value in hostile {
            // Limits take "none" or a number >= 0, so their negatives are refused by type.
            let words = if knob.starts_with("max_") && knob.ends_with("change")
                || knob == "max_consumer_price"
            {
                "number"
            } else {
                "from 0 to 10^12"
            };
            let body = format!("\n[scenario]\nname = \"energy_market\"\n{knob} = {value}\n");
            refused("energy_market", &body, knob, knob, words);
        }
        for fine in ["0", "1e12", "2.5"] {
            let body = format!("\n[scenario]\nname = \"energy_market\"\n{knob} = {fine}\n");
            load("energy_market", &body).unwrap_or_else(|e| panic!("{knob} = {fine}: {e}"));
        }
    }
    for (knob, top) in [
        ("regulator_max", "100"),
        ("renewable_discount", "10"),
        ("max_renewable_mix", "100"),
    ] {
        for value in ["nan", "-0.5", "1e9", "inf"] {
            let body = format!("\n[scenario]\nname = \"energy_market\"\n{knob} = {value}\n");
            refused(
                "energy_market",
                &body,
                knob,
                knob,
                &format!("from 0 to {top}"),
            );
        }
        let body = format!("\n[scenario]\nname = \"energy_market\"\n{knob} = {top}\n");
        load("energy_market", &body).unwrap();
    }
}

// Guards against issue 17, item 4: arms and sweeps override knobs, and their values must be
// refused as the base's are, at their own line.
#[test]
fn arms_and_sweeps_are_held_to_the_same_ranges() {
    let body = "\n[scenario]\nname = \"energy_market\"\n\n[[arms]]\nname = \"fine\"\n\n[[arms]]\nname = \"broke\"\nscenario = { starting_resources = nan }\n";
    refused(
        "energy_market",
        body,
        "starting_resources = nan",
        "starting_resources",
        "arm `broke`",
    );
    let body = "\n[scenario]\nname = \"energy_market\"\n\n[sweep]\nscenario = { demand_step = [50, -1e308] }\n";
    refused(
        "energy_market",
        body,
        "demand_step",
        "demand_step",
        "-1e308",
    );
    let body =
        "\n[scenario]\nname = \"guess\"\n\n[sweep]\nscenario = { ratio = [\"1/2\", \"nan\"] }\n";
    refused("guess", body, "ratio =", "ratio", "");
}

// Guards against issue 17, item 4: the guessing game's rule takes exact fractions, which must
// be finite and within a range in which every target stays exact.
#[test]
fn the_guess_rule_needs_bounded_exact_fractions() {
    for (knob, value, words) in [
        ("ratio", "nan", "not a number"),
        ("ratio", "inf", "not a number"),
        ("ratio", "11", "outside 0 to 10"),
        ("ratio", "\"21/2\"", "outside 0 to 10"),
        ("ratio", "-0.5", "negative"),
        ("ratio", "\"1/3000007\"", "denominator above 1000000"),
        ("ratio", "0.12345678", "denominator above 1000000"),
        ("offset", "-inf", "not a number"),
        ("offset", "-101", "outside -100 to 100"),
        ("offset", "1e300", "too many digits"),
        ("offset", "\"201/2\"", "outside -100 to 100"),
    ] {
        let body = format!("\n[scenario]\nname = \"guess\"\n{knob} = {value}\n");
        refused("guess", &body, &format!("{knob} ="), knob, words);
    }
    for (ratio, offset) in [
        ("10", "-100"),
        ("\"3/2\"", "5"),
        ("0", "100"),
        ("0.000001", "0"),
    ] {
        let body = format!("\n[scenario]\nname = \"guess\"\nratio = {ratio}\noffset = {offset}\n");
        load("guess", &body).unwrap_or_else(|e| panic!("{body}: {e}"));
    }
}

// Guards against issue 17, item 4: sampling temperatures are floats of the config too; a NaN
// persona temperature was accepted.
#[test]
fn sampling_temperatures_are_finite_and_bounded_at_their_line() {
    let body = "\n[llm]\nmax_tokens = 8\ntemperature = nan\n\n[scenario]\nname = \"guess\"\n";
    refused(
        "guess",
        body,
        "temperature",
        "base",
        "temperature NaN must be from 0 to 10",
    );
    let body = "\n[scenario]\nname = \"guess\"\n\n[[arms]]\nname = \"hot\"\nllm = { temperature = 11.0 }\n";
    refused("guess", body, "temperature", "hot", "from 0 to 10");
    let body = "\n[scenario]\nname = \"guess\"\n\n[sweep]\nllm = { temperature = [0.5, -1.0] }\n";
    refused(
        "guess",
        body,
        "temperature",
        "temperature=-1.0",
        "from 0 to 10",
    );
    let body = "policy = \"llm\"\n\n[scenario]\nname = \"guess\"\n\n[population.attributes.age]\nrange = [18, 80]\n\n[population.personas]\ntemperature = nan\n";
    let body = body.replace("policy = \"llm\"\n", "");
    let err = {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "guess", &body);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("policy = \"scripted\"", "policy = \"llm\"");
        std::fs::write(&path, text).unwrap();
        throng::scenarios::Registry::builtin()
            .load(&path, &Overrides::default())
            .unwrap_err()
    };
    assert!(
        err.to_string()
            .contains("field `population.personas.temperature`: must be a number from 0 to 10"),
        "{err}"
    );
    assert_eq!(
        err.line(),
        Some(line_of(&body, "temperature = nan")),
        "{err}"
    );
}

// Guards against issue 17, item 4, as a user meets it: the run is refused with exit code 1
// and no folder is written.
#[test]
fn a_nan_knob_stops_the_run_before_any_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let body = "\n[scenario]\nname = \"energy_market\"\nstarting_resources = nan\n";
    let config = write(tmp.path(), "energy_market", body);
    let out = tmp.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args([
            "run",
            config.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "exp.toml:{}:1: field `starting_resources`: must be a number from 0 to 10^12, got NaN",
            line_of(body, "starting_resources")
        )),
        "{stderr}"
    );
    assert!(!out.exists());
}

/// A guessing-game config whose population has attribute `age` written as `attribute`.
fn with_age(attribute: &str) -> String {
    format!("\n[scenario]\nname = \"guess\"\n\n[population.attributes.age]\n{attribute}\n")
}

// Guards against issue 17, item 7: `integer = true` with `range = [18.2, 18.7]` (no whole
// number inside) passed validation, then panicked (`min > max`, exit 101) and left a folder
// with status `running`, whose `--resume` panicked the same way.
#[test]
fn a_whole_number_attribute_needs_a_whole_number_in_its_range() {
    for range in ["[18.2, 18.7]", "[0.1, 0.9]", "[-0.5, -0.1]", "[18.5, 18.5]"] {
        let body = with_age(&format!("range = {range}\ninteger = true"));
        refused(
            "guess",
            &body,
            "range =",
            "population.attributes.age.range",
            "holds no whole number",
        );
        // The same with a normal distribution, and as a real number without `integer`.
        let body = with_age(&format!(
            "range = {range}\ninteger = true\ndistribution = {{ normal = {{ mean = 18.4, sd = 2 }} }}"
        ));
        refused(
            "guess",
            &body,
            "range =",
            "population.attributes.age.range",
            "integer",
        );
        load("guess", &with_age(&format!("range = {range}"))).unwrap();
    }
    for range in ["[18, 18]", "[18.5, 19.5]", "[-3, 3]"] {
        load(
            "guess",
            &with_age(&format!("range = {range}\ninteger = true")),
        )
        .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let config = write(
        tmp.path(),
        "guess",
        &with_age("range = [18.2, 18.7]\ninteger = true"),
    );
    let out = tmp.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args([
            "run",
            config.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("holds no whole number"), "{stderr}");
    assert!(!out.exists(), "no folder for a config that cannot run");
}

// Guards against issue 17, item 7's siblings: other populations that cannot be drawn as
// written (inverted, unbounded or out-of-storage ranges, a distribution with no weight in its
// range, bands that are not numbers, shares of nothing) are refused at their line too.
#[test]
fn populations_that_cannot_be_drawn_are_refused_at_their_line() {
    for (attribute, needle, field, words) in [
        ("range = [80, 18]", "range", "range", "not a range"),
        ("range = [nan, 80]", "range", "range", "not a range"),
        ("range = [18, inf]", "range", "range", "not a range"),
        ("range = [0, 1e13]", "range", "range", "10^12"),
        ("range = [-1e308, 1e308]", "range", "range", "10^12"),
        (
            "range = [0, 100000000]\ninteger = true",
            "range",
            "range",
            "16777216",
        ),
        (
            "range = [18, 80]\ndistribution = { normal = { mean = 1000, sd = 1 } }",
            "distribution",
            "distribution",
            "no weight",
        ),
        (
            "range = [18, 80]\ndistribution = { normal = { mean = nan, sd = 1 } }",
            "distribution",
            "distribution",
            "finite mean",
        ),
        (
            "range = [18, 80]\ndistribution = { normal = { mean = 40, sd = 0 } }",
            "distribution",
            "distribution",
            "sd > 0",
        ),
        (
            "range = [18, 80]\nbands = [18, 30, inf]",
            "bands",
            "bands",
            "finite numbers",
        ),
        (
            "range = [18, 80]\nbands = [18, 60, 30]",
            "bands",
            "bands",
            "increasing",
        ),
        (
            "shares = { young = 50, old = 0 }",
            "shares",
            "shares",
            "share above 0",
        ),
        (
            "shares = { young = 50, old = nan }",
            "shares",
            "shares",
            "share above 0",
        ),
        ("shares = {}", "shares", "shares", "no categories"),
    ] {
        let body = with_age(attribute);
        refused(
            "guess",
            &body,
            &format!("{needle} ="),
            &format!("population.attributes.age.{field}"),
            words,
        );
    }
}

// Guards against issue 17, item 19: `steps = 2^40` was accepted, and ran writing one Parquet
// part per step; replicates and sweeps that multiply into millions of arms had no bound either.
#[test]
fn counts_have_documented_upper_bounds() {
    for (line, needle, words) in [
        (
            "steps = 1099511627776",
            "steps =",
            "1099511627776 steps are more than the 100000",
        ),
        ("steps = 100001", "steps =", "more than the 100000"),
        (
            "replicates = 1000001",
            "replicates =",
            "more than the 1000000",
        ),
    ] {
        let body = format!("{line}\n\n[scenario]\nname = \"guess\"\n");
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "guess", &body);
        // The header's own `steps = 1` gives way to the line under test.
        let text = std::fs::read_to_string(&path).unwrap().replacen(
            "steps = 1\n",
            "",
            usize::from(line.starts_with("steps")),
        );
        std::fs::write(&path, &text).unwrap();
        let err = throng::scenarios::Registry::builtin()
            .load(&path, &Overrides::default())
            .unwrap_err();
        let expected = 1 + text.lines().position(|l| l.contains(needle)).unwrap();
        assert_eq!(err.line(), Some(expected), "{err}");
        assert!(err.to_string().contains(words), "{err}");
    }
    // At the bounds, fine.
    load(
        "guess",
        "replicates = 1000000\n\n[scenario]\nname = \"guess\"\n",
    )
    .unwrap();
    // The same bounds for the command line's overrides.
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "guess", "\n[scenario]\nname = \"guess\"\n");
    for (overrides, flag) in [
        (
            Overrides {
                steps: Some(1 << 40),
                ..Overrides::default()
            },
            "--steps",
        ),
        (
            Overrides {
                replicates: Some(10_000_000),
                ..Overrides::default()
            },
            "--replicates",
        ),
        (
            Overrides {
                agents: Some(vec![2; 1001]),
                ..Overrides::default()
            },
            "--agents",
        ),
    ] {
        let err = throng::scenarios::Registry::builtin()
            .load(&path, &overrides)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(flag) && err.contains("more than"), "{err}");
    }
    let ok = Overrides {
        steps: Some(100_000),
        ..Overrides::default()
    };
    throng::scenarios::Registry::builtin()
        .load(&path, &ok)
        .unwrap();
    // A sweep is counted before its arms are made: 10 x 10 x 11 x 10 = 11,000.
    let ten: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    let body = format!(
        "\n[scenario]\nname = \"guess\"\n\n[sweep]\nscenario = {{ ratio = [{0}], offset = [{0}], memory = [{0}], reasoning_chars = [{1}] }}\n",
        ten.join(", "),
        (20..31)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    refused(
        "guess",
        &body,
        "[sweep]",
        "sweep",
        "11000 arms (1 x 10 x 10 x 10 x 11), more than the 10000",
    );
    // A whole run: refused before any folder, with exit code 1.
    let tmp = tempfile::tempdir().unwrap();
    let config = write(tmp.path(), "guess", "\n[scenario]\nname = \"guess\"\n");
    let out = tmp.path().join("run");
    let output = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args(["run", config.to_str().unwrap(), "--steps", "1099511627776"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--steps: 1099511627776 steps are more than the 100000"),
        "{stderr}"
    );
    assert!(!out.exists());
}

// Guards against issue 30, item 2: `agents = [3, 3]` ran the same cells twice under the same
// keys, and the report's intervals counted each game twice. A size listed twice is refused at
// its line (and on the command line); so is a sweep value written twice as `1` and `1.0`,
// which made the same arm under two names.
#[test]
fn a_population_size_or_sweep_value_listed_twice_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "guess", "\n[scenario]\nname = \"guess\"\n");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("agents = 4\n", "agents = [3, 5, 3]\n");
    std::fs::write(&path, &text).unwrap();
    let err = throng::scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .unwrap_err();
    let line = 1 + text.lines().position(|l| l.starts_with("agents")).unwrap();
    assert_eq!(err.line(), Some(line), "{err}");
    let said = err.to_string();
    assert!(
        said.contains("field `agents`")
            && said.contains("population size 3 is listed twice")
            && said.contains("list it once"),
        "{said}"
    );
    std::fs::write(&path, text.replace("agents = [3, 5, 3]\n", "agents = 4\n")).unwrap();
    let err = throng::scenarios::Registry::builtin()
        .load(
            &path,
            &Overrides {
                agents: Some(vec![6, 6]),
                ..Overrides::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("--agents") && err.contains("population size 6 is listed twice"),
        "{err}"
    );
    refused(
        "guess",
        "\n[scenario]\nname = \"guess\"\n\n[sweep]\nscenario = { offset = [1, 2, 1.0] }\n",
        "offset = [1",
        "sweep.scenario.offset",
        "`1.0` is listed twice",
    );
}

// Guards against issue 30, item 18: an arm that changed a knob shaping the first worlds from a
// later step (`from_step`) was refused only once the run had started, with advice to resume,
// which could never work. It is refused when the config is read, at the knob's line.
#[test]
fn a_knob_that_shapes_the_first_worlds_is_refused_from_a_step_at_its_line() {
    let body = "\n[scenario]\nname = \"energy_market\"\n\n[[arms]]\nname = \"cap\"\nfrom_step = 2\nscenario = { consumer_price_cap = 90.0 }\n\n[[arms]]\nname = \"richer\"\nfrom_step = 2\nscenario = { consumer_price_cap = 90.0, starting_resources = 50000.0 }\n";
    let text = body.replace("steps = 1", "");
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "energy_market", &text);
    let config = std::fs::read_to_string(&path)
        .unwrap()
        .replace("steps = 1\n", "steps = 4\n");
    std::fs::write(&path, &config).unwrap();
    let err = throng::scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .unwrap_err();
    let line = 1 + config
        .lines()
        .position(|l| l.contains("starting_resources = 50000.0"))
        .unwrap();
    let said = err.to_string();
    assert_eq!(err.line(), Some(line), "{said}");
    assert!(
        said.contains("arm `richer`")
            && said.contains("`starting_resources` shapes the worlds at the start")
            && !said.contains("`consumer_price_cap` shapes")
            && said.contains("leave `from_step` out")
            && !said.contains("--resume"),
        "{said}"
    );
    // A knob that acts on each step may change from a step.
    let fine = config.replace(", starting_resources = 50000.0", "");
    std::fs::write(&path, fine).unwrap();
    throng::scenarios::Registry::builtin()
        .load(&path, &Overrides::default())
        .unwrap();
}
