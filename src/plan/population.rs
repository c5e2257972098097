//! One population size of a plan: its first step built (and sampled) here, the estimate per
//! device, where the models go, whether it fits, and the devices a target step time needs.

use super::device::{self, Estimate, Figure, Inputs, ModelLoad, Placement, Source, Speed};
use super::error::PlanError;
use super::sizing::{bytes, count, fitting_format, tag};
use super::writer::{Draft, check_devices, say};
use crate::sim::runner::FirstStep;
use std::io::Write;

/// The part of the plan for population `size`.
pub fn population(plan: &mut Draft, size: usize, out: &mut dyn Write) -> Result<(), PlanError> {
    let first = plan.loaded.first_step(&mut plan.llm, size, plan.sample)?;
    check_devices(plan.options.devices, size, first.decisions)?;
    let (inputs, reply, speed) = inputs(plan, &first)?;
    let e = inputs.estimate();
    say_estimate(plan, size, &first, reply, &e, out)?;
    say_step_time(&first, &speed, &e, out)?;
    if let (Some(touched), Some(x), true) = (e.experts_touched, plan.experts, e.fits) {
        say!(
            out,
            "  experts per decode step  {touched:.1} of {} a layer read from memory at a batch of {} \
             ({} of {} weights) [assumed: uniform routing]; compute counts the {} routed experts \
             of each token ({} parameters)",
            x.count,
            e.batch.max(1),
            bytes(e.weights_read),
            bytes(plan.models.sized.weight_bytes.value),
            x.per_token,
            count(plan.models.sized.cfg.active_parameters())
        )?;
    }
    say_models(plan, &first, reply, out)?;
    say!(
        out,
        "  fits                     {}",
        fits(plan, &inputs, &e)
    )?;
    if let Some(target) = plan.options.target_step {
        say_target(&inputs, &first, target, out)?;
    }
    Ok(())
}

/// The estimate's inputs for `first`: the reply tokens (measured from the sample, else
/// `max_tokens`) and the speed (the profile's, else the sample's).
fn inputs(plan: &Draft, first: &FirstStep) -> Result<(Inputs, Figure, Speed), PlanError> {
    let s = &plan.models.sized;
    let reply = match &first.sample {
        Some(sample) if sample.decisions > 0 => Figure::new(
            sample.generated_tokens as f64 / sample.decisions as f64,
            Source::Measured,
        ),
        _ => Figure::new(plan.max_tokens as f64, Source::Assumed),
    };
    let speed = match (plan.profile, &first.sample) {
        (Some(p), _) => Speed::Profile(p),
        (None, Some(sample)) => Speed::Measured {
            decisions: sample.decisions,
            seconds: sample.seconds,
        },
        (None, None) => crate::run::refuse!(
            "nothing measures the speed: give --sample N or --device-profile NAME"
        ),
    };
    let tokens = match s.stated {
        Some(_) => Source::Assumed,
        None => Source::Measured,
    };
    let inputs = Inputs {
        devices: plan.options.devices,
        memory_per_device: s.memory,
        weight_bytes: s.weight_bytes,
        parameters: s.cfg.parameters(),
        active_parameters: s.cfg.active_parameters(),
        experts: plan.experts,
        kv_bytes_per_token: s.kv_token,
        cells: first.cells,
        decisions: first.decisions,
        prompt_tokens: Figure::new(first.prompt_tokens, tokens),
        shared_tokens: Figure::new(first.shared_tokens, tokens),
        prefixes: first.prefixes.len(),
        prefix_tokens: first.prefixes.iter().sum::<usize>() as f64
            / first.prefixes.len().max(1) as f64,
        reply_tokens: reply,
        max_seqs: plan.options.settings.engine.max_seqs,
        speed,
    };
    Ok((inputs, reply, speed))
}

