//! One pass over the state table: each round's histogram of guesses, round 1's guesses by
//! every population attribute, and each game's guesses by model.

use super::running::Running;
use crate::analysis::{ColumnProblem, ReportError};
use crate::record;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{ArrowError, DataType};
use std::collections::BTreeMap;
use std::path::Path;

pub(super) const BINS: usize = 50;

/// What is gathered from the state table in one pass.
#[derive(Default)]
pub(super) struct Gathered {
    /// (arm, population, round) -> counts per bin of width 2.
    pub(super) histograms: BTreeMap<(String, usize, usize), [u64; BINS]>,
    /// (arm, attribute, group) -> round 1 guesses.
    pub(super) groups: BTreeMap<(String, String, String), Running>,
    /// Attribute columns in table order, each with its groups in the population's order
    /// (categories as declared, numeric bands from low to high).
    pub(super) attributes: Vec<(String, Vec<String>)>,
    /// (arm, population, round, model, replicate) -> guesses, under a `model` column.
    pub(super) model_games: BTreeMap<(String, usize, usize, String, u64), Running>,
}

/// A column as dictionary keys and their labels (categories, or bands of a number).
struct Coded {
    keys: Vec<u32>,
    labels: Vec<String>,
}

fn coded(column: &dyn Array, edges: Option<&Vec<f64>>) -> Result<Coded, ArrowError> {
    if let DataType::Float32 | DataType::Float64 = column.data_type() {
        let values = arrow_cast::cast(column, &DataType::Float64)?;
        let values = values.as_primitive::<Float64Type>();
        return Ok(match edges {
            // Band index by binary search: no text per row.
            Some(e) => {
                let mut labels = vec![band(e[0] - 1.0, e)];
                labels.extend(e.iter().map(|&x| band(x, e)));
                let keys = (0..values.len())
                    .map(|i| e.partition_point(|&edge| edge <= values.value(i)) as u32)
                    .collect();
                Coded { keys, labels }
            }
            None => {
                let mut labels: Vec<String> = Vec::new();
                let mut index: std::collections::HashMap<i64, u32> = Default::default();
                let keys = (0..values.len())
                    .map(|i| {
                        let whole = values.value(i).round() as i64;
                        *index.entry(whole).or_insert_with(|| {
                            labels.push(whole.to_string());
                            labels.len() as u32 - 1
                        })
                    })
                    .collect();
                Coded { keys, labels }
            }
        });
    }
    let dictionary = arrow_cast::cast(
        column,
        &DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
    )?;
    let dictionary = dictionary.as_dictionary::<arrow_array::types::UInt32Type>();
    let values = dictionary.values().as_string::<i32>();
    Ok(Coded {
        keys: dictionary.keys().values().to_vec(),
        labels: (0..values.len())
            .map(|i| values.value(i).to_string())
            .collect(),
    })
}

/// The band label of `x` for the population's edges.
fn band(x: f64, edges: &[f64]) -> String {
    crate::sim::draw::band_label(x, edges)
}

