//! Which policy each agent uses: the experiment's, or a `[[policy_groups]]`'s for the agents
//! its conditions on the population's attributes pick.

use crate::sim::config::{
    ConfigError, LlmOverrides, PolicyGroupConfig, PolicyKind, Source, find_field,
};
use crate::sim::population::{Attribute, PopulationSpec};

/// Agents that use another policy than the experiment's.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyGroup {
    pub policy: PolicyKind,
    /// Share of the matching agents, drawn by seed.
    pub share: f64,
    /// `(attribute index, test)` conditions, all of which must hold.
    pub filter: Vec<(usize, Condition)>,
    /// The group's own model and sampling, over its arm's (an `llm` group only).
    pub llm: LlmOverrides,
    /// Where it is defined: under `[[policy_groups]]`, or under its arm's.
    pub span: std::ops::Range<usize>,
}

/// A condition on one attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// The category is one of these (indices).
    OneOf(Vec<u16>),
    /// The value is within `[low, high]`.
    Within(f64, f64),
}

/// Which policy each agent uses.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyPlan {
    pub default: PolicyKind,
    pub groups: Vec<PolicyGroup>,
}

impl PolicyPlan {
    /// Every policy some agent may use, default first.
    pub(crate) fn kinds(&self) -> Vec<PolicyKind> {
        let mut kinds = vec![self.default];
        for g in &self.groups {
            if !kinds.contains(&g.policy) {
                kinds.push(g.policy);
            }
        }
        kinds
    }

    pub fn uses(&self, kind: PolicyKind) -> bool {
        self.kinds().contains(&kind)
    }
}

/// The policies of an arm: the experiment's `base`, with the arm's own `policy` and
/// `[[arms.policy_groups]]` in place of the experiment's where it sets them.
pub(super) fn arm_plan(
    source: &Source,
    arm: &crate::sim::config::ArmConfig,
    base: &PolicyPlan,
    population: &PopulationSpec,
) -> Result<PolicyPlan, ConfigError> {
    let groups = match &arm.policy_groups {
        None => base.groups.clone(),
        Some(groups) => groups
            .iter()
            .enumerate()
            .map(|(i, g)| policy_group(source, i, g, population))
            .collect::<Result<_, _>>()?,
    };
    Ok(PolicyPlan {
        default: arm.policy.unwrap_or(base.default),
        groups,
    })
}

/// The most `[[policy_groups]]` a run may have: each agent's group is kept in a byte.
pub const MAX_POLICY_GROUPS: usize = 255;

pub(super) fn policy_group(
    source: &Source,
    index: usize,
    group: &toml::Spanned<PolicyGroupConfig>,
    population: &PopulationSpec,
) -> Result<PolicyGroup, ConfigError> {
    let g = group.get_ref();
    let at = |m: String| source.error(Some(group.span()), format!("policy_groups[{index}]: {m}"));
    if index >= MAX_POLICY_GROUPS {
        return Err(at(format!(
            "a run may have at most {MAX_POLICY_GROUPS} policy groups"
        )));
    }
    if g.policy != PolicyKind::Llm && !g.llm.is_empty() {
        let span =
            find_field(&source.text, group.span(), "llm", "policy_groups").unwrap_or(group.span());
        return Err(source.error(
            Some(span),
            format!(
                "policy_groups[{index}]: field `llm`: a `{}` group asks no model: remove its llm \
                 settings, or make it policy = \"llm\"",
                g.policy.name()
            ),
        ));
    }
    if !(g.share > 0.0 && g.share <= 1.0) {
        return Err(at(format!(
            "share {} must be in (0, 1]: the share of matching agents that use `{}`",
            g.share,
            g.policy.name()
        )));
    }
    let mut filter = Vec::new();
    for (name, value) in &g.filter {
        let Some(i) = population.attributes.iter().position(|a| a.name() == name) else {
            let known: Vec<&str> = population.attributes.iter().map(Attribute::name).collect();
            return Err(at(format!(
                "where: unknown attribute `{name}` (the population has: {})",
                if known.is_empty() {
                    "none; describe it under [population.attributes]".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        let condition = condition(&at, name, &population.attributes[i], value)?;
        filter.push((i, condition));
    }
    Ok(PolicyGroup {
        policy: g.policy,
        share: g.share,
        filter,
        llm: g.llm.clone(),
        span: group.span(),
    })
}

/// The test `where.{name} = value` asks of `attribute`: categories by name, or a numeric
/// `[low, high]`; `at` places a problem at the group.
fn condition(
    at: &dyn Fn(String) -> ConfigError,
    name: &str,
    attribute: &Attribute,
    value: &toml::Value,
) -> Result<Condition, ConfigError> {
    let condition = match attribute {
        Attribute::Categorical { categories, .. } => {
            let wanted: Vec<&str> = match value {
                toml::Value::String(s) => vec![s.as_str()],
                toml::Value::Array(a) => a.iter().filter_map(|v| v.as_str()).collect(),
                _ => vec![],
            };
            if wanted.is_empty() {
                return Err(at(format!(
                    "where.{name}: give a category or a list of them"
                )));
            }
            let codes = wanted
                .iter()
                .map(|w| {
                    categories
                        .iter()
                        .position(|c| c == w)
                        .map(|c| c as u16)
                        .ok_or_else(|| {
                            at(format!(
                                "where.{name}: `{w}` is not a category (known: {})",
                                categories.join(", ")
                            ))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Condition::OneOf(codes)
        }
        Attribute::Numeric { .. } => {
            let bounds: Vec<f64> = value
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
                        .collect()
                })
                .unwrap_or_default();
            match bounds.as_slice() {
                [lo, hi] if lo <= hi => Condition::Within(*lo, *hi),
                _ => {
                    return Err(at(format!(
                        "where.{name}: a numeric attribute takes [low, high]"
                    )));
                }
            }
        }
    };
    Ok(condition)
}
