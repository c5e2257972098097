//! The example study as its users meet it: its own binary (throng's command line with one
//! more scenario) runs, resumes, reports and shares a run between MPI ranks; its nested pots
//! match a hand computation; a population its groups cannot divide is refused.

use public_goods::{Decision, Knobs, PublicGoods};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use throng::sim::groups::{Form, Groups, LevelSpec, Remainder};
use throng::sim::population::Population;
use throng::sim::scenario::Scenario;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The example's binary, run from its crate folder, without throng's fault variables.
fn study() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_public-goods"));
    cmd.current_dir(crate_dir());
    for var in ["THRONG_CRASH_AT", "THRONG_FULL_DISK_AT"] {
        cmd.env_remove(var);
    }
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out
}

/// A small scripted config: 40 citizens, teams of 4 in villages of 5 teams, 4 rounds, two
/// arms, two replicates.
fn small_config(dir: &Path) -> PathBuf {
    let path = dir.join("small.toml");
    std::fs::write(
        &path,
        format!(
            r#"name = "small"
seed = 11
replicates = 2
steps = 4
policy = "scripted"
templates = {:?}
agents = 40

[scenario]
name = "public_goods"
local = "team"
global = "village"

[[arms]]
name = "weak"
scenario = {{ global_factor = 2.0 }}

[[arms]]
name = "strong"
scenario = {{ global_factor = 8.0 }}

[[population.groups]]
level = "team"
size = 4

[[population.groups]]
level = "village"
size = 5
"#,
            crate_dir()
                .join("templates/public_goods")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    path
}

const RECORDS: [&str; 4] = [
    "state.parquet",
    "state.csv",
    "groups.parquet",
    "decisions.jsonl",
];

fn run(config: &Path, out: &Path) -> Output {
    ok({
        let mut c = study();
        c.args(["run"])
            .arg(config)
            .arg("--out")
            .arg(out)
            .arg("--no-report");
        c
    })
}

fn same_records(a: &Path, b: &Path) {
    for file in RECORDS {
        let (x, y) = (std::fs::read(a.join(file)), std::fs::read(b.join(file)));
        assert!(
            x.as_ref().ok() == y.as_ref().ok() && x.is_ok(),
            "{file} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

// Guards against a scenario outside throng getting a different run each time: two scripted
// runs of the same config and seed write the same bytes.
#[test]
fn scripted_runs_are_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    run(&config, &tmp.path().join("a"));
    run(&config, &tmp.path().join("b"));
    same_records(&tmp.path().join("a"), &tmp.path().join("b"));
    let csv = std::fs::read_to_string(tmp.path().join("a/state.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert_eq!(
        header,
        "arm,population,replicate,step,agent,team,village,kind,local,global,private,payoff,earnings",
        "the runner's keys, the group path, then the scenario's row"
    );
}

// Guards against a study of one's own losing throng's exact resume: killed in the middle of
// step 3 (after its state was written, before its checkpoint), resumed, it ends with the
// records of a run never killed.
#[test]
fn a_killed_run_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    let whole = tmp.path().join("whole");
    run(&config, &whole);
    let killed = tmp.path().join("killed");
    let out = study()
        .args(["run"])
        .arg(&config)
        .arg("--out")
        .arg(&killed)
        .arg("--no-report")
        .env("THRONG_CRASH_AT", "3:state")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the crash point stops it: {}",
        text(&out)
    );
    ok({
        let mut c = study();
        c.args(["run", "--resume"]).arg(&killed).arg("--no-report");
        c
    });
    same_records(&whole, &killed);
}

// Guards against issue 30, item 22: a study's pause message said `throng run --resume DIR`,
// and `throng` does not know the study's scenario, so the advice failed. It names the program
// that is running.
#[test]
fn a_paused_studys_message_names_its_own_program() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    let paused = tmp.path().join("paused");
    let out = ok({
        let mut c = study();
        c.args(["run"])
            .arg(&config)
            .arg("--out")
            .arg(&paused)
            .args(["--no-report", "--stop-after", "1"]);
        c
    });
    let said = text(&out);
    let program = env!("CARGO_BIN_EXE_public-goods");
    let advice = format!("{program} run --resume {}", paused.display());
    assert!(said.contains(&advice), "no `{advice}` in:\n{said}");
    assert!(!said.contains("throng run --resume"), "{said}");
    // The advice, followed, works.
    let args: Vec<&str> = advice.split(' ').skip(1).collect();
    ok({
        let mut c = study();
        c.args(&args).arg("--no-report");
        c
    });
}

// Guards against the base report missing from a scenario that writes none of its own: the
// report has the per-step means with intervals, the group levels, the figures and the caveat
// of a scripted run.
#[test]
fn its_report_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    let out = tmp.path().join("run");
    run(&config, &out);
    let printed = ok({
        let mut c = study();
        c.arg("report").arg(&out);
        c
    });
    let printed = String::from_utf8_lossy(&printed.stdout).to_string();
    assert!(printed.contains("Scripted policy"), "{printed}");
    assert!(printed.contains("payoff"), "{printed}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for part in [
        "At step 4",
        "Group levels at step 4",
        "village",
        "By kind",
        "Timing",
        "figures/mean_payoff.svg",
    ] {
        assert!(html.contains(part), "report.html lacks {part}");
    }
    let means = std::fs::read_to_string(out.join("means.csv")).unwrap();
    assert!(
        means.starts_with("arm,population,by,value,step,column,replicates,mean,ci_low,ci_high")
    );
    assert!(out.join("figures/mean_payoff.png").is_file());
    assert!(out.join("figures/distribution_local.svg").is_file());
}

/// Two teams of two in one village: citizens 0-1 in team 0, 2-3 in team 1.
fn two_teams() -> (PublicGoods, Population) {
    let levels = [
        LevelSpec {
            name: "team".into(),
            form: Form::Size {
                size: 2,
                remainder: Remainder::Refuse,
            },
        },
        LevelSpec {
            name: "village".into(),
            form: Form::Size {
                size: 2,
                remainder: Remainder::Refuse,
            },
        },
    ];
    let mut population = Population::plain(4);
    population.groups = Groups::build(&levels, population.size, &population.columns);
    let scenario = PublicGoods::new(Knobs {
        endowment: 20,
        local_factor: 1.5,
        global_factor: 2.0,
        ..Knobs::default()
    });
    (scenario, population)
}

// Guards against nested pots computed at the wrong level, shared among the wrong members, or
// settled in the wrong order: a fixed round worked by hand.
#[test]
fn pots_and_payoffs_match_a_hand_computation() {
    use throng::rand::SeedableRng;
    let (scenario, population) = two_teams();
    let mut rng = throng::rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut world = scenario.init(&population, &mut rng);
    let d = |local, global| Some(Decision { local, global });
    let decisions = [d(10, 0), d(0, 0), d(4, 8), d(20, 0)];
    scenario.resolve(&mut world, &population, &decisions, &mut rng);
    for group in population.groups.bottom_up() {
        scenario.react(&mut world, &population, group);
    }
    // Team 0's pot: 10 + 0 = 10, x1.5 = 15, 7.5 each. Team 1's: 4 + 20 = 24, x1.5 = 36, 18
    // each. The village's: 8, x2 = 16, 4 each of 4.
    assert_eq!(world.levels[0].total, vec![10.0, 24.0]);
    assert_eq!(world.levels[0].share, vec![7.5, 18.0]);
    assert_eq!(world.levels[1].total, vec![8.0]);
    assert_eq!(world.levels[1].share, vec![4.0]);
    // Kept + team share + village share.
    assert_eq!(
        world.payoff,
        vec![
            10.0 + 7.5 + 4.0,
            20.0 + 7.5 + 4.0,
            8.0 + 18.0 + 4.0,
            0.0 + 18.0 + 4.0
        ]
    );
    assert_eq!(world.earnings, world.payoff, "after one round");
    // Group paths, innermost first.
    let paths: Vec<Vec<(usize, usize)>> = (0..4)
        .map(|a| population.groups.path(a).collect())
        .collect();
    assert_eq!(
        paths,
        vec![
            vec![(0, 0), (1, 0)],
            vec![(0, 0), (1, 0)],
            vec![(0, 1), (1, 0)],
            vec![(0, 1), (1, 0)]
        ]
    );
    assert_eq!(population.groups.children(1, 0), &[0, 1]);
}

// Guards against a reply that gives more than the endowment being applied as it is.
#[test]
fn a_reply_over_the_endowment_is_scaled_to_it() {
    let (scenario, population) = two_teams();
    let mut rng = <throng::rand_chacha::ChaCha8Rng as throng::rand::SeedableRng>::seed_from_u64(0);
    let world = scenario.init(&population, &mut rng);
    let parsed = scenario
        .parse(
            &world,
            0,
            &throng::serde_json::json!({"local": 15, "global": 12}),
        )
        .unwrap();
    assert_eq!(
        parsed.decision,
        Decision {
            local: 15,
            global: 5
        }
    );
    assert_eq!(parsed.clamps.len(), 1, "{:?}", parsed.clamps);
    assert!(
        scenario
            .parse(&world, 0, &throng::serde_json::json!({"local": "lots"}))
            .is_err()
    );
}

// Guards against group sizes that do not divide the population being applied silently: the
// config is refused before a folder is written, naming the level and the sizes that divide.
#[test]
fn group_sizes_that_do_not_divide_the_population_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("agents = 40", "agents = 42");
    std::fs::write(&config, text).unwrap();
    let out = study()
        .args(["run"])
        .arg(&config)
        .arg("--out")
        .arg(tmp.path().join("run"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("small.toml")
            && err.contains("population.groups")
            && err.contains("42 agents do not divide")
            && err.contains("multiple of 4"),
        "{err}"
    );
    assert!(!tmp.path().join("run").exists(), "nothing written");
}

// Guards against nested records that do not add up: every team's pot in groups.parquet
// terms is recomputed from the state rows (members' local contributions, times the factor,
// over the members), and each citizen's payoff is what it kept plus its two shares.
#[test]
fn records_add_up_by_hand() {
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    let out = tmp.path().join("run");
    run(&config, &out);
    let csv = std::fs::read_to_string(out.join("state.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    assert_eq!(
        rows.len(),
        2 * 2 * 4 * 40,
        "arms x replicates x steps x agents"
    );
    use std::collections::BTreeMap;
    // (arm, replicate, step, team) -> sum of local; (.., village) -> sum of global.
    let mut team: BTreeMap<(String, String, String, String), f64> = BTreeMap::new();
    let mut village: BTreeMap<(String, String, String, String), f64> = BTreeMap::new();
    for r in &rows {
        let key = |level: &str| {
            (
                r[col("arm")].clone(),
                r[col("replicate")].clone(),
                r[col("step")].clone(),
                r[col(level)].clone(),
            )
        };
        *team.entry(key("team")).or_default() += r[col("local")].parse::<f64>().unwrap();
        *village.entry(key("village")).or_default() += r[col("global")].parse::<f64>().unwrap();
    }
    for r in &rows {
        let f = |name: &str| r[col(name)].parse::<f64>().unwrap();
        let global_factor = if r[col("arm")] == "weak" { 2.0 } else { 8.0 };
        let key = |level: &str| {
            (
                r[col("arm")].clone(),
                r[col("replicate")].clone(),
                r[col("step")].clone(),
                r[col(level)].clone(),
            )
        };
        let expected = f("private")
            + team[&key("team")] * 1.6 / 4.0
            + village[&key("village")] * global_factor / 20.0;
        assert!(
            (f("payoff") - expected).abs() < 1e-9,
            "row {r:?}: payoff {} vs {expected} by hand",
            f("payoff")
        );
        assert_eq!(f("private") + f("local") + f("global"), 20.0);
    }
    // Every citizen of a team is in that team's village (teams of 4, villages of 5 teams).
    for r in &rows {
        let t: usize = r[col("team")].parse().unwrap();
        let v: usize = r[col("village")].parse().unwrap();
        let agent: usize = r[col("agent")].parse().unwrap();
        assert_eq!((t, v), (agent / 4, agent / 20), "agent {agent}");
    }
    assert!(out.join("groups.parquet").is_file());
}

/// `mpirun`, or `None` after a loud message (a failure under THRONG_REQUIRE_ASSETS=1, as in CI).
#[cfg(feature = "mpi")]
fn mpirun() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("mpirun"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("THRONG_REQUIRE_ASSETS").is_ok_and(|v| v == "1") {
            panic!("mpirun is required (THRONG_REQUIRE_ASSETS=1): apt-get install openmpi-bin");
        }
        eprintln!("\n{0}\nSKIPPED: mpirun not found\n{0}\n", "!".repeat(78));
    }
    found
}

// Guards against a scenario of one's own that works in one process only: 2 ranks write the
// records of 1.
#[cfg(feature = "mpi")]
#[test]
fn two_ranks_give_the_records_of_one() {
    let Some(mpirun) = mpirun() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let config = small_config(tmp.path());
    let one = tmp.path().join("one");
    run(&config, &one);
    let two = tmp.path().join("two");
    let out = Command::new(mpirun)
        .current_dir(crate_dir())
        .args(["-np", "2", "--oversubscribe", "--bind-to", "none"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .arg(env!("CARGO_BIN_EXE_public-goods"))
        .args(["run"])
        .arg(&config)
        .arg("--out")
        .arg(&two)
        .arg("--no-report")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for file in ["state.parquet", "state.csv", "groups.parquet"] {
        assert_eq!(
            std::fs::read(one.join(file)).unwrap(),
            std::fs::read(two.join(file)).unwrap(),
            "{file}"
        );
    }
}

/// The SmolLM2 file from throng's cache (downloading it if needed), or `None` after a loud
/// message when offline (a failure under THRONG_REQUIRE_ASSETS=1).
fn smollm2() -> Option<PathBuf> {
    match throng::assets::ensure_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf") {
        Ok(path) => Some(path),
        Err(e) if std::env::var("THRONG_REQUIRE_ASSETS").is_ok_and(|v| v == "1") => {
            panic!("SmolLM2 is required (THRONG_REQUIRE_ASSETS=1): {e}")
        }
        Err(e) => {
            eprintln!(
                "\n{0}\nSKIPPED: SmolLM2 unavailable: {e}\n{0}\n",
                "!".repeat(78)
            );
            None
        }
    }
}

// Guards against a study's prompts or schema that the model cannot answer: a short SmolLM2
// run of the shipped config ends with its decisions valid (parsed, within the endowment),
// and the rules and group results are served from the prefix cache.
#[test]
fn a_short_smollm2_run_ends_with_valid_decisions() {
    if smollm2().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let ran = ok({
        let mut c = study();
        c.args([
            "run",
            "experiments/nested-llm.toml",
            "--steps",
            "2",
            "--out",
        ])
        .arg(&out);
        c
    });
    let log = std::fs::read_to_string(out.join("decisions.jsonl")).unwrap();
    let records: Vec<throng::serde_json::Value> = log
        .lines()
        .map(|l| throng::serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 60 * 2, "{}", text(&ran));
    let valid = records.iter().filter(|r| r["fallback"].is_null()).count();
    assert!(
        valid * 10 >= records.len() * 9,
        "{valid} of {} decisions valid",
        records.len()
    );
    for r in &records {
        let d = &r["decision"];
        let (l, g) = (d["local"].as_u64().unwrap(), d["global"].as_u64().unwrap());
        assert!(l + g <= 20, "{r}");
    }
    let summary: throng::serde_json::Value =
        throng::serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
            .unwrap();
    let hit = summary["timing"]["prefix_hit_rate"].as_f64().unwrap();
    assert!(hit > 0.5, "prefix-cache hit rate {hit}");
}