/// Reads the state's guesses, by round and by every population attribute; the runner's keys
/// and the group levels (`levels`: a group index is no attribute to break guesses down by)
/// are skipped.
pub(super) fn gather(
    batches: &[RecordBatch],
    bands: &BTreeMap<String, Vec<f64>>,
    levels: &[String],
) -> Result<Gathered, ReportError> {
    const FIXED: [&str; 8] = [
        "arm",
        "population",
        "replicate",
        "step",
        "agent",
        "guess",
        "won",
        "policy",
    ];
    let mut g = Gathered::default();
    for batch in batches {
        let schema = batch.schema();
        if g.attributes.is_empty() {
            g.attributes = schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|n| !FIXED.contains(&n.as_str()) && !levels.contains(n))
                .map(|n| (n, Vec::new()))
                .collect();
        }
        let problem = |name: &str, problem| ReportError::Column {
            table: "state table",
            column: name.into(),
            problem,
        };
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| problem(name, ColumnProblem::Missing))
        };
        let coded_col = |name: &str, edges| {
            coded(col(name)?.as_ref(), edges)
                .map_err(|e| problem(name, ColumnProblem::Unreadable(e)))
        };
        // The runner writes these types; another writer's table is refused, not read wrong.
        let typed = |name: &str, expected: DataType| {
            let column = col(name)?;
            match column.data_type() == &expected {
                true => Ok(column.clone()),
                false => Err(problem(
                    name,
                    ColumnProblem::Type {
                        found: column.data_type().clone(),
                        expected,
                    },
                )),
            }
        };
        let arms = coded_col("arm", None)?;
        let population = typed("population", DataType::UInt64)?;
        let population = population.as_primitive::<UInt64Type>();
        let step = typed("step", DataType::UInt64)?;
        let step = step.as_primitive::<UInt64Type>();
        // The runner writes `model` when a game's agents ask several models; their rounds by
        // model need each game's own mean, so the replicate too.
        let model_at = g.attributes.iter().position(|(n, _)| n == "model");
        let replicate = match model_at {
            Some(_) => Some(typed("replicate", DataType::UInt64)?),
            None => None,
        };
        let replicate = replicate.as_ref().map(|r| r.as_primitive::<UInt64Type>());
        let guess = typed("guess", DataType::Float64)?;
        let guess = guess.as_primitive::<Float64Type>();
        let attributes: Vec<Coded> = g
            .attributes
            .iter()
            .map(|(name, _)| coded_col(name, bands.get(name)))
            .collect::<Result<_, _>>()?;
        // Round 1 sums per (arm key, attribute, group key), merged by label below.
        let mut local: Vec<Vec<Vec<Running>>> = attributes
            .iter()
            .map(|a| vec![vec![Running::default(); a.labels.len()]; arms.labels.len()])
            .collect();
        let mut histograms: BTreeMap<(u32, usize, usize), [u64; BINS]> = BTreeMap::new();
        for i in 0..batch.num_rows() {
            if guess.is_null(i) {
                continue;
            }
            let x = guess.value(i);
            let arm = arms.keys[i];
            let round = step.value(i) as usize;
            let bin = ((x / 2.0).floor() as usize).min(BINS - 1);
            histograms
                .entry((arm, population.value(i) as usize, round))
                .or_insert([0; BINS])[bin] += 1;
            if round == 1 {
                for (a, coded) in attributes.iter().enumerate() {
                    local[a][arm as usize][coded.keys[i] as usize].push(x);
                }
            }
            if let (Some(m), Some(replicate)) = (model_at, replicate) {
                let model = &attributes[m].labels[attributes[m].keys[i] as usize];
                if !model.is_empty() {
                    g.model_games
                        .entry((
                            arms.labels[arm as usize].clone(),
                            population.value(i) as usize,
                            round,
                            model.clone(),
                            replicate.value(i),
                        ))
                        .or_default()
                        .push(x);
                }
            }
        }
        for ((arm, population, round), counts) in histograms {
            let total = g
                .histograms
                .entry((arms.labels[arm as usize].clone(), population, round))
                .or_insert([0; BINS]);
            for (t, c) in total.iter_mut().zip(counts) {
                *t += c;
            }
        }
        for (a, coded) in attributes.iter().enumerate() {
            let (name, order) = &mut g.attributes[a];
            for label in &coded.labels {
                if !order.contains(label) {
                    order.push(label.clone());
                }
            }
            for (arm, per_group) in local[a].iter().enumerate() {
                for (k, running) in per_group.iter().enumerate().filter(|(_, r)| r.n > 0) {
                    g.groups
                        .entry((
                            arms.labels[arm].clone(),
                            name.clone(),
                            coded.labels[k].clone(),
                        ))
                        .or_default()
                        .merge(running);
                }
            }
        }
    }
    for ((name, order), _) in g.attributes.iter_mut().zip(0..) {
        if bands.contains_key(name) || order.iter().all(|l| l.parse::<f64>().is_ok()) {
            order.sort_by_key(|l| natural_key(l));
        }
    }
    Ok(g)
}

/// What the run's resolved config says of its attributes: band edges of numeric ones, and
/// the declared order of categorical ones' categories.
#[derive(Default)]
pub(super) struct AttributeInfo {
    pub(super) bands: BTreeMap<String, Vec<f64>>,
    pub(super) categories: BTreeMap<String, Vec<String>>,
}

