//! The game's sections of the page and its lines at the terminal.

use super::summary::{Report, RoundSummary};
use crate::analysis::html::{esc, headline, table, unfinished};
use crate::analysis::stats::Summary;
use std::fmt::Write as _;

pub(super) fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn num(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2}"))
}

/// The winning number of a round: both numbers of a game in which guesses on both sides of
/// the target won; over several games, the mean of the (lower) winning numbers and how many
/// games had a second one.
fn winning_text(r: &RoundSummary) -> String {
    match (r.two_sided_ties, r.replicates) {
        (0, _) => num(r.winning_number),
        (_, 1) => format!(
            "{} and {}",
            num(r.winning_number),
            num(r.tied_winning_number)
        ),
        (1, n) => format!(
            "{} (1 of {n} games also {})",
            num(r.winning_number),
            num(r.tied_winning_number)
        ),
        (k, n) => format!(
            "{} ({k} of {n} games also a higher one, mean {})",
            num(r.winning_number),
            num(r.tied_winning_number)
        ),
    }
}

fn mean_text(s: &Option<Summary>) -> String {
    match s {
        None => "-".into(),
        Some(s) => match s.interval() {
            Some((lo, hi)) => format!("{:.2} [{lo:.2}, {hi:.2}]", s.mean),
            None => format!("{:.2} (n={}: no CI)", s.mean, s.n),
        },
    }
}

fn seconds_text(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(s) if s < 1.0 => format!("{:.1} ms", s * 1e3),
        Some(s) => format!("{s:.2} s"),
    }
}

/// The key numbers as text lines, for the terminal.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let m = &report.manifest;
    if let Some(note) = unfinished(m) {
        let _ = writeln!(out, "NOTE: {note}");
    }
    for note in &report.notes {
        let _ = writeln!(out, "NOTE: {note}");
    }
    let _ = writeln!(out, "{}", headline(m));
    let _ = writeln!(
        out,
        "{:<36} {:>5} {:>22} {:>8} {:>8} {:>8} {:>7} {:>10}",
        "arm (players)",
        "round",
        "mean [95% CI]",
        "target",
        "winning",
        "winners",
        "std",
        "round time"
    );
    for r in &report.rounds {
        let _ = writeln!(
            out,
            "{:<36} {:>5} {:>22} {:>8} {:>8} {:>8.1} {:>7} {:>10}",
            format!("{} ({})", r.arm, r.population),
            r.round,
            mean_text(&r.mean),
            num(r.target),
            winning_text(r),
            r.winners,
            num(r.std),
            seconds_text(r.seconds),
        );
    }
    if report.rounds.iter().any(|r| r.two_sided_ties > 0) {
        let _ = writeln!(out, "{TIES}");
    }
    if !report.models.is_empty() {
        let _ = writeln!(
            out,
            "{:<36} {:>5} {:<28} {:>22} {:>6}",
            "by model: arm (players)", "round", "model", "mean [95% CI]", "games"
        );
        for r in &report.models {
            let _ = writeln!(
                out,
                "{:<36} {:>5} {:<28} {:>22} {:>6}",
                format!("{} ({})", r.arm, r.population),
                r.round,
                r.model,
                mean_text(&r.mean),
                r.games
            );
        }
    }
    for rule in &report.rules {
        let _ = writeln!(out, "equilibrium of {}: {}", rule.rule, rule.explanation);
    }
    for s in &report.levels {
        let _ = writeln!(
            out,
            "by {} at round {}: {} groups, {} of a group {} (sd {} between groups, {} to {})",
            s.level,
            s.step,
            s.groups,
            s.column,
            num(Some(s.mean)),
            num(Some(s.sd)),
            num(Some(s.lowest)),
            num(Some(s.highest))
        );
    }
    out
}

