//! The guessing game in nested groups: with `group = "<level>"` every group of that level
//! plays a game of its own, and the records and the report say how the levels differ.

mod common;

use common::cli::{output, repo, throng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn config(dir: &Path, group: &str) -> PathBuf {
    let path = dir.join("groups.toml");
    std::fs::write(
        &path,
        format!(
            r#"name = "grouped"
seed = 5
replicates = 2
steps = 3
policy = "scripted"
templates = {:?}
agents = 60

[scenario]
name = "guess"
{group}

[population.attributes.education]
shares = {{ "high school" = 50, "doctorate" = 50 }}

[[population.groups]]
level = "team"
size = 6

[[population.groups]]
level = "league"
size = 5
"#,
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    path
}

// Guards against a grouped game scored over the whole cell: each team's target is 2/3 of its
// own members' mean guess, its winners the members closest to it (both sides of a tie), and
// `won` in the records says so; recomputed here from state.csv alone.
#[test]
fn each_group_plays_its_own_game() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "group = \"team\"");
    let out = tmp.path().join("run");
    let ran = output(throng().arg("run").arg(&cfg).arg("--out").arg(&out));
    assert!(ran.ok, "{}", ran.text);
    let csv = std::fs::read_to_string(out.join("state.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        header,
        [
            "arm",
            "population",
            "replicate",
            "step",
            "agent",
            "team",
            "league",
            "education",
            "guess",
            "won"
        ]
    );
    // (replicate, step, team) -> [(guess, won)]
    let mut games: BTreeMap<(String, String, String), Vec<(f64, bool)>> = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let agent: usize = f[4].parse().unwrap();
        assert_eq!(
            f[5].parse::<usize>().unwrap(),
            agent / 6,
            "teams of 6 in order"
        );
        assert_eq!(
            f[6].parse::<usize>().unwrap(),
            agent / 30,
            "leagues of 5 teams"
        );
        games
            .entry((f[2].into(), f[3].into(), f[5].into()))
            .or_default()
            .push((f[8].parse().unwrap(), f[9] == "true"));
    }
    assert_eq!(games.len(), 2 * 3 * 10, "replicates x rounds x teams");
    let mut targets = Vec::new();
    for (key, players) in &games {
        let mean = players.iter().map(|p| p.0).sum::<f64>() / players.len() as f64;
        let target = mean * 2.0 / 3.0;
        let best = players
            .iter()
            .map(|p| (p.0 - target).abs())
            .fold(f64::INFINITY, f64::min);
        for (guess, won) in players {
            assert_eq!(
                *won,
                ((guess - target).abs() - best).abs() < 1e-9,
                "{key:?}: guess {guess}, target {target}"
            );
        }
        targets.push(target);
    }
    targets.sort_by(f64::total_cmp);
    assert!(
        targets[0] < targets[targets.len() - 1] - 1.0,
        "teams' targets differ: {targets:?}"
    );
    // The teams' rounds, one row per team and round, and the report's levels.
    let rounds = throng::record::read_table(&out, "group_rounds").unwrap();
    let rows: usize = rounds.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 2 * 3 * 10);
    let groups = throng::record::read_table(&out, "groups").unwrap();
    let rows: usize = groups.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 2 * 3 * (10 + 2), "teams and leagues, rounds 1 to 3");
    let report = output(throng().arg("report").arg(&out));
    assert!(report.ok, "{}", report.text);
    assert!(
        report.text.contains("by team at round 3: 20 groups, guess")
            && report.text.contains("by league at round 3: 4 groups"),
        "{}",
        report.text
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("Group levels at step 3"), "report.html");
    // A group index is no attribute: guesses are broken down by education, not by team.
    assert!(out.join("fig_by_education.svg").is_file());
    assert!(!out.join("fig_by_team.svg").exists() && !out.join("fig_by_league.svg").exists());
}

// Guards against a `group` that names no level being ignored: the whole cell would then play
// one game while the config says otherwise.
#[test]
fn a_group_that_is_not_a_level_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "group = \"village\"");
    let ran = output(
        throng()
            .arg("run")
            .arg(&cfg)
            .arg("--out")
            .arg(tmp.path().join("run")),
    );
    assert_eq!(ran.code, Some(1), "{}", ran.text);
    assert!(
        ran.text.contains("groups.toml")
            && ran.text.contains("groups.toml:11:")
            && ran.text.contains("field `group`")
            && ran.text.contains("`village` is not a group level")
            && ran.text.contains("team, league"),
        "{}",
        ran.text
    );
}
