//! Populations: draws follow the configured distributions (exact quotas exactly, independent
//! draws within a chi-square bound), reproducibly by seed, and bad shares are refused at
//! their file and line.

use statrs::distribution::{ChiSquared, ContinuousCDF};
use throng::sim::draw::quota_counts;
use throng::sim::experiment::{Experiment, Overrides};
use throng::sim::population::{Column, Draw, PopulationSpec};

fn spec(body: &str) -> PopulationSpec {
    load(body).unwrap().population
}

fn load(body: &str) -> Result<Experiment, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exp.toml");
    std::fs::write(
        &path,
        format!("name = \"p\"\nsteps = 1\nagents = 10\n\n[scenario]\nname = \"guess\"\n\n{body}"),
    )
    .unwrap();
    Experiment::load(&path, &Overrides::default()).map_err(|e| e.to_string())
}

const EDUCATION: &str = r#"
[population.attributes.education]
shares = { "elementary school" = 10, "high school" = 35, "bachelor's degree" = 30, "master's degree" = 17, "doctorate" = 8 }
"#;

fn counts(column: &Column, categories: usize) -> Vec<usize> {
    let Column::Categorical { codes, .. } = column else {
        panic!("categorical expected")
    };
    let mut c = vec![0; categories];
    for &code in codes {
        c[code as usize] += 1;
    }
    c
}

#[test]
fn quotas_are_exact_and_sum_to_the_population() {
    let s = spec(&format!("[population]\ndraw = \"quota\"\n{EDUCATION}"));
    let p = s.draw(1000, 1);
    assert_eq!(counts(&p.columns[0].1, 5), vec![100, 350, 300, 170, 80]);
    // Rounding repaired by the largest remainders: 7 x (10, 35, 30, 17, 8)% = 0.7, 2.45,
    // 2.1, 1.19, 0.56 -> floors 0, 2, 2, 1, 0 (5), then +1 to 0.7 and 0.56.
    assert_eq!(
        quota_counts(&[0.10, 0.35, 0.30, 0.17, 0.08], 7),
        vec![1, 2, 2, 1, 1]
    );
    for n in [1, 2, 3, 99, 1001] {
        assert_eq!(
            quota_counts(&[0.10, 0.35, 0.30, 0.17, 0.08], n)
                .iter()
                .sum::<usize>(),
            n
        );
    }
    // Categories keep the order they are written in.
    let Column::Categorical { categories, .. } = &p.columns[0].1 else {
        unreachable!()
    };
    assert_eq!(categories[0], "elementary school");
    assert_eq!(categories[4], "doctorate");
}

#[test]
fn independent_draws_pass_a_chi_square_test_over_100k_agents() {
    let s = spec(&format!(
        "[population]\ndraw = \"independent\"\n{EDUCATION}"
    ));
    assert_eq!(s.draw, Draw::Independent);
    let n = 100_000;
    let p = s.draw(n, 42);
    let observed = counts(&p.columns[0].1, 5);
    let expected: Vec<f64> = [0.10, 0.35, 0.30, 0.17, 0.08]
        .iter()
        .map(|s| s * n as f64)
        .collect();
    let chi2: f64 = observed
        .iter()
        .zip(&expected)
        .map(|(&o, e)| (o as f64 - e).powi(2) / e)
        .sum();
    // Refused only one time in a thousand when the draw is right.
    let bound = ChiSquared::new(4.0).unwrap().inverse_cdf(0.999);
    assert!(chi2 < bound, "chi2 {chi2} >= {bound}: {observed:?}");
    // Not quotas: the counts are not the exact shares.
    assert_ne!(observed, vec![10_000, 35_000, 30_000, 17_000, 8_000]);
}

#[test]
fn draws_are_reproducible_by_seed() {
    let s = spec(&format!(
        "{EDUCATION}\n[population.attributes.age]\nrange = [18, 80]\ninteger = true\n"
    ));
    assert_eq!(s.draw(500, 9), s.draw(500, 9));
    assert_ne!(s.draw(500, 9), s.draw(500, 10));
}

