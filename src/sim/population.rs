//! Populations: who the agents are. A config's `[population]` section describes attributes
//! (education, age, occupation, or any of the user's own), each categorical with shares or
//! numeric with a range and a distribution, optionally drawn together from a joint table when
//! they must correlate. A cell's agents are drawn from it by seed (see [`super::draw`]).
//!
//! Drawn agents are columns (one small integer or float per agent and attribute), so that a
//! million agents cost a few megabytes.
#![warn(missing_docs)]

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

pub use super::column::Column;
use super::groups::{Groups, LevelConfig, LevelSpec};

/// Shares that sum to within this of 100% (or of 1) are accepted.
const SHARE_TOLERANCE: f64 = 1e-6;
/// The largest magnitude of a numeric attribute's range (values are kept as `f32`).
const MAX_NUMERIC: f64 = 1e12;
/// The largest magnitude of a whole-number attribute: `f32` holds every whole number up to
/// 2^24, and not all of them beyond.
const MAX_WHOLE: f64 = 16_777_216.0;
/// Categories of an attribute, and rows of a joint table, are numbered in 16 bits.
const MAX_CATEGORIES: usize = u16::MAX as usize + 1;

/// How agents are drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Draw {
    /// Exact counts: each category gets share x N agents, the rounding repaired by largest
    /// remainders; numeric attributes are stratified (one draw per 1/N quantile band).
    #[default]
    Quota,
    /// Every agent drawn on its own from the shares or the distribution.
    Independent,
}

/// The `[population]` section as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PopulationConfig {
    /// How agents are drawn: quotas (the default) or each on its own.
    #[serde(default)]
    pub draw: Draw,
    /// Attributes by name, in the order written.
    #[serde(default)]
    pub attributes: indexmap::IndexMap<String, toml::Spanned<AttributeConfig>>,
    /// Attributes drawn together from a table of combinations.
    #[serde(default)]
    pub joint: Vec<toml::Spanned<JointConfig>>,
    /// LLM-written personas, one per agent, from a meta-prompt template.
    pub personas: Option<toml::Spanned<PersonaConfig>>,
    /// Nested groups, innermost level first (see [`crate::sim::groups`]).
    #[serde(default)]
    pub groups: Vec<toml::Spanned<LevelConfig>>,
}

/// One attribute as written: `shares` (categorical) or `range` (numeric).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttributeConfig {
    /// Category -> share, in percent (summing to 100) or as fractions (summing to 1).
    pub shares: Option<indexmap::IndexMap<String, f64>>,
    /// `[low, high]` of a numeric attribute.
    pub range: Option<[f64; 2]>,
    /// `"uniform"` (default) or `{ normal = { mean = 40, sd = 12 } }`, truncated to `range`.
    #[serde(default)]
    pub distribution: NumericDistribution,
    /// Round numeric values to whole numbers (ages, years).
    #[serde(default)]
    pub integer: bool,
    /// Band edges for reports (`[18, 30, 45, 60, 80]` gives `18-29`, `30-44`, ...).
    pub bands: Option<Vec<f64>>,
}

/// How a numeric attribute's values spread between its `low` and `high`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NumericDistribution {
    /// Evenly.
    #[default]
    Uniform,
    /// A normal distribution, cut at `low` and `high`.
    Normal {
        /// Its mean.
        mean: f64,
        /// Its standard deviation.
        sd: f64,
    },
}

/// A joint table: rows of attribute values with a share each.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JointConfig {
    /// The attributes it draws together, by name.
    pub attributes: Vec<String>,
    /// Each row: a value for every attribute, and `share`.
    pub rows: Vec<toml::Table>,
}

/// LLM-written personas (see `sim::policy::persona`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PersonaConfig {
    /// The meta-prompt template, in the scenario's templates folder.
    #[serde(default = "default_persona_template")]
    pub template: String,
    /// The longest persona, in tokens.
    #[serde(default = "default_persona_tokens")]
    pub max_tokens: usize,
    /// The sampling temperature of the persona's writing.
    #[serde(default = "default_persona_temperature")]
    pub temperature: f32,
}

