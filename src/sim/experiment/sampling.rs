//! Sampling settings out of their range, found where the config sets them.

use super::arms::Arm;
use crate::sim::config::{
    ConfigError, ExperimentConfig, LlmConfig, MAX_TEMPERATURE, Source, find_field,
};
use std::ops::Range;

pub(super) fn check_sampling(
    source: &Source,
    config: &ExperimentConfig,
    arm: &Arm,
) -> Result<(), ConfigError> {
    match sampling_problem(&arm.llm) {
        None => Ok(()),
        Some((key, p)) => Err(source.error(
            Some(sampling_span(source, config, arm, key)),
            format!("arm `{}`: llm: {p}", arm.name),
        )),
    }
}

/// The setting of `l` out of its range, and why, if one is.
pub(super) fn sampling_problem(l: &LlmConfig) -> Option<(&'static str, String)> {
    if l.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Some((
            "model",
            "model is empty: name a preset, a model folder, a GGUF file or a Hub repo id".into(),
        ));
    }
    if !(l.temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&l.temperature)) {
        Some((
            "temperature",
            format!(
                "temperature {} must be from 0 to {MAX_TEMPERATURE}",
                l.temperature
            ),
        ))
    } else if !(l.top_p > 0.0 && l.top_p <= 1.0) {
        Some(("top_p", format!("top_p {} must be in (0, 1]", l.top_p)))
    } else if l.max_tokens == 0 {
        Some(("max_tokens", "max_tokens must be at least 1".into()))
    } else if l.top_k == Some(0) {
        Some(("top_k", "top_k must be at least 1 (or absent)".into()))
    } else if l.wave == 0 {
        Some(("wave", "wave must be at least 1".into()))
    } else {
        None
    }
}

/// Where sampling setting `key` of `arm` is set: a `[sweep]` of it, the arm's own `llm`
/// table, or the `[llm]` section; the arm itself when none says.
fn sampling_span(source: &Source, config: &ExperimentConfig, arm: &Arm, key: &str) -> Range<usize> {
    let text = &source.text;
    if let Some(sweep) = config
        .sweep
        .as_ref()
        .filter(|s| s.get_ref().llm.contains_key(key))
    {
        return find_field(text, sweep.span(), key, "sweep").unwrap_or(sweep.span());
    }
    let in_arm = config.arms.iter().any(|a| a.span() == arm.span);
    if in_arm && let Some(at) = find_field(text, arm.span.clone(), key, "arms.") {
        return at;
    }
    let section = text
        .match_indices("[llm]")
        .map(|(i, _)| i)
        .find(|&i| i == 0 || text[..i].ends_with('\n'));
    section
        .and_then(|start| find_field(text, start..text.len(), key, "llm"))
        .unwrap_or(arm.span.clone())
}