#[test]
fn numeric_attributes_stay_in_range_and_follow_their_distribution() {
    let s = spec(
        "[population.attributes.age]\nrange = [18, 80]\ndistribution = { normal = { mean = 42, sd = 15 } }\ninteger = true\n",
    );
    let p = s.draw(20_000, 3);
    let Column::Numeric { values, .. } = &p.columns[0].1 else {
        panic!()
    };
    assert!(
        values
            .iter()
            .all(|&v| (18.0..=80.0).contains(&v) && v.fract() == 0.0)
    );
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
    // The truncated normal's mean is a little above 42 (more is cut below than above).
    assert!((42.0..44.0).contains(&mean), "mean {mean}");
    let uniform = spec("[population.attributes.x]\nrange = [0, 1]\n").draw(10_000, 3);
    let Column::Numeric { values, .. } = &uniform.columns[0].1 else {
        panic!()
    };
    // Quota draws of a numeric attribute are stratified: one value per 1/N band.
    let mut sorted = values.clone();
    sorted.sort_by(f32::total_cmp);
    for (i, v) in sorted.iter().enumerate() {
        assert!((*v as f64) >= i as f64 / 1e4 - 1e-6 && (*v as f64) <= (i + 1) as f64 / 1e4 + 1e-6);
    }
}

#[test]
fn joint_tables_draw_correlated_attributes_together() {
    let s = spec(
        r#"
[population.attributes.education]
shares = { school = 50, university = 50 }
[population.attributes.occupation]
shares = { farmer = 50, economist = 50 }
[[population.joint]]
attributes = ["education", "occupation"]
rows = [
  { education = "school", occupation = "farmer", share = 45 },
  { education = "university", occupation = "economist", share = 45 },
  { education = "school", occupation = "economist", share = 5 },
  { education = "university", occupation = "farmer", share = 5 },
]
"#,
    );
    let p = s.draw(1000, 5);
    let (Column::Categorical { codes: e, .. }, Column::Categorical { codes: o, .. }) =
        (&p.columns[0].1, &p.columns[1].1)
    else {
        panic!()
    };
    let together = e.iter().zip(o).filter(|(a, b)| a == b).count();
    assert_eq!(
        together, 900,
        "school-farmer and university-economist: 45% + 45%"
    );
}

#[test]
fn bad_populations_are_refused_at_their_line() {
    // Line numbers: the helper writes 7 lines before the body.
    let err =
        load("[population.attributes.education]\nshares = { school = 60, university = 37 }\n")
            .unwrap_err();
    assert!(
        err.contains("exp.toml:9:") && err.contains("sum to 97%"),
        "{err}"
    );
    let err = load("[population.attributes.education]\nshares = {}\n").unwrap_err();
    assert!(
        err.contains(":9:") && err.contains("no categories"),
        "{err}"
    );
    let err = load("[population.attributes.education]\nshares = { school = 100, \"\" = 0 }\n")
        .unwrap_err();
    assert!(
        err.contains("empty name") || err.contains("share 0"),
        "{err}"
    );
    let err = load("[population.attributes.age]\nrange = [80, 18]\n").unwrap_err();
    assert!(err.contains(":9:") && err.contains("not a range"), "{err}");
    let err = load(
        "[population.attributes.education]\nshares = { a = 100 }\n\n[[population.joint]]\nattributes = [\"education\", \"occupaton\"]\nrows = []\n",
    )
    .unwrap_err();
    assert!(
        err.contains(":12:") && err.contains("unknown attribute `occupaton`"),
        "{err}"
    );
    let err = load("[population.attributes.education]\nshare = { a = 100 }\n").unwrap_err();
    assert!(err.contains("share") && err.contains(":9:"), "{err}");
}
