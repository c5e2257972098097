//! One line on what an engine did, for the end of a command or a run.

use super::Engine;
use std::time::Duration;

/// One line on what the engine did over `wall`: the requests it took (not those a store
/// answered, nor a resumed run's earlier ones), throughput, prefix cache, where the time went.
pub fn summary(engine: &Engine, wall: Duration) -> String {
    let t = engine.totals();
    let requests = t.requests;
    let secs = wall.as_secs_f64().max(1e-9);
    let busy = (t.forward + t.masks + t.sampling).as_secs_f64().max(1e-9);
    let masks = match (
        engine.mask_time_quantile(0.5),
        engine.mask_time_quantile(0.99),
    ) {
        (Some(p50), Some(p99)) => format!(
            ", p50 {:.0}us, p99 {:.0}us",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        ),
        _ => String::new(),
    };
    format!(
        "throng: {requests} requests in {secs:.2}s ({:.1}/s); prompt {} tokens, prefix-cache hits {:.0}%; \
         generated {} tokens ({:.1}/s, {} forced by grammars); {} steps, {:.1} tokens/step; \
         forward {:.2}s, masks {:.3}s ({} masks{masks}), sampling {:.3}s ({:.1}% of step time on masks and \
         sampling); {} preemptions",
        requests as f64 / secs,
        t.prompt_tokens,
        100.0 * t.prefix_hit_rate(),
        t.generated_tokens + t.forced_tokens,
        (t.generated_tokens + t.forced_tokens) as f64 / secs,
        t.forced_tokens,
        t.steps,
        (t.prefill_tokens + t.generated_tokens) as f64 / t.steps.max(1) as f64,
        t.forward.as_secs_f64(),
        t.masks.as_secs_f64(),
        t.num_masks,
        t.sampling.as_secs_f64(),
        100.0 * (t.masks + t.sampling).as_secs_f64() / busy,
        t.preemptions,
    )
}