pub(super) fn attribute_info(dir: &Path) -> AttributeInfo {
    let mut info = AttributeInfo::default();
    let Ok(text) = std::fs::read_to_string(dir.join(record::CONFIG)) else {
        return info;
    };
    let Ok(table) = text.parse::<toml::Table>() else {
        return info;
    };
    let Some(attrs) = table
        .get("population")
        .and_then(|p| p.get("attributes"))
        .and_then(|a| a.as_table())
    else {
        return info;
    };
    for (name, a) in attrs {
        if let Some(shares) = a.get("shares").and_then(|s| s.as_table()) {
            info.categories
                .insert(name.clone(), shares.keys().cloned().collect());
        }
        let edges: Vec<f64> = a
            .get("bands")
            .and_then(|b| b.as_array())
            .map(|b| {
                b.iter()
                    .filter_map(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
                    .collect()
            })
            .unwrap_or_default();
        if edges.len() >= 2 {
            info.bands.insert(name.clone(), edges);
        }
    }
    info
}

/// Orders `9-17` before `18-29` and `<18` first: by the first number in the label.
fn natural_key(label: &str) -> (i64, String) {
    let digits: String = label
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    let n = digits.parse::<i64>().unwrap_or(i64::MAX);
    let n = if label.starts_with('<') { i64::MIN } else { n };
    (n, label.to_string())
}

#[cfg(test)]
mod tests {
    use super::Running;
    use crate::analysis::stats::Summary;

    /// A group of few, skewed guesses (most at 0, one at 30) has a Student's t interval
    /// reaching below 0; the report's interval stops at the bound a mean guess cannot cross,
    /// and keeps the rest of the interval as it was.
    #[test]
    fn agent_intervals_stay_within_the_guess_range() {
        let guesses = [0.0, 0.0, 0.0, 0.0, 30.0];
        let mut running = Running::default();
        guesses.iter().for_each(|&g| running.push(g));
        let raw = Summary::of(&guesses).expect("a sample");
        assert!(raw.ci_low < 0.0, "the premise: t reaches below 0 here");
        let shown = running.summary().expect("a sample");
        assert_eq!(shown.ci_low, 0.0);
        assert!((shown.ci_high - raw.ci_high).abs() < 1e-9);
        assert!((shown.mean - 6.0).abs() < 1e-12);
    }

    /// Round means over two games keep Student's t interval (wide: one degree of freedom), cut
    /// at 0 rather than reaching below it.
    #[test]
    fn game_intervals_are_cut_at_the_bounds() {
        let games = [10.0, 14.0];
        let t = Summary::of(&games).expect("two games");
        assert!(t.ci_low < 0.0, "the premise: t reaches below 0 here");
        let shown = super::super::running::within_guess_bounds(t);
        assert_eq!(shown.interval(), Some((0.0, t.ci_high)));
        assert!(t.ci_high < 100.0);
    }

    /// A state table from another writer (a key column of another type, or none) is refused
    /// by column, where it used to panic or be read wrong.
    #[test]
    fn a_state_table_of_another_writer_is_refused_by_column() {
        use crate::analysis::{ColumnProblem, ReportError};
        use arrow_array::{
            ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array,
        };
        use std::sync::Arc;
        let batch = |population: ArrayRef| {
            RecordBatch::try_from_iter([
                ("arm", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
                ("population", population),
                ("step", Arc::new(UInt64Array::from(vec![1]))),
                ("guess", Arc::new(Float64Array::from(vec![33.0]))),
            ])
            .unwrap()
        };
        let bands = Default::default();
        let signed = batch(Arc::new(Int64Array::from(vec![5])));
        let e = super::gather(&[signed], &bands, &[])
            .err()
            .expect("refused");
        assert!(
            matches!(&e, ReportError::Column { column, problem: ColumnProblem::Type { .. }, .. }
                if column == "population"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("`population`") && e.to_string().contains("Int64"),
            "{e}"
        );
        let good = batch(Arc::new(UInt64Array::from(vec![5])));
        super::gather(std::slice::from_ref(&good), &bands, &[])
            .expect("the runner's types are read");
        let without = good.project(&[0, 1, 3]).unwrap();
        let e = super::gather(&[without], &bands, &[])
            .err()
            .expect("refused");
        assert!(
            matches!(&e, ReportError::Column { column, problem: ColumnProblem::Missing, .. }
                if column == "step"),
            "{e:?}"
        );
    }
}
