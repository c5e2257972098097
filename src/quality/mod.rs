//! The quality gate of weight formats: what converting a model's weights costs in accuracy,
//! measured against the same model in f32.
//!
//! `WeightFormat::Auto` picks a format for speed (int8 on CPUs with AVX-512 VNNI, bf16 on a GPU and for
//! large models on CPUs without an int8 kernel). A format may only be among its choices while
//! it passes this gate, on three measurements against f32:
//!
//! - **perplexity** of a fixed text shipped with throng ([`TEXT`]), as a ratio to f32's;
//! - **next-token distributions**: mean Kullback-Leibler divergence from f32's and top-1
//!   agreement, over that text and over a set of agent prompts;
//! - **decisions**: constrained replies at temperature 0 to a workload of agent requests
//!   ([`workload`]): the format may not lose significantly more valid decisions than it
//!   gains against f32's replies to the same requests (an exact one-sided McNemar test: a
//!   small model's greedy replies flip both ways under any change of rounding, and only a
//!   one-sided excess, like int8's 7 of 64 looping replies where f32 had none, is a loss).
//!
//! The bounds ([`Bounds::EIGHT_BIT`]) come from llama.cpp's published measurements of its
//! own formats on Llama 3 8B (see docs/src/models.md, "Weight formats"). `throng eval` runs
//! the gate on any model; `tests/quality.rs` runs it on the default model.

pub mod divergence;
pub mod workload;

pub use divergence::{Divergence, Scored};

use crate::engine::{
    Engine, EngineConfig, EngineError, FinishReason, Request, RequestError, Response,
};
use crate::model::{KvFormat, LoadOptions, ModelError, WeightFormat, loader};
use candle_core::Device;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// The fixed text whose perplexity the gate measures: about 2,000 tokens of plain English
/// prose, dialogue, figures and JSON, written for throng.
pub(crate) const TEXT: &str = include_str!("text.txt");

/// Tokens per window of the text: each window is read from its start, and its first
/// [`WINDOW_CONTEXT`] positions only give context.
const WINDOW: usize = 256;
const WINDOW_CONTEXT: usize = 32;

/// The KV cache of each engine the gate runs (two at once: f32 and a candidate).
const KV_MEMORY: usize = 2 << 30;

#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Settings(String),
    #[error("the gate's prompt {index} cannot be tokenized: {reason}")]
    Prompt { index: usize, reason: String },
}

/// The limits a format must stay within.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bounds {
    /// Highest perplexity of the text as a ratio to f32's.
    pub max_perplexity_ratio: f64,
    /// Highest mean KL divergence from f32, on the text and on the prompts alike.
    pub max_mean_kl: f64,
    /// Lowest share of positions where the format and f32 agree on the most likely token.
    pub min_top1_agreement: f64,
    /// The format fails when the chance of losing at least as many valid decisions as it
    /// did, were losses and gains equally likely, is below this ([`Decisions::p_worse`]).
    pub min_decisions_p: f64,
}

