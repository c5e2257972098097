//! The arms of an experiment: the base, each `[[arms]]` over it, and every combination of a
//! `[sweep]` crossed with them.

use super::policies::PolicyPlan;
use crate::sim::config::{
    ArmConfig, ConfigError, ExperimentConfig, LlmConfig, LlmOverrides, MAX_ARMS, Source,
    SweepConfig, find_field,
};
use crate::sim::population::PopulationSpec;
use std::ops::Range;

/// One arm: a name, its scenario table (the base with the arm's changes), its sampling and
/// its policies.
#[derive(Debug, Clone)]
pub struct Arm {
    pub name: String,
    /// Its scenario table from the start: the base's alone for an arm whose changes hold from a
    /// later step.
    pub table: toml::Table,
    /// Its changes that hold from a later step (`from_step`), if they do.
    pub change: Option<Change>,
    pub llm: LlmConfig,
    /// Which policy each of its agents uses: the experiment's, or the arm's own.
    pub policies: PolicyPlan,
    /// Where it is defined (the `[scenario]` section for the base arm).
    pub span: Range<usize>,
}

/// An arm's scenario from a step on: the steps before it are run as the base's.
#[derive(Debug, Clone)]
pub struct Change {
    /// The first step (counted from 1, as records count them) that the table rules.
    pub from_step: usize,
    pub table: toml::Table,
}

/// The arms of `config` over the scenario table `base`: each `[[arms]]` (or the base alone,
/// without them), crossed with the `[sweep]` if there is one, each named once.
pub(super) fn resolve(
    source: &Source,
    config: &ExperimentConfig,
    base: &toml::Table,
    plan: &PolicyPlan,
    population: &PopulationSpec,
) -> Result<Vec<Arm>, ConfigError> {
    let section = config.scenario.span();
    let mut arms: Vec<Arm> = config
        .arms
        .iter()
        .map(|arm| {
            let mut table = base.clone();
            for (key, value) in &arm.get_ref().scenario {
                table.insert(key.clone(), value.clone());
            }
            let change = match arm.get_ref().from_step {
                None => None,
                Some(from) => Some(Change {
                    from_step: from_step(source, config, arm, from)?,
                    table: std::mem::replace(&mut table, base.clone()),
                }),
            };
            Ok(Arm {
                name: arm.get_ref().name.clone(),
                table,
                change,
                llm: arm.get_ref().llm.apply(&config.llm),
                policies: super::policies::arm_plan(source, arm.get_ref(), plan, population)?,
                span: arm.span(),
            })
        })
        .collect::<Result<_, ConfigError>>()?;
    if arms.is_empty() {
        arms.push(Arm {
            name: "base".into(),
            table: base.clone(),
            change: None,
            llm: config.llm.clone(),
            policies: plan.clone(),
            span: section.clone(),
        });
    }
    if arms.len() > MAX_ARMS {
        return Err(source.error(
            Some(arms[MAX_ARMS].span.clone()),
            format!(
                "{} [[arms]] are more than the {MAX_ARMS} a run may have",
                arms.len()
            ),
        ));
    }
    if let Some(sweep) = &config.sweep {
        arms = sweep_arms(source, arms, sweep, config.arms.is_empty())?;
    }
    for (i, arm) in arms.iter().enumerate() {
        if let Some(first) = arms[..i].iter().find(|a| a.name == arm.name) {
            let name_of = |a: &Arm| {
                find_field(&source.text, a.span.clone(), "name", "arms.").unwrap_or(a.span.clone())
            };
            return Err(source.error(
                Some(name_of(arm)),
                format!(
                    "field `arms.name`: two arms are named `{}` (the first at line {}): give each arm a name of its own",
                    arm.name,
                    source.line(name_of(first).start)
                ),
            ));
        }
    }
    Ok(arms)
}

/// The text of a sweep value in an arm's name: `2/3`, `0.5`, `cot`.
fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every arm crossed with every combination of the sweep's values.
fn sweep_arms(
    source: &Source,
    arms: Vec<Arm>,
    sweep: &toml::Spanned<SweepConfig>,
    only_base: bool,
) -> Result<Vec<Arm>, ConfigError> {
    let axes = sweep_axes(source, sweep)?;
    check_count(source, sweep, arms.len(), &axes)?;
    let mut out = Vec::new();
    for arm in arms {
        let mut combos: Vec<Vec<usize>> = vec![vec![]];
        for (_, _, values) in &axes {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    (0..values.len()).map(move |i| {
                        let mut c = c.clone();
                        c.push(i);
                        c
                    })
                })
                .collect();
        }
        for combo in combos {
            let mut table = arm.table.clone();
            let mut change = arm.change.clone();
            let mut llm = toml::Table::new();
            let mut parts = Vec::new();
            for ((is_llm, key, values), &i) in axes.iter().zip(&combo) {
                let value = values[i].clone();
                parts.push(format!("{key}={}", value_text(&value)));
                if *is_llm {
                    llm.insert((*key).clone(), value);
                } else {
                    if let Some(change) = &mut change {
                        change.table.insert((*key).clone(), value.clone());
                    }
                    table.insert((*key).clone(), value);
                }
            }
            let overrides: LlmOverrides =
                toml::Value::Table(llm)
                    .try_into()
                    .map_err(|e: toml::de::Error| {
                        source.error(Some(sweep.span()), format!("field `sweep.llm`: {e}"))
                    })?;
            let name = if only_base {
                parts.join(", ")
            } else {
                format!("{}, {}", arm.name, parts.join(", "))
            };
            out.push(Arm {
                name,
                table,
                change,
                llm: overrides.apply(&arm.llm),
                policies: arm.policies.clone(),
                span: arm.span.clone(),
            });
        }
    }
    Ok(out)
}