/// The first step's tokens, the KV cache and the batch per device.
fn say_estimate(
    plan: &Draft,
    size: usize,
    first: &FirstStep,
    reply: Figure,
    e: &Estimate,
    out: &mut dyn Write,
) -> Result<(), PlanError> {
    let s = &plan.models.sized;
    say!(
        out,
        "\npopulation {size}: {} cells, {} decisions in the first step",
        first.cells,
        first.decisions
    )?;
    match &s.stated {
        Some(counted) => say!(
            out,
            "  prompt tokens per agent  {:.1} [{counted}; {} first-step prompts rendered]",
            first.prompt_tokens,
            first.tokenized
        )?,
        None => say!(
            out,
            "  prompt tokens per agent  {:.1} [measured: {} first-step prompts rendered and tokenized]",
            first.prompt_tokens,
            first.tokenized
        )?,
    }
    say!(
        out,
        "  shared system prompt     {:.1} tokens, {:.0}% of prompt tokens [{}; {} distinct]",
        first.shared_tokens,
        e.shared_share * 100.0,
        if s.stated.is_some() {
            "as counted above"
        } else {
            "measured"
        },
        first.prefixes.len()
    )?;
    say!(
        out,
        "  reply tokens per agent   {:.1} [{}]",
        reply.value,
        match reply.source {
            Source::Measured => format!(
                "measured: {} sampled decisions",
                first.sample.as_ref().map_or(0, |s| s.decisions)
            ),
            _ => format!("assumed: max_tokens = {}, an upper bound", plan.max_tokens),
        }
    )?;
    say!(
        out,
        "  KV per agent             {} (own prompt and reply); system prompts {} per device",
        bytes(e.kv_per_sequence),
        bytes(e.kv_prefixes)
    )?;
    say!(
        out,
        "  KV memory per device     {} free for the cache of {} [{}] (less weights, {:.0}% reserve [assumed]); \
         the whole step at once needs {}",
        bytes(e.kv_memory),
        bytes(s.memory.value),
        tag(s.memory),
        device::RESERVED_SHARE * 100.0,
        bytes(e.kv_whole_step)
    )?;
    say!(
        out,
        "  batch per device         {} sequences of {} decisions (at most --max-seqs {})",
        e.batch,
        e.decisions_per_device,
        plan.options.settings.engine.max_seqs
    )
}

/// The step time, and where it comes from.
fn say_step_time(
    first: &FirstStep,
    speed: &Speed,
    e: &Estimate,
    out: &mut dyn Write,
) -> Result<(), PlanError> {
    if !e.fits {
        return say!(
            out,
            "  step time                none: it does not fit (see below)"
        );
    }
    say!(
        out,
        "  step time                {:.2} s [{}]",
        e.step_seconds.value,
        match (speed, &first.sample) {
            (Speed::Measured { .. }, Some(s)) => format!(
                "measured: {} decisions took {:.2} s here, scaled to {} per device",
                s.decisions, s.seconds, e.decisions_per_device
            ),
            _ => format!(
                "assumed: stated bandwidth and FLOP/s at {:.0}% and {:.0}% efficiency",
                device::BANDWIDTH_EFFICIENCY * 100.0,
                device::FLOPS_EFFICIENCY * 100.0
            ),
        }
    )
}