impl Bounds {
    /// What an 8-bit format must meet: no worse than llama.cpp's 6-bit `q6_K` measures on
    /// Llama 3 8B against f16 (perplexity +0.35%, mean KL 0.0055, top-1 agreement 96.0%;
    /// its `q8_0` measures +0.04%, 0.0014 and 97.7%), and no significant loss of valid
    /// decisions (p < 0.01: the excess of the issue that made this gate, 7 of 64 lost and
    /// none gained, has p = 0.008, while a format that is as good as f32 fails one run in a
    /// hundred at most, on any machine whose rounding flips other replies).
    pub(crate) const EIGHT_BIT: Bounds = Bounds {
        max_perplexity_ratio: 1.0035,
        max_mean_kl: 0.0055,
        min_top1_agreement: 0.96,
        min_decisions_p: 0.01,
    };
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct EvalSpec {
    /// A preset, a model folder, a GGUF file or a Hugging Face repo id.
    pub model: String,
    pub device: Device,
    pub tokenizer: Option<PathBuf>,
    /// The formats compared with f32.
    pub formats: Vec<WeightFormat>,
    /// How the candidates' KV caches store keys and values (the reference's is f32): by
    /// default what `auto` picks, so that the gate judges `auto`'s whole choice.
    pub kv_format: KvFormat,
    /// Requests of the decision workload.
    pub decisions: usize,
    /// Agent prompts whose next-token distributions are compared (the first of the workload).
    pub prompts: usize,
    /// Seeds the workload.
    pub seed: u64,
    pub text: String,
    pub bounds: Bounds,
}

impl EvalSpec {
    /// The gate as `throng eval` runs it by default: every format `auto` can choose on
    /// `device`, 256 decisions, 24 prompts, the shipped text.
    pub fn new(model: impl Into<String>, device: Device) -> Self {
        Self {
            formats: auto_choices(&device),
            kv_format: KvFormat::Auto,
            model: model.into(),
            device,
            tokenizer: None,
            decisions: 256,
            prompts: 24,
            seed: 0,
            text: TEXT.to_string(),
            bounds: Bounds::EIGHT_BIT,
        }
    }
}

/// Every format `WeightFormat::Auto` can resolve to on `device` on this machine, f32 aside
/// (the reference): int8 on a CPU with a SIMD int8 kernel; on one without, bf16 (the choice
/// for models too large for f32); bf16 on a GPU. The portable int8 kernel gives the SIMD
/// kernels' bits (`model::int8`'s tests), so int8's quality is the same on every CPU, but it
/// is many times slower, which is why `auto` does not choose it there.
pub fn auto_choices(device: &Device) -> Vec<WeightFormat> {
    if device.is_cpu() && crate::model::quant::has_simd_kernel() {
        vec![WeightFormat::Gguf, WeightFormat::Int8]
    } else {
        vec![WeightFormat::Bf16]
    }
}

/// How a format's decisions came out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Decisions {
    pub requests: usize,
    /// Finished (end of the grammar) with a value.
    pub valid: usize,
    /// Cut off by `max_tokens` before the value was complete.
    pub cut_off: usize,
    /// Refused or failed by the engine.
    pub failed: usize,
    /// Equal to f32's value for the same request (for f32 itself: all of its valid ones).
    pub same_as_reference: usize,
    /// Requests f32 decided validly and this format did not.
    pub lost: usize,
    /// Requests this format decided validly and f32 did not.
    pub gained: usize,
    /// The exact one-sided McNemar p-value of the losses: the chance of at least `lost`
    /// losses among `lost + gained` flips, were a flip as likely either way. 1 for f32.
    pub p_worse: f64,
    pub seconds: f64,
}

impl Decisions {
    fn of(
        results: &[Result<Response, RequestError>],
        reference: Option<&[Option<serde_json::Value>]>,
    ) -> Self {
        let values = values(results);
        let flips = |keep: fn(bool, bool) -> bool| {
            reference.map_or(0, |want| {
                values
                    .iter()
                    .zip(want)
                    .filter(|(got, want)| keep(got.is_some(), want.is_some()))
                    .count()
            })
        };
        let (lost, gained) = (
            flips(|got, want| want && !got),
            flips(|got, want| got && !want),
        );
        Decisions {
            lost,
            gained,
            p_worse: p_at_least(lost, lost + gained),
            requests: results.len(),
            valid: values.iter().flatten().count(),
            cut_off: results
                .iter()
                .filter(|r| matches!(r, Ok(r) if r.finish_reason == FinishReason::Length))
                .count(),
            failed: results.iter().filter(|r| r.is_err()).count(),
            same_as_reference: match reference {
                None => values.iter().flatten().count(),
                Some(want) => values
                    .iter()
                    .zip(want)
                    .filter(|(a, b)| a.is_some() && a == b)
                    .count(),
            },
            seconds: 0.0,
        }
    }
}