/// One swept setting: whether it is an `llm` one (else a scenario knob), its key, and its
/// values.
type Axis<'a> = (bool, &'a String, &'a Vec<toml::Value>);

/// The sweep's settings, scenario knobs first, each checked: a sampling setting, with
/// values, none listed twice.
fn sweep_axes<'a>(
    source: &Source,
    sweep: &'a toml::Spanned<SweepConfig>,
) -> Result<Vec<Axis<'a>>, ConfigError> {
    let s = sweep.get_ref();
    let mut axes: Vec<Axis> = Vec::new();
    for (key, values) in &s.scenario {
        axes.push((false, key, values));
    }
    for (key, values) in &s.llm {
        if !["model", "temperature", "top_p", "top_k", "max_tokens"].contains(&key.as_str()) {
            return Err(source.error(
                find_field(&source.text, sweep.span(), key, "sweep"),
                format!(
                    "field `sweep.llm.{key}`: not a model or sampling setting (sweepable: model, temperature, top_p, top_k, max_tokens)"
                ),
            ));
        }
        axes.push((true, key, values));
    }
    if let Some((_, key, _)) = axes.iter().find(|(_, _, v)| v.is_empty()) {
        return Err(source.error(
            find_field(&source.text, sweep.span(), key, "sweep"),
            format!("field `sweep.{key}`: give at least one value"),
        ));
    }
    for (is_llm, key, values) in &axes {
        let texts: Vec<String> = values.iter().map(value_text).collect();
        // `250` and `250.0` (or `"250"`) make the same arm under two names.
        let same = |a: usize, b: usize| {
            texts[a] == texts[b]
                || match (&values[a], &values[b]) {
                    (toml::Value::Integer(i), toml::Value::Float(f))
                    | (toml::Value::Float(f), toml::Value::Integer(i)) => *i as f64 == *f,
                    _ => false,
                }
        };
        if let Some(twice) = (0..values.len())
            .find(|&i| (0..i).any(|j| same(i, j)))
            .map(|i| &texts[i])
        {
            return Err(source.error(
                find_field(&source.text, sweep.span(), key, "sweep").or(Some(sweep.span())),
                format!(
                    "field `sweep.{}.{key}`: `{twice}` is listed twice: each value makes an arm, so give each once",
                    if *is_llm { "llm" } else { "scenario" }
                ),
            ));
        }
    }
    Ok(axes)
}

/// Checks that `arms` arms crossed with the sweep's `axes` are no more than a run may have.
fn check_count(
    source: &Source,
    sweep: &toml::Spanned<SweepConfig>,
    arms: usize,
    axes: &[Axis],
) -> Result<(), ConfigError> {
    // Counted before any is made: a sweep of many long lists is a product, not a sum.
    let count = axes
        .iter()
        .try_fold(arms, |n, (_, _, values)| n.checked_mul(values.len()));
    if count.is_none_or(|n| n > MAX_ARMS) {
        let product: Vec<String> = std::iter::once(arms)
            .chain(axes.iter().map(|(_, _, v)| v.len()))
            .map(|n| n.to_string())
            .collect();
        return Err(source.error(
            Some(sweep.span()),
            format!(
                "field `sweep`: its values make {} arms ({}), more than the {MAX_ARMS} a run may have",
                count.map_or("too many".to_string(), |n| n.to_string()),
                product.join(" x ")
            ),
        ));
    }
    Ok(())
}

/// An arm's `from_step`, checked: a step of the run after the first (whose changes hold from
/// the start, as an arm without one), of an arm whose changes are scenario knobs.
fn from_step(
    source: &Source,
    config: &ExperimentConfig,
    arm: &toml::Spanned<ArmConfig>,
    from: i64,
) -> Result<usize, ConfigError> {
    let a = arm.get_ref();
    let at =
        |field: &str| find_field(&source.text, arm.span(), field, "arms.").or(Some(arm.span()));
    let steps = config.steps.0;
    let problem = if from < 1 {
        format!("{from} is not a step: steps count from 1")
    } else if from == 1 {
        "1 is the first step: leave `from_step` out for changes that hold from the start".into()
    } else if from as u64 > steps as u64 {
        format!(
            "{from} is after the run's last step ({steps}), so the arm would change nothing: give a step from 2 to {steps}"
        )
    } else if !a.llm.is_empty() {
        return Err(source.error(
            at("llm"),
            format!(
                "arm `{}`: `from_step` delays the arm's `scenario` changes, and its `llm` changes would hold from the start: make them an arm of their own",
                a.name
            ),
        ));
    } else if a.scenario.is_empty() {
        format!(
            "arm `{}` changes no scenario knob, so there is nothing to change from step {from}: add `scenario = {{ ... }}`",
            a.name
        )
    } else {
        return Ok(from as usize);
    };
    Err(source.error(
        at("from_step"),
        format!("field `arms.from_step`: {problem}"),
    ))
}