fn default_persona_template() -> String {
    "persona.jinja".into()
}
fn default_persona_tokens() -> usize {
    120
}
fn default_persona_temperature() -> f32 {
    0.9
}

/// A population problem, at a byte span of the config when known.
#[derive(Debug, Clone, PartialEq)]
pub struct PopulationProblem {
    /// Where in the config file, when known.
    pub span: Option<Range<usize>>,
    /// The field at fault, under `population`.
    pub field: String,
    /// What is wrong, and the fix.
    pub message: String,
}

impl PopulationProblem {
    fn new(span: Option<Range<usize>>, field: impl Into<String>, msg: impl Into<String>) -> Self {
        Self {
            span,
            field: field.into(),
            message: msg.into(),
        }
    }
}

/// A validated attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    /// One of a list of categories (`gender`, `region`).
    Categorical {
        /// Its name: a column of the records and a variable of the prompts.
        name: String,
        /// Its categories, in the order written.
        categories: Arc<[String]>,
        /// Fractions summing to 1.
        shares: Vec<f64>,
    },
    /// A number in `[low, high]` (`age`, `income`).
    Numeric {
        /// Its name: a column of the records and a variable of the prompts.
        name: String,
        /// The smallest value.
        low: f64,
        /// The largest value.
        high: f64,
        /// How values spread between them.
        distribution: NumericDistribution,
        /// Whether values are whole numbers.
        integer: bool,
        /// Band edges for the report (`[18, 30, 45, 65]`), when given.
        bands: Option<Vec<f64>>,
    },
}

impl Attribute {
    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Attribute::Categorical { name, .. } | Attribute::Numeric { name, .. } => name,
        }
    }
}

/// A validated joint table over categorical attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct Joint {
    /// Indices into the spec's attributes.
    pub attributes: Vec<usize>,
    /// Per row, the category index of each attribute, and the row's share (fractions).
    pub rows: Vec<(Vec<u16>, f64)>,
}

/// The validated `[population]` section: what [`PopulationSpec::draw`] draws from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PopulationSpec {
    /// How agents are drawn.
    pub draw: Draw,
    /// Its attributes, in the order written.
    pub attributes: Vec<Attribute>,
    /// Attributes drawn together from tables of combinations.
    pub joints: Vec<Joint>,
    /// LLM-written personas, when asked for.
    pub personas: Option<PersonaConfig>,
    /// Nested groups, innermost level first.
    pub groups: Vec<LevelSpec>,
}

fn fractions(
    shares: &indexmap::IndexMap<String, f64>,
    span: &Range<usize>,
    field: &str,
) -> Result<Vec<f64>, PopulationProblem> {
    let problem = |m: String| PopulationProblem::new(Some(span.clone()), field, m);
    if shares.is_empty() {
        return Err(problem(
            "has no categories: give at least one, with its share".into(),
        ));
    }
    if shares.len() > MAX_CATEGORIES {
        return Err(problem(format!(
            "has {} categories, more than the {MAX_CATEGORIES} an attribute can hold",
            shares.len()
        )));
    }
    for (name, &share) in shares {
        if name.trim().is_empty() {
            return Err(problem("a category has an empty name".into()));
        }
        if !(share.is_finite() && share > 0.0) {
            return Err(problem(format!(
                "category `{name}` has share {share}: every category needs a share above 0 (remove it otherwise)"
            )));
        }
    }
    normalise(shares.values().copied(), field, span)
}

/// Shares in percent (sum 100) or fractions (sum 1), as fractions.
fn normalise(
    shares: impl Iterator<Item = f64> + Clone,
    field: &str,
    span: &Range<usize>,
) -> Result<Vec<f64>, PopulationProblem> {
    let sum: f64 = shares.clone().sum();
    let scale = if (sum - 100.0).abs() <= 100.0 * SHARE_TOLERANCE {
        100.0
    } else if (sum - 1.0).abs() <= SHARE_TOLERANCE {
        1.0
    } else if shares.clone().all(|s| s <= 1.0) {
        // Written as fractions (none above 1), so read as fractions.
        return Err(PopulationProblem::new(
            Some(span.clone()),
            field,
            format!(
                "shares sum to {}: as fractions they must sum to 1 (or, in percent, to 100)",
                fmt_number(sum)
            ),
        ));
    } else {
        return Err(PopulationProblem::new(
            Some(span.clone()),
            field,
            format!(
                "shares sum to {}%: they must sum to 100% (or to 1, as fractions)",
                fmt_number(sum)
            ),
        ));
    };
    Ok(shares.map(|s| s / scale).collect())
}