/// Where the models go: each with its share of the step's decisions (the run's agents it
/// decides for), the prompts counted once for all (their text is the same).
fn say_models(
    plan: &Draft,
    first: &FirstStep,
    reply: Figure,
    out: &mut dyn Write,
) -> Result<(), PlanError> {
    let m = &plan.models;
    let all: u64 = m.shares.iter().sum::<u64>().max(1);
    let share = |i: usize| {
        let n = m.shares.get(i).copied().unwrap_or(all);
        (first.decisions as u128 * n as u128 / all as u128) as usize
    };
    let sequence_tokens = (first.prompt_tokens - first.shared_tokens).max(0.0) + reply.value;
    let prefix_tokens = first.prefixes.iter().sum::<usize>() as f64;
    let mut models = vec![ModelLoad {
        name: m.name.clone(),
        weight_bytes: m.sized.weight_bytes.value,
        kv_bytes_per_token: m.sized.kv_token.value,
        decisions: if m.others.is_empty() {
            first.decisions
        } else {
            share(0)
        },
        sequence_tokens,
        prefix_tokens,
        active_parameters: m.sized.cfg.active_parameters(),
    }];
    for (i, (name, cfg, weights, kv)) in m.others.iter().enumerate() {
        models.push(ModelLoad {
            name: name.clone(),
            weight_bytes: weights.value,
            kv_bytes_per_token: kv.value,
            decisions: share(i + 1),
            sequence_tokens,
            prefix_tokens,
            active_parameters: cfg.active_parameters(),
        });
    }
    if !m.others.is_empty() {
        say!(
            out,
            "  models                   {} ({}): {}",
            models.len(),
            match m.placement {
                Placement::SplitModels => "split across devices, as --split models runs them",
                Placement::Everywhere => "every device holds every model",
            },
            models
                .iter()
                .map(|m| format!(
                    "{} weights {}, {} decisions",
                    m.name,
                    bytes(m.weight_bytes),
                    m.decisions
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )?;
    }
    // A placement that cannot be made is the plan's failure, told in the run's error.
    let placed = device::place(
        &models,
        plan.options.devices,
        m.sized.memory.value,
        m.placement,
    )?;
    for line in placed.lines() {
        say!(out, "  {line}")?;
    }
    Ok(())
}

/// Whether the step fits a device, and if not, why and what would make it.
fn fits(plan: &Draft, inputs: &Inputs, e: &Estimate) -> String {
    if e.fits {
        return "yes".to_string();
    }
    let s = &plan.models.sized;
    let devices = plan.options.devices;
    let usable = s.memory.value * (1.0 - device::RESERVED_SHARE);
    let what = if s.weight_bytes.value > usable {
        format!(
            "its weights ({}) are more than the {} a device leaves for them and the KV cache",
            bytes(s.weight_bytes.value),
            bytes(usable)
        )
    } else {
        "the weights and system prompts leave no room for one agent's KV cache".to_string()
    };
    let devices = if devices > 1 {
        format!(
            " More devices do not help: each of the {devices} holds the whole model (throng \
             splits agents across devices, not a model's layers or tensors)."
        )
    } else {
        " More devices would not help: each holds the whole model (throng splits \
         agents across devices, not a model's layers or tensors)."
            .to_string()
    };
    match (plan.profile, s.format) {
        (Some(p), Some(f)) => match fitting_format(&s.cfg, f, inputs) {
            (Some((fit, w)), _) => format!(
                "NO in {}: {what}. It fits with --weights {} ({} of weights; its KV cache \
                 is f32, and attention runs as gathered matmuls rather than paged \
                 FlashAttention).{devices}",
                f.name(),
                fit.name(),
                bytes(w)
            ),
            (None, smallest) => format!(
                "NO: {what}, and no weight format throng converts to on a GPU makes it fit \
                 (q8_0, the smallest, takes {}): not runnable on one {}; use a device \
                 with more memory or a smaller model.{devices}",
                bytes(smallest),
                p.name
            ),
        },
        _ => format!("NO: {what}; use a bigger device or a smaller model"),
    }
}

/// The devices a step of `target` seconds needs.
fn say_target(
    inputs: &Inputs,
    first: &FirstStep,
    target: f64,
    out: &mut dyn Write,
) -> Result<(), PlanError> {
    // More devices than decisions would add none that has work.
    let limit = first.decisions.clamp(1, 4096);
    match inputs.devices_for(target, limit) {
        Some(d) => say!(
            out,
            "  for a {target} s step      {d} device{} (agents split evenly; scaling assumed linear)",
            if d == 1 { "" } else { "s" }
        ),
        None => say!(
            out,
            "  for a {target} s step      not reachable with up to {limit} device{}{}",
            if limit == 1 { "" } else { "s" },
            if limit == first.decisions {
                " (one per decision of the step)"
            } else {
                ""
            }
        ),
    }
}
