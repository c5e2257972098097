//! Where a forward pass spends its time, per operation (`throng generate --profile`).
//!
//! Off by default; a model with profiling on times each operation of every forward pass on
//! the CPU (candle runs CPU ops synchronously, so wall time around an op is that op's cost,
//! including its thread-pool hand-offs). The time no operation claims is the glue between them:
//! reshapes, views, the final row gather. Counters are atomics, so a shared `&Profile` records
//! from a `&self` forward pass without locks.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One kind of operation of the Llama forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Embedding,
    /// RMSNorm on its own (before the first layer).
    Norms,
    QkvProj,
    Rope,
    /// Splitting the fused projection into contiguous q, k and v.
    Copies,
    KvWrite,
    Attention,
    OProj,
    /// The two residual additions of every layer, each fused with the RMSNorm after it.
    Residual,
    GateUpProj,
    Swiglu,
    DownProj,
    /// A mixture's routing: router scores, choosing experts, and adding their outputs.
    Router,
    LmHead,
}

impl Op {
    pub const ALL: [Op; 14] = [
        Op::Embedding,
        Op::Norms,
        Op::QkvProj,
        Op::Rope,
        Op::Copies,
        Op::KvWrite,
        Op::Attention,
        Op::OProj,
        Op::Residual,
        Op::GateUpProj,
        Op::Swiglu,
        Op::DownProj,
        Op::Router,
        Op::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Embedding => "embedding lookup",
            Op::Norms => "rms norms",
            Op::QkvProj => "matmul qkv",
            Op::Rope => "rope",
            Op::Copies => "q/k/v split copies",
            Op::KvWrite => "kv cache write",
            Op::Attention => "attention (paged)",
            Op::OProj => "matmul o",
            Op::Residual => "residual add + rms norm",
            Op::GateUpProj => "matmul gate+up",
            Op::Swiglu => "swiglu",
            Op::DownProj => "matmul down",
            Op::Router => "expert routing",
            Op::LmHead => "matmul lm head",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
struct Counter {
    nanos: AtomicU64,
    calls: AtomicU64,
    /// Multiply-adds, for matrix products.
    macs: AtomicU64,
}

/// Accumulated timings of every forward pass since profiling was turned on.
#[derive(Debug, Default)]
pub struct Profile {
    ops: [Counter; Op::ALL.len()],
    forwards: AtomicU64,
    forward_nanos: AtomicU64,
    tokens: AtomicU64,
}

impl Profile {
    /// Runs `f`, charging its wall time to `op`.
    pub(crate) fn time<R>(&self, op: Op, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let out = f();
        let c = &self.ops[op.index()];
        c.nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.calls.fetch_add(1, Ordering::Relaxed);
        out
    }

    pub(crate) fn add_macs(&self, op: Op, macs: u64) {
        self.ops[op.index()].macs.fetch_add(macs, Ordering::Relaxed);
    }

    pub(crate) fn forward_done(&self, took: Duration, tokens: usize) {
        self.forwards.fetch_add(1, Ordering::Relaxed);
        self.forward_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        self.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// A Markdown table: each operation's share of forward time, time per step, calls per
    /// step, time per call and, for matrix products, the rate achieved.
    pub fn table(&self) -> String {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let forwards = load(&self.forwards).max(1) as f64;
        let total = load(&self.forward_nanos).max(1) as f64;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} forward passes, {} tokens ({:.1} per pass), {:.3} s in total",
            load(&self.forwards),
            load(&self.tokens),
            load(&self.tokens) as f64 / forwards,
            total * 1e-9
        );
        let _ = writeln!(
            out,
            "| operation | share | ms per pass | calls per pass | us per call | GOP/s |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        let mut claimed = 0u64;
        for op in Op::ALL {
            let c = &self.ops[op.index()];
            let (nanos, calls, macs) = (load(&c.nanos), load(&c.calls), load(&c.macs));
            claimed += nanos;
            if calls == 0 {
                continue;
            }
            let rate = if macs > 0 {
                format!("{:.0}", 2.0 * macs as f64 / nanos.max(1) as f64)
            } else {
                "-".into()
            };
            let _ = writeln!(
                out,
                "| {} | {:.1}% | {:.2} | {:.0} | {:.1} | {rate} |",
                op.name(),
                100.0 * nanos as f64 / total,
                nanos as f64 / forwards * 1e-6,
                calls as f64 / forwards,
                nanos as f64 / calls as f64 * 1e-3,
            );
        }
        let glue = load(&self.forward_nanos).saturating_sub(claimed);
        let _ = writeln!(
            out,
            "| other (views, row gather, tensor set-up) | {:.1}% | {:.2} | - | - | - |",
            100.0 * glue as f64 / total,
            glue as f64 / forwards * 1e-6,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op the forward pass charges shows up in the table with its share, and the
    /// unclaimed remainder is reported instead of silently dropped.
    #[test]
    fn the_table_lists_charged_ops_and_the_remainder() {
        let p = Profile::default();
        p.time(Op::QkvProj, || std::thread::sleep(Duration::from_millis(2)));
        p.add_macs(Op::QkvProj, 1_000_000);
        p.forward_done(Duration::from_millis(4), 3);
        let table = p.table();
        assert!(table.contains("| matmul qkv |"), "{table}");
        assert!(!table.contains("| rope |"), "{table}");
        assert!(table.contains("| other"), "{table}");
        assert!(table.starts_with("1 forward passes, 3 tokens"), "{table}");
    }
}