pub(super) fn fmt_number(x: f64) -> String {
    let s = format!("{x:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl PopulationConfig {
    /// Checks the section and resolves it. `span` is the section's own, for problems that
    /// have no better place.
    pub fn validate(
        &self,
        span: Option<Range<usize>>,
    ) -> Result<PopulationSpec, PopulationProblem> {
        let mut attributes = Vec::new();
        let mut index: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, spanned) in &self.attributes {
            let attribute = attribute(name, spanned)?;
            index.insert(name.as_str(), attributes.len());
            attributes.push(attribute);
        }
        let joints = self.joints(&attributes, &index)?;
        self.check_personas()?;
        let _ = span;
        let categorical: Vec<&str> = attributes
            .iter()
            .filter(|a| matches!(a, Attribute::Categorical { .. }))
            .map(Attribute::name)
            .collect();
        let names: Vec<&str> = attributes.iter().map(Attribute::name).collect();
        let groups = super::groups::validate(&self.groups, &categorical, &names)
            .map_err(|p| PopulationProblem::new(p.span, p.field, p.message))?;
        Ok(PopulationSpec {
            draw: self.draw,
            attributes,
            joints,
            personas: self.personas.as_ref().map(|p| p.get_ref().clone()),
            groups,
        })
    }

    /// The joint tables, checked against the attributes (`index`: each one's place).
    fn joints(
        &self,
        attributes: &[Attribute],
        index: &BTreeMap<&str, usize>,
    ) -> Result<Vec<Joint>, PopulationProblem> {
        let mut joints = Vec::new();
        let mut in_joint: BTreeMap<usize, usize> = BTreeMap::new();
        for (j, spanned) in self.joint.iter().enumerate() {
            let joint = spanned.get_ref();
            let at = spanned.span();
            let field = format!("population.joint[{j}]");
            if joint.attributes.len() < 2 {
                return Err(PopulationProblem::new(
                    Some(at),
                    format!("{field}.attributes"),
                    "a joint table needs at least two attributes",
                ));
            }
            let mut members = Vec::new();
            for name in &joint.attributes {
                let Some(&i) = index.get(name.as_str()) else {
                    return Err(PopulationProblem::new(
                        Some(at),
                        format!("{field}.attributes"),
                        format!(
                            "unknown attribute `{name}` (declared: {}); declare it under [population.attributes.{name}] with its categories",
                            known(attributes)
                        ),
                    ));
                };
                if !matches!(attributes[i], Attribute::Categorical { .. }) {
                    return Err(PopulationProblem::new(
                        Some(at),
                        format!("{field}.attributes"),
                        format!("`{name}` is numeric: joint tables hold categorical attributes"),
                    ));
                }
                if let Some(other) = in_joint.insert(i, j) {
                    return Err(PopulationProblem::new(
                        Some(at),
                        format!("{field}.attributes"),
                        format!("`{name}` is already in joint table {other}"),
                    ));
                }
                members.push(i);
            }
            if joint.rows.is_empty() {
                return Err(PopulationProblem::new(
                    Some(at),
                    format!("{field}.rows"),
                    "has no rows: give each combination with its share",
                ));
            }
            if joint.rows.len() > MAX_CATEGORIES {
                return Err(PopulationProblem::new(
                    Some(at),
                    format!("{field}.rows"),
                    format!(
                        "has {} rows, more than the {MAX_CATEGORIES} a joint table can hold",
                        joint.rows.len()
                    ),
                ));
            }
            let mut rows = Vec::new();
            let mut shares = Vec::new();
            for (r, row) in joint.rows.iter().enumerate() {
                let rfield = format!("{field}.rows[{r}]");
                let bad = |m: String| PopulationProblem::new(Some(at.clone()), rfield.clone(), m);
                for key in row.keys() {
                    if key != "share" && !joint.attributes.contains(key) {
                        return Err(bad(format!(
                            "unknown attribute `{key}` (this table joins {})",
                            joint.attributes.join(", ")
                        )));
                    }
                }
                let share = row
                    .get("share")
                    .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
                    .ok_or_else(|| bad("needs a numeric `share`".into()))?;
                if !(share.is_finite() && share > 0.0) {
                    return Err(bad(format!(
                        "share {share}: every row needs a share above 0"
                    )));
                }
                let mut codes = Vec::new();
                for &i in &members {
                    let Attribute::Categorical {
                        name, categories, ..
                    } = &attributes[i]
                    else {
                        unreachable!("checked above");
                    };
                    let value = row
                        .get(name)
                        .and_then(|v| v.as_str())
                        .ok_or_else(|| bad(format!("needs a value for `{name}`")))?;
                    let code = categories.iter().position(|c| c == value).ok_or_else(|| {
                        bad(format!(
                            "`{value}` is not a category of `{name}` (known: {})",
                            categories.join(", ")
                        ))
                    })?;
                    codes.push(code as u16);
                }
                if rows.iter().any(|(c, _): &(Vec<u16>, f64)| *c == codes) {
                    return Err(bad("repeats an earlier row's combination".into()));
                }
                rows.push((codes, 0.0));
                shares.push(share);
            }
            let fractions = normalise(shares.iter().copied(), &format!("{field}.rows"), &at)?;
            for (row, f) in rows.iter_mut().zip(fractions) {
                row.1 = f;
            }
            joints.push(Joint {
                attributes: members,
                rows,
            });
        }
        Ok(joints)
    }

    /// The LLM-written personas' sampling, checked.
    fn check_personas(&self) -> Result<(), PopulationProblem> {
        if let Some(personas) = &self.personas {
            let p = personas.get_ref();
            let at = Some(personas.span());
            let top = super::limits::MAX_TEMPERATURE;
            if !(p.temperature.is_finite() && (0.0..=top).contains(&p.temperature)) {
                return Err(PopulationProblem::new(
                    at,
                    "population.personas.temperature",
                    format!("must be a number from 0 to {top}, got {}", p.temperature),
                ));
            }
            if p.max_tokens == 0 {
                return Err(PopulationProblem::new(
                    at,
                    "population.personas.max_tokens",
                    "must be at least 1: a persona needs words",
                ));
            }
        }
        Ok(())
    }
}