/// What a round with two winning numbers means, under the tables that show one.
const TIES: &str = "Where guesses on both sides of the target were equally close (a target of 22.5, guesses 22 and 23), every one of them won: both winning numbers are shown, all their agents count as winners, and aggregates.csv has the higher in `tied_winning_number`.";

/// The game's sections of `report.html`: the base report ([`crate::analysis::overview`]) puts
/// the run's notes and paragraph above them, and the game's figures, every column's breakdowns
/// and the group levels below.
pub(super) fn html(report: &Report) -> String {
    let mut body = String::new();
    rounds_section(&mut body, report);
    if !report.rules.is_empty() {
        body.push_str(
            "<h2>Equilibrium</h2><p>Guesses are clamped to [0, 100], so the equilibrium is a fixed \
             point of x &rarr; clamp(ratio &times; x + offset, 0, 100): a crowd that all guess it \
             has its target there.</p>",
        );
        body.push_str(&table(
            &["rule", "arms", "equilibrium"],
            report
                .rules
                .iter()
                .map(|r| vec![esc(&r.rule), esc(&r.arms.join(", ")), esc(&r.explanation)]),
        ));
    }
    if !report.models.is_empty() {
        body.push_str(
            "<h2>Rounds by model</h2><p>The agents of each game ask several models: each \
             model's mean guess per round, the mean over games of its agents' mean, with a 95% \
             CI over games (Student's t, cut at 0 and 100). Round 1 is the models' own answer \
             to the rules; later rounds follow what all the game's players did.</p>",
        );
        body.push_str(&table(
            &[
                "arm",
                "players",
                "round",
                "model",
                "mean [95% CI]",
                "games",
                "agents a game",
            ],
            report.models.iter().map(|r| {
                vec![
                    esc(&r.arm),
                    r.population.to_string(),
                    r.round.to_string(),
                    esc(&r.model),
                    mean_text(&r.mean),
                    r.games.to_string(),
                    r.agents.to_string(),
                ]
            }),
        ));
    }
    if !report.groups.is_empty() {
        body.push_str(
            "<h2>Round 1 by group</h2><p>Mean guess with a 95% CI across agents (Student's t, cut at 0 \
             and 100): in round 1 nobody has seen a result, so agents decide independently.</p>",
        );
        body.push_str(&table(
            &["arm", "attribute", "group", "mean [95% CI]", "agents"],
            report.groups.iter().map(|g| {
                vec![
                    esc(&g.arm),
                    esc(&g.attribute),
                    esc(&g.group),
                    mean_text(&g.mean),
                    g.mean.map_or("0".into(), |s| s.n.to_string()),
                ]
            }),
        ));
    }
    body
}

/// The Rounds section: every round's statistics per arm and population, and the note on
/// ties when a round had some.
fn rounds_section(body: &mut String, report: &Report) {
    body.push_str(
        "<h2>Rounds</h2><p>Each statistic is the mean over replicates (one game each); the interval of \
         the mean guess is a 95% CI over games (Student's t, cut at 0 and 100), shown when there are \
         at least two. Round time is the \
         wall time of the step that played the round, for all cells of that population at once.</p>",
    );
    body.push_str(&table(
        &[
            "arm",
            "players",
            "round",
            "winning number",
            "winners",
            "mean [95% CI]",
            "median",
            "std",
            "min",
            "max",
            "target",
            "guesses",
            "round time",
        ],
        report.rounds.iter().map(|r| {
            vec![
                esc(&r.arm),
                r.population.to_string(),
                r.round.to_string(),
                winning_text(r),
                format!("{:.1}", r.winners),
                mean_text(&r.mean),
                num(r.median),
                num(r.std),
                num(r.min),
                num(r.max),
                num(r.target),
                format!("{:.0} of {}", r.guesses, r.players),
                seconds_text(r.seconds),
            ]
        }),
    ));
    if report.rounds.iter().any(|r| r.two_sided_ties > 0) {
        let _ = write!(body, "<p>{}</p>", esc(TIES));
    }
}
