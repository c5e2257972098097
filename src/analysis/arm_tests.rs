//! Every arm against the first at the last step: for each population size, numeric column and
//! role, the replicates' means of one arm beside the first arm's, Welch's t-test between them,
//! and Holm's correction over the whole family, so that a run with an LLM arm beside its
//! scripted baseline (or any two arms) reads its comparison off the report.

use super::format::number as g;
use super::html::{self, esc};
use super::means::Mean;
use super::stats::{Welch, holm, welch};
use serde::Serialize;

/// One arm's column beside the first arm's, at the last step.
#[derive(Debug, Clone, Serialize)]
pub struct ArmTest {
    pub population: usize,
    pub column: String,
    /// `all` agents, or a `role`'s.
    pub by: String,
    pub value: String,
    pub step: usize,
    /// The first arm, which every other is set beside.
    pub reference: String,
    pub arm: String,
    pub reference_mean: f64,
    pub arm_mean: f64,
    /// Replicates of each side: the test's samples.
    pub reference_replicates: usize,
    pub arm_replicates: usize,
    pub welch: Option<Welch>,
    /// Holm's adjusted p over every test of the report.
    pub holm_p: Option<f64>,
    /// Why there is no test: too few replicates, or no variation on either side.
    pub why_not: Option<&'static str>,
}

/// The tests of every arm after `arms[0]` against it, from `means` (whose replicate means
/// they take), at `last_step`, over all agents and per role.
pub(super) fn arm_tests(means: &[Mean], arms: &[String], last_step: usize) -> Vec<ArmTest> {
    let Some(reference) = arms.first() else {
        return Vec::new();
    };
    let at_end = |m: &&Mean| m.step == last_step && (m.by == "all" || m.by == "role");
    let mut tests: Vec<ArmTest> = means
        .iter()
        .filter(at_end)
        .filter(|m| &m.arm != reference && arms.contains(&m.arm))
        .filter_map(|m| {
            let base = means.iter().filter(at_end).find(|b| {
                &b.arm == reference
                    && (b.population, &b.by, &b.value, &b.column)
                        == (m.population, &m.by, &m.value, &m.column)
            })?;
            let w = welch(&base.per_replicate, &m.per_replicate);
            Some(ArmTest {
                population: m.population,
                column: m.column.clone(),
                by: m.by.clone(),
                value: m.value.clone(),
                step: last_step,
                reference: reference.clone(),
                arm: m.arm.clone(),
                reference_mean: base.mean,
                arm_mean: m.mean,
                reference_replicates: base.replicates,
                arm_replicates: m.replicates,
                welch: w,
                holm_p: None,
                why_not: w
                    .is_none()
                    .then_some(if base.replicates < 2 || m.replicates < 2 {
                        "fewer than 2 replicates"
                    } else {
                        "no variation within either arm"
                    }),
            })
        })
        .collect();
    let tested: Vec<usize> = (0..tests.len())
        .filter(|&i| tests[i].welch.is_some())
        .collect();
    let p: Vec<f64> = tested.iter().map(|&i| tests[i].welch.unwrap().p).collect();
    for (&i, adjusted) in tested.iter().zip(holm(&p)) {
        tests[i].holm_p = Some(adjusted);
    }
    // In the order a reader scans them: arm, size, role, column.
    tests.sort_by(|a, b| {
        (&a.arm, a.population, &a.by, &a.value, &a.column).cmp(&(
            &b.arm,
            b.population,
            &b.by,
            &b.value,
            &b.column,
        ))
    });
    tests
}

/// The page's section: a table of every test, with what was tested and how said once.
pub(super) fn html(tests: &[ArmTest]) -> String {
    let Some(first) = tests.first() else {
        return String::new();
    };
    let rows = tests.iter().map(|t| {
        let (tv, p) = match t.welch {
            Some(w) => (format!("t = {}, df = {}", g(w.t), g(w.df)), p_text(w.p)),
            None => (t.why_not.unwrap_or("").to_string(), "-".into()),
        };
        vec![
            esc(&t.arm),
            t.population.to_string(),
            esc(&slice(t)),
            esc(&t.column),
            format!("{} ({})", g(t.arm_mean), t.arm_replicates),
            format!("{} ({})", g(t.reference_mean), t.reference_replicates),
            tv,
            p,
            t.holm_p.map_or("-".into(), p_text),
        ]
    });
    format!(
        "<h2>Arms compared</h2><p>Each arm beside the first, <b>{}</b>, at the last step \
         ({}): the mean of the replicates' means (replicates in brackets), Welch's t-test \
         between the two arms' replicate means, and its p-value adjusted by Holm's method over \
         all {} tests of this table.</p>{}",
        esc(&first.reference),
        first.step,
        tests.iter().filter(|t| t.welch.is_some()).count(),
        html::table(
            &[
                "arm",
                "agents",
                "agents compared",
                "column",
                "arm mean",
                "first arm's mean",
                "Welch's test",
                "p",
                "Holm's p",
            ],
            rows,
        )
    )
}