/// One attribute of `[population.attributes]`, checked and resolved.
fn attribute(
    name: &str,
    spanned: &toml::Spanned<AttributeConfig>,
) -> Result<Attribute, PopulationProblem> {
    let a = spanned.get_ref();
    let at = spanned.span();
    let field = format!("population.attributes.{name}");
    let attribute = match (&a.shares, a.range) {
        (Some(_), Some(_)) => {
            return Err(PopulationProblem::new(
                Some(at),
                field,
                "has both `shares` (categorical) and `range` (numeric): keep one",
            ));
        }
        (None, None) => {
            return Err(PopulationProblem::new(
                Some(at),
                field,
                "needs `shares` (a categorical attribute) or `range` (a numeric one)",
            ));
        }
        (Some(shares), None) => Attribute::Categorical {
            name: name.to_string(),
            categories: shares.keys().cloned().collect::<Vec<_>>().into(),
            shares: fractions(shares, &at, &format!("{field}.shares"))?,
        },
        (None, Some([low, high])) => {
            check_range(a.integer, [low, high], at.clone(), &field)?;
            if let NumericDistribution::Normal { mean, sd } = a.distribution {
                if !(mean.is_finite() && sd.is_finite() && sd > 0.0) {
                    return Err(PopulationProblem::new(
                        Some(at),
                        format!("{field}.distribution"),
                        format!("normal needs a finite mean and sd > 0, got mean {mean}, sd {sd}"),
                    ));
                }
                let normal = Normal::new(mean, sd).expect("invariant: checked just above");
                if normal.cdf(high) - normal.cdf(low) <= f64::EPSILON {
                    return Err(PopulationProblem::new(
                        Some(at),
                        format!("{field}.distribution"),
                        format!(
                            "normal with mean {mean} and sd {sd} puts no weight in [{low}, {high}]: every agent would sit at a bound; move the mean into the range or widen sd"
                        ),
                    ));
                }
            }
            if let Some(bands) = &a.bands
                && (bands.len() < 2
                    || bands.iter().any(|b| !b.is_finite())
                    || bands
                        .windows(2)
                        .any(|w| w[0].partial_cmp(&w[1]) != Some(std::cmp::Ordering::Less)))
            {
                return Err(PopulationProblem::new(
                    Some(at),
                    format!("{field}.bands"),
                    "band edges must be at least two finite numbers in increasing order",
                ));
            }
            Attribute::Numeric {
                name: name.to_string(),
                low,
                high,
                distribution: a.distribution,
                integer: a.integer,
                bands: a.bands.clone(),
            }
        }
    };
    Ok(attribute)
}

