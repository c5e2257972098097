//! What this CPU has, detected once at run time (never from compile flags), within the cap
//! `THRONG_MAX_CPU_ISA` sets (`portable`, `avx2` or `avx512`), as oneDNN's
//! `ONEDNN_MAX_CPU_ISA` does: to measure the AVX2 kernel on a CPU that has AVX-512, or to
//! compare kernels.

use std::sync::LazyLock;

/// An instruction set the kernels are written for, in order of capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 F, BW and VNNI (with AVX2 and FMA).
    Avx512,
}

/// The most capable instruction set this CPU has.
pub(crate) fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        if avx2
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni")
        {
            return Isa::Avx512;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The cap `THRONG_MAX_CPU_ISA` sets, if it names one.
fn cap() -> Option<Isa> {
    let value = std::env::var("THRONG_MAX_CPU_ISA").ok()?;
    match value.to_ascii_lowercase().as_str() {
        "portable" | "none" => Some(Isa::Portable),
        "avx2" => Some(Isa::Avx2),
        "avx512" | "avx512_vnni" => Some(Isa::Avx512),
        _ => None,
    }
}

/// The instruction set the kernels use: the detected one, within the cap.
pub(crate) static ISA: LazyLock<Isa> = LazyLock::new(|| {
    let best = detected();
    cap().map_or(best, |cap| best.min(cap))
});