/// The terminal's lines: each test of all agents whose Holm p is below 0.05.
pub(super) fn text(tests: &[ArmTest]) -> String {
    let shown: Vec<String> = tests
        .iter()
        .filter(|t| t.holm_p.is_some_and(|p| p < 0.05))
        .map(|t| {
            format!(
                "  {} vs {} n={} {}{}: {} vs {} (Holm p {})\n",
                t.arm,
                t.reference,
                t.population,
                match t.by.as_str() {
                    "all" => String::new(),
                    _ => format!("{} ", t.value),
                },
                t.column,
                g(t.arm_mean),
                g(t.reference_mean),
                match t.holm_p.map(p_text) {
                    Some(p) if p.starts_with('<') => p,
                    Some(p) => format!("= {p}"),
                    None => String::new(),
                }
            )
        })
        .collect();
    match (tests.is_empty(), shown.is_empty()) {
        (true, _) => String::new(),
        (false, true) => format!(
            "Arms compared at the last step: no difference from `{}` with Holm p < 0.05 \
             ({} tests; report.html has them all)\n",
            tests[0].reference,
            tests.len()
        ),
        (false, false) => format!(
            "Arms compared at the last step, Holm p < 0.05 (report.html has all {}):\n{}",
            tests.len(),
            shown.concat()
        ),
    }
}

/// A p-value to three decimals, or `< 0.001`.
fn p_text(p: f64) -> String {
    match p < 0.001 {
        true => "< 0.001".into(),
        false => format!("{p:.3}"),
    }
}

fn slice(t: &ArmTest) -> String {
    match t.by.as_str() {
        "all" => "all".into(),
        _ => format!("{} {}", t.by, t.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean(arm: &str, column: &str, per: &[f64]) -> Mean {
        Mean {
            arm: arm.into(),
            population: 20,
            by: "all".into(),
            value: "all".into(),
            step: 5,
            column: column.into(),
            replicates: per.len(),
            mean: per.iter().sum::<f64>() / per.len() as f64,
            ci_low: None,
            ci_high: None,
            per_replicate: per.to_vec(),
        }
    }

    #[test]
    fn every_arm_is_tested_against_the_first_with_holm_over_the_family() {
        let means = vec![
            mean("llm", "offer", &[40.0, 42.0, 41.0]),
            mean("scripted", "offer", &[30.0, 30.5, 29.0]),
            mean("llm", "payoff", &[5.0, 5.0, 5.0]),
            mean("scripted", "payoff", &[5.0, 5.0, 5.0]),
            // Another step and an arm the run does not list are left out.
            Mean {
                step: 4,
                ..mean("scripted", "offer", &[1.0, 2.0, 3.0])
            },
        ];
        let arms = vec!["llm".to_string(), "scripted".to_string()];
        let tests = arm_tests(&means, &arms, 5);
        assert_eq!(tests.len(), 2);
        let offer = tests.iter().find(|t| t.column == "offer").unwrap();
        assert_eq!(
            (offer.reference.as_str(), offer.arm.as_str()),
            ("llm", "scripted")
        );
        let w = offer.welch.unwrap();
        assert!(w.p < 0.01, "{w:?}");
        // One test in the family: Holm's p is the test's own.
        assert_eq!(offer.holm_p, Some(w.p));
        let payoff = tests.iter().find(|t| t.column == "payoff").unwrap();
        assert_eq!(payoff.welch, None);
        assert_eq!(payoff.why_not, Some("no variation within either arm"));
        assert!(text(&tests).contains("scripted vs llm n=20 offer"));
        assert!(html(&tests).contains("Holm"));
    }

    #[test]
    fn a_single_replicate_says_why_there_is_no_test() {
        let means = vec![mean("a", "x", &[1.0]), mean("b", "x", &[2.0])];
        let tests = arm_tests(&means, &["a".into(), "b".into()], 5);
        assert_eq!(tests[0].why_not, Some("fewer than 2 replicates"));
        assert_eq!(tests[0].holm_p, None);
    }
}