/// A numeric attribute's `[low, high]`: a range, within what an attribute holds, and with
/// whole numbers in it, kept exactly, when `integer` draws them.
fn check_range(
    integer: bool,
    [low, high]: [f64; 2],
    at: Range<usize>,
    field: &str,
) -> Result<(), PopulationProblem> {
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(PopulationProblem::new(
            Some(at),
            format!("{field}.range"),
            format!("[{low}, {high}] is not a range: give [low, high] with low <= high"),
        ));
    }
    if low.abs().max(high.abs()) > MAX_NUMERIC {
        return Err(PopulationProblem::new(
            Some(at),
            format!("{field}.range"),
            format!(
                "[{low}, {high}] reaches beyond +/-10^12, the most an attribute holds (values are kept as 32-bit floats)"
            ),
        ));
    }
    if integer && low.ceil() > high.floor() {
        return Err(PopulationProblem::new(
            Some(at),
            format!("{field}.range"),
            format!(
                "[{low}, {high}] holds no whole number, but `integer = true` draws whole numbers: widen the range to take one in (e.g. [{}, {}]) or drop `integer`",
                low.floor(),
                low.floor() + 1.0
            ),
        ));
    }
    if integer && low.abs().max(high.abs()) > MAX_WHOLE {
        return Err(PopulationProblem::new(
            Some(at),
            format!("{field}.range"),
            format!(
                "[{low}, {high}] reaches beyond +/-{MAX_WHOLE}: whole numbers are kept exactly (as 32-bit floats) only up to there; drop `integer` for larger values"
            ),
        ));
    }
    Ok(())
}

fn known(attributes: &[Attribute]) -> String {
    if attributes.is_empty() {
        return "none".into();
    }
    attributes
        .iter()
        .map(Attribute::name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The agents of one cell: attribute columns, and personas when written by the LLM.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Population {
    /// Its number of agents.
    pub size: usize,
    /// `(name, column)` in the spec's order.
    pub columns: Vec<(String, Column)>,
    /// One persona per agent, when the config asks for LLM-written personas.
    pub personas: Option<Vec<Box<str>>>,
    /// The agents' nested groups (no levels when the config has none).
    pub groups: Groups,
}

impl Population {
    /// `size` agents without attributes.
    pub fn plain(size: usize) -> Self {
        Self {
            size,
            ..Self::default()
        }
    }

    /// The column of attribute `name`, if the population has it.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// Agent `agent`'s value of every attribute, as text (`("age", "34")`).
    pub fn profile(&self, agent: usize) -> impl Iterator<Item = (&str, ProfileValue<'_>)> {
        self.columns.iter().map(move |(name, column)| {
            let value = match column {
                Column::Categorical { categories, codes } => {
                    ProfileValue::Category(&categories[codes[agent] as usize])
                }
                Column::Numeric { values, .. } => ProfileValue::Number(values[agent]),
            };
            (name.as_str(), value)
        })
    }
}

/// One attribute value of one agent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ProfileValue<'a> {
    /// A category of a categorical attribute.
    Category(&'a str),
    /// A numeric attribute's value.
    Number(f32),
}

impl std::fmt::Display for ProfileValue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileValue::Category(c) => f.write_str(c),
            ProfileValue::Number(x) if x.fract() == 0.0 => write!(f, "{}", *x as i64),
            ProfileValue::Number(x) => write!(f, "{x}"),
        }
    }
}