/// `P(X >= k)` for `X ~ Binomial(n, 1/2)`; 1 when `k` is 0.
fn p_at_least(k: usize, n: usize) -> f64 {
    use statrs::distribution::{Binomial, DiscreteCDF};
    if k == 0 {
        return 1.0;
    }
    let binomial = Binomial::new(0.5, n as u64).expect("invariant: p = 0.5 is valid");
    binomial.sf(k as u64 - 1)
}

/// The valid value of each reply, if it has one.
fn values(results: &[Result<Response, RequestError>]) -> Vec<Option<serde_json::Value>> {
    results
        .iter()
        .map(|r| match r {
            Ok(r) if r.finish_reason == FinishReason::Stop => r.value.clone(),
            _ => None,
        })
        .collect()
}

/// One format against f32.
#[derive(Debug, Clone, Serialize)]
pub struct FormatReport {
    pub format: WeightFormat,
    /// What the weights were stored as and became.
    pub weights: String,
    pub text: Divergence,
    pub prompts: Divergence,
    pub decisions: Decisions,
    /// Every bound the format misses, in words; empty when it passes.
    pub failures: Vec<String>,
}

impl FormatReport {
    pub fn passes(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The gate's result for one model.
#[derive(Debug, Clone, Serialize)]
pub struct QualityReport {
    pub model: String,
    pub reference_weights: String,
    pub reference_decisions: Decisions,
    pub text_tokens: usize,
    pub bounds: Bounds,
    pub formats: Vec<FormatReport>,
    /// Every reply of the decision workload, f32's first (`throng eval --replies`).
    #[serde(skip)]
    pub replies: Vec<Reply>,
}

/// One reply of the decision workload.
#[derive(Debug, Clone, Serialize)]
pub struct Reply {
    pub format: String,
    /// The request's tag: role and agent.
    pub tag: String,
    /// `stop`, `length`, or the engine's error.
    pub finish: String,
    pub valid: bool,
    pub text: String,
}

fn replies(
    format: &str,
    requests: &[Request],
    results: &[Result<Response, RequestError>],
) -> Vec<Reply> {
    requests
        .iter()
        .zip(results)
        .map(|(request, result)| {
            let tag = request.tag.clone().unwrap_or_default();
            match result {
                Ok(r) => Reply {
                    format: format.to_string(),
                    tag,
                    finish: match r.finish_reason {
                        FinishReason::Stop => "stop".into(),
                        FinishReason::Length => "length".into(),
                    },
                    valid: r.finish_reason == FinishReason::Stop && r.value.is_some(),
                    text: r.text.clone(),
                },
                Err(e) => Reply {
                    format: format.to_string(),
                    tag,
                    finish: e.to_string(),
                    valid: false,
                    text: String::new(),
                },
            }
        })
        .collect()
}

impl QualityReport {
    pub fn passes(&self) -> bool {
        self.formats.iter().all(FormatReport::passes)
    }

    /// The report as a table, one row per format, f32 first.
    pub fn text(&self) -> String {
        let mut out = format!(
            "quality of weight formats against f32: {} ({}; {} tokens of text, {} decisions)\n\n",
            self.model, self.reference_weights, self.text_tokens, self.reference_decisions.requests
        );
        let row = |cells: [String; 9]| {
            let widths = [7, 8, 17, 9, 11, 11, 14, 9, 22];
            let mut line: String = cells
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$} "))
                .collect();
            line.truncate(line.trim_end().len());
            line + "\n"
        };
        out.push_str(&row([
            "format".into(),
            "ppl".into(),
            "ratio (2 se)".into(),
            "KL text".into(),
            "KL prompts".into(),
            "top-1 text".into(),
            "top-1 prompts".into(),
            "valid".into(),
            "lost / gained (p)".into(),
        ]));
        let d = &self.reference_decisions;
        let ppl = self.formats.first().map_or("-".into(), |f| {
            format!("{:.3}", f.text.reference_perplexity)
        });
        out.push_str(&row([
            "f32".into(),
            ppl,
            "1".into(),
            "0".into(),
            "0".into(),
            "100%".into(),
            "100%".into(),
            format!("{}/{}", d.valid, d.requests),
            "reference".into(),
        ]));
        for f in &self.formats {
            let d = &f.decisions;
            let two_se = 2.0 * f.text.log_ratio_se * f.text.perplexity_ratio();
            let mut line = row([
                name(f.format),
                format!("{:.3}", f.text.perplexity),
                format!("{:.4} ± {:.4}", f.text.perplexity_ratio(), two_se),
                format!("{:.5}", f.text.mean_kl),
                format!("{:.5}", f.prompts.mean_kl),
                format!("{:.1}%", 100.0 * f.text.top1_agreement),
                format!("{:.1}%", 100.0 * f.prompts.top1_agreement),
                format!("{}/{}", d.valid, d.requests),
                format!("{} / {} ({:.3})", d.lost, d.gained, d.p_worse),
            ]);
            line.insert_str(line.len() - 1, if f.passes() { "  pass" } else { "  FAIL" });
            out.push_str(&line);
        }
        out.push('\n');
        for f in &self.formats {
            out.push_str(&format!("{}: {}\n", name(f.format), f.weights));
        }
        let b = &self.bounds;
        out.push_str(&format!(
            "bounds: perplexity ratio <= {}, mean KL <= {}, top-1 agreement >= {:.0}%, valid \
             decisions not significantly fewer than f32's (one-sided McNemar p >= {})\n",
            b.max_perplexity_ratio,
            b.max_mean_kl,
            100.0 * b.min_top1_agreement,
            b.min_decisions_p
        ));
        for f in self.formats.iter().filter(|f| !f.passes()) {
            for why in &f.failures {
                out.push_str(&format!("{} fails: {why}\n", name(f.format)));
            }
        }
        out
    }
}

/// A format as `--weights` spells it.
pub fn name(format: WeightFormat) -> String {
    format.name().to_string()
}

/// The bounds `report` misses, in words.
fn failures(report: &FormatReport, reference: &Decisions, bounds: &Bounds) -> Vec<String> {
    let mut out = Vec::new();
    let ratio = report.text.perplexity_ratio();
    if ratio.is_nan() || ratio > bounds.max_perplexity_ratio {
        out.push(format!(
            "perplexity {:.4} is {:.2}% above f32's {:.4} (at most {:.2}%)",
            report.text.perplexity,
            100.0 * (ratio - 1.0),
            report.text.reference_perplexity,
            100.0 * (bounds.max_perplexity_ratio - 1.0)
        ));
    }
    for (what, d) in [("the text", &report.text), ("the prompts", &report.prompts)] {
        if d.mean_kl.is_nan() || d.mean_kl > bounds.max_mean_kl {
            out.push(format!(
                "mean KL divergence on {what} is {:.5} (at most {})",
                d.mean_kl, bounds.max_mean_kl
            ));
        }
        if d.top1_agreement.is_nan() || d.top1_agreement < bounds.min_top1_agreement {
            out.push(format!(
                "top-1 agreement on {what} is {:.1}% (at least {:.0}%)",
                100.0 * d.top1_agreement,
                100.0 * bounds.min_top1_agreement
            ));
        }
    }
    let d = &report.decisions;
    if d.p_worse < bounds.min_decisions_p {
        out.push(format!(
            "{} of {} decisions are valid against f32's {}: {} lost and {} gained, a loss this \
             one-sided has p = {:.4} (at least {}); {} cut off by max_tokens, {} failed",
            d.valid,
            d.requests,
            reference.valid,
            d.lost,
            d.gained,
            d.p_worse,
            bounds.min_decisions_p,
            d.cut_off,
            d.failed
        ));
    }
    out
}

/// Runs the gate: loads the model in f32 and in each of `spec.formats`, compares their
/// distributions over the text and the prompts, and decides the workload with each.
pub fn evaluate(
    spec: &EvalSpec,
    mut progress: impl FnMut(&str),
) -> Result<QualityReport, QualityError> {
    if spec.decisions == 0 && spec.prompts == 0 && spec.text.trim().is_empty() {
        return Err(QualityError::Settings(
            "nothing to measure: give a text, prompts or decisions".into(),
        ));
    }
    let load = |weights: WeightFormat, kv_format| -> Result<(Engine, String), QualityError> {
        let loaded = loader::load(
            &spec.model,
            &LoadOptions {
                device: spec.device.clone(),
                weights,
                tokenizer: spec.tokenizer.clone(),
            },
        )?;
        let described = loaded.weights.clone();
        let kv = crate::engine::default_kv_memory(&spec.device).min(KV_MEMORY);
        let engine = Engine::new(
            loaded,
            EngineConfig {
                kv_memory: Some(kv),
                kv_format,
                ..EngineConfig::default()
            },
        )?;
        let described = match kv_format {
            KvFormat::Model => described,
            _ => format!("{described}, KV cache {:?}", engine.kv_cache().dtype()),
        };
        Ok((engine, described))
    };
    progress("loading the reference (f32)");
    let (mut reference, reference_weights) = load(WeightFormat::F32, KvFormat::F32)?;
    let workload = workload::agent_requests(spec.decisions.max(spec.prompts), spec.seed);
    let text = text_windows(&reference, &spec.text)?;
    let prompts = workload
        .iter()
        .take(spec.prompts)
        .enumerate()
        .map(|(index, r)| {
            let tokens =
                reference
                    .prompt_tokens(&r.request.prompt)
                    .map_err(|e| QualityError::Prompt {
                        index,
                        reason: e.to_string(),
                    })?;
            Ok(Scored {
                tokens,
                scored_from: 0,
            })
        })
        .collect::<Result<Vec<_>, QualityError>>()?;
    let requests: Vec<Request> = workload
        .iter()
        .take(spec.decisions)
        .map(|r| r.request.clone())
        .collect();
    progress(&format!("f32: {} decisions", requests.len()));
    let (reference_results, reference_decisions) = decide(&mut reference, &requests, None);
    let reference_values = values(&reference_results);
    let mut all_replies = replies("f32", &requests, &reference_results);
    let mut formats = Vec::new();
    for &format in &spec.formats {
        let name = name(format);
        progress(&format!("loading {name}"));
        let (mut candidate, weights) = load(format, spec.kv_format)?;
        let kv = candidate.kv_cache().dtype();
        progress(&format!("{name}: the text ({} windows)", text.len()));
        let text_div = divergence::compare(reference.model(), candidate.model(), kv, &text)?;
        progress(&format!("{name}: {} prompts", prompts.len()));
        let prompt_div = divergence::compare(reference.model(), candidate.model(), kv, &prompts)?;
        progress(&format!("{name}: {} decisions", requests.len()));
        let (results, decisions) = decide(&mut candidate, &requests, Some(&reference_values));
        all_replies.extend(replies(&name, &requests, &results));
        let mut report = FormatReport {
            format,
            weights,
            text: text_div,
            prompts: prompt_div,
            decisions,
            failures: Vec::new(),
        };
        report.failures = failures(&report, &reference_decisions, &spec.bounds);
        formats.push(report);
    }
    Ok(QualityReport {
        model: spec.model.clone(),
        reference_weights,
        reference_decisions,
        text_tokens: text.iter().map(|w| w.tokens.len()).sum(),
        bounds: spec.bounds,
        formats,
        replies: all_replies,
    })
}

/// The text in windows of [`WINDOW`] tokens, each led by the tokens the tokenizer puts
/// before any text (a beginning-of-text token, where the model has one).
fn text_windows(engine: &Engine, text: &str) -> Result<Vec<Scored>, QualityError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let tokenizer = engine.tokenizer();
    let tokenize = |t: &str, special: bool| {
        tokenizer
            .encode(t, special)
            .map_err(|e| QualityError::Settings(format!("tokenizing the text: {e}")))
    };
    let lead = tokenize("", true)?;
    let body = tokenize(text, false)?;
    Ok(body
        .chunks(WINDOW)
        .filter(|w| w.len() > WINDOW_CONTEXT)
        .map(|w| Scored {
            tokens: lead.iter().chain(w).copied().collect(),
            scored_from: lead.len() + WINDOW_CONTEXT,
        })
        .collect())
}

