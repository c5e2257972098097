//! The guessing game's knobs, as in the study's variants: the target rule, how agents are
//! prompted, and what they are told.

use super::rules::{Fraction, TargetRule};
use crate::sim::config::ScenarioProblem;
use serde::{Deserialize, Serialize};

/// How an agent is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptStyle {
    /// The number alone.
    Basic,
    /// A bounded `reasoning` string, generated before the number (chain of thought).
    Cot,
}

/// The target rule's bounds: `ratio` within 0 to 10, `offset` within -100 to 100, each an
/// exact fraction whose denominator is at most a million (every target then stays exact in
/// 128-bit integers for any population).
pub(crate) const MAX_RATIO: i64 = 10;
pub(crate) const MAX_OFFSET: i64 = 100;
pub(crate) const MAX_DENOMINATOR: i64 = 1_000_000;

/// The most characters of reasoning a config may ask for: far more than any model's reply
/// holds (a million characters are some 250,000 tokens), and within what the decoder's
/// schema can bound (above 2^32 it cannot, and every decision would fall back).
pub(crate) const MAX_REASONING_CHARS: usize = 1_000_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuessConfig {
    /// `target = ratio * mean + offset`: a fraction ("2/3") or a decimal (0.51).
    pub ratio: Fraction,
    pub offset: Fraction,
    pub prompt: PromptStyle,
    /// Most characters of reasoning under `prompt = "cot"`.
    pub reasoning_chars: usize,
    /// Tell agents the game is a variant of "guess 2/3 of the average" (the study found this
    /// restored performance on 51/100).
    pub hint: bool,
    /// Decimal places a guess may have (0, 1 or 2).
    pub decimals: u32,
    /// Describe each agent to itself: its population attributes, or its LLM-written persona.
    pub show_profile: bool,
    /// Past rounds shown to agents (results and their own guesses); all when absent.
    pub memory: Option<usize>,
    /// A group level (`[[population.groups]]`) whose groups each play a game of their own:
    /// the target is computed from the group's guesses, and a player wins within its group.
    /// The whole cell plays one game when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Default for GuessConfig {
    fn default() -> Self {
        Self {
            ratio: Fraction { num: 2, den: 3 },
            offset: Fraction { num: 0, den: 1 },
            prompt: PromptStyle::Basic,
            reasoning_chars: 400,
            hint: false,
            decimals: 2,
            show_profile: true,
            memory: None,
            group: None,
        }
    }
}

impl GuessConfig {
    pub fn from_table(table: &toml::Table) -> Result<Self, ScenarioProblem> {
        let cfg: GuessConfig = ScenarioProblem::parse(table)?;
        if cfg.decimals > 2 {
            return Err(ScenarioProblem::new(
                "decimals",
                format!("{} decimal places: guesses keep at most 2", cfg.decimals),
            ));
        }
        if cfg.ratio.num < 0 {
            return Err(ScenarioProblem::new(
                "ratio",
                format!(
                    "{} is negative: the target is ratio x mean + offset with ratio >= 0",
                    cfg.ratio
                ),
            ));
        }
        for (field, value, (low, high)) in [
            ("ratio", cfg.ratio, (0, MAX_RATIO)),
            ("offset", cfg.offset, (-MAX_OFFSET, MAX_OFFSET)),
        ] {
            if value.den > MAX_DENOMINATOR {
                return Err(ScenarioProblem::new(
                    field,
                    format!(
                        "{value} has a denominator above {MAX_DENOMINATOR}: give a fraction such as \"2/3\" or a decimal of at most 6 places"
                    ),
                ));
            }
            if value.num < low * value.den || value.num > high * value.den {
                return Err(ScenarioProblem::new(
                    field,
                    format!(
                        "{value} is outside {low} to {high}: give a {field} within them (guesses lie in [0, 100]; the study's rules have ratios up to 1 and offsets up to 5)"
                    ),
                ));
            }
        }
        if cfg.reasoning_chars > MAX_REASONING_CHARS {
            return Err(ScenarioProblem::new(
                "reasoning_chars",
                format!(
                    "{} characters is more than a reply can hold (the schema's bound would refuse \
                     every decision): give at most {MAX_REASONING_CHARS}",
                    cfg.reasoning_chars
                ),
            ));
        }
        if cfg.prompt == PromptStyle::Cot && cfg.reasoning_chars < 20 {
            return Err(ScenarioProblem::new(
                "reasoning_chars",
                format!(
                    "{} characters leave no room to reason: give at least 20 (the study's chain of thought ran to hundreds)",
                    cfg.reasoning_chars
                ),
            ));
        }
        Ok(cfg)
    }

    pub fn rule(&self) -> TargetRule {
        TargetRule {
            ratio: self.ratio,
            offset: self.offset,
        }
    }

    /// The rule in words: `2/3 of the average`, `5 plus 1/2 of the average`.
    pub(crate) fn rule_text(&self) -> String {
        let ratio = if self.ratio == (Fraction { num: 1, den: 1 }) {
            "the average".to_string()
        } else {
            format!("{} of the average", self.ratio)
        };
        match self.offset.num {
            0 => ratio,
            n if n > 0 => format!("{} plus {ratio}", self.offset),
            _ => format!(
                "{ratio} minus {}",
                Fraction {
                    num: -self.offset.num,
                    den: self.offset.den
                }
            ),
        }
    }
}