/// Decides `requests` in one continuous batch.
fn decide(
    engine: &mut Engine,
    requests: &[Request],
    reference: Option<&[Option<serde_json::Value>]>,
) -> (Vec<Result<Response, RequestError>>, Decisions) {
    let started = Instant::now();
    let results: Vec<Result<Response, RequestError>> = engine.generate(requests.to_vec());
    let mut decisions = Decisions::of(&results, reference);
    decisions.seconds = started.elapsed().as_secs_f64();
    (results, decisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn divergence(reference_perplexity: f64, perplexity: f64, kl: f64, top1: f64) -> Divergence {
        Divergence {
            positions: 1700,
            predicted: 1700,
            reference_perplexity,
            perplexity,
            log_ratio_se: 0.001,
            mean_kl: kl,
            p99_kl: 10.0 * kl,
            max_kl: 100.0 * kl,
            top1_agreement: top1,
        }
    }

    fn report(text: Divergence, prompts: Divergence, lost: usize, gained: usize) -> FormatReport {
        FormatReport {
            format: WeightFormat::Int8,
            weights: "test".into(),
            text,
            prompts,
            decisions: Decisions {
                requests: 64,
                valid: 64 - lost + gained,
                cut_off: lost,
                failed: 0,
                same_as_reference: 40,
                lost,
                gained,
                p_worse: p_at_least(lost, lost + gained),
                seconds: 1.0,
            },
            failures: Vec::new(),
        }
    }

    // A gate that cannot fail guards nothing: the design item 0 of issue 17 replaced (one
    // 8-bit scale per activation row and per channel), as this gate measured it on SmolLM2
    // (perplexity 25.49 against f32's 24.60, mean KL 0.035 and 0.042, top-1 agreement 86% and
    // 87%) with the 7 of 64 looping replies the issue reported, fails every bound.
    #[test]
    fn the_replaced_int8_design_fails_every_bound() {
        let reference = Decisions {
            requests: 64,
            valid: 64,
            ..Decisions::default()
        };
        let old = report(
            divergence(24.601, 25.486, 0.035, 0.859),
            divergence(0.0, 0.0, 0.042, 0.871),
            7,
            0,
        );
        let found = failures(&old, &reference, &Bounds::EIGHT_BIT);
        assert_eq!(found.len(), 6, "{found:#?}");
        for what in [
            "perplexity",
            "KL divergence on the text",
            "top-1 agreement on the prompts",
            "p = 0.0078",
        ] {
            assert!(
                found.iter().any(|f| f.contains(what)),
                "`{what}` not named: {found:#?}"
            );
        }
    }

    #[test]
    fn flips_both_ways_are_noise_and_a_one_sided_loss_is_not() {
        let reference = Decisions::default();
        let fine = divergence(24.6, 24.65, 0.002, 0.975);
        // What any change of rounding does to a small model's replies: flips both ways, and
        // now and then a few more one way (20 lost and 13 gained has p = 0.15).
        for (lost, gained) in [(4, 3), (20, 13), (5, 0)] {
            let found = failures(
                &report(fine, fine, lost, gained),
                &reference,
                &Bounds::EIGHT_BIT,
            );
            assert!(found.is_empty(), "{lost} / {gained}: {found:#?}");
        }
        // 7 lost and none gained: p = 1/128.
        let found = failures(&report(fine, fine, 7, 0), &reference, &Bounds::EIGHT_BIT);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!((p_at_least(7, 7) - 1.0 / 128.0).abs() < 1e-12);
        assert_eq!(p_at_least(0, 9), 1.0);
    }
}
