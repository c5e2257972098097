//! What this CPU has, detected once at run time (never from compile flags), within the cap
//! `THRONG_MAX_CPU_ISA` sets (`portable`, `avx2` or `avx512`), as oneDNN's
//! `ONEDNN_MAX_CPU_ISA` does: to measure the AVX2 kernels on a CPU that has AVX-512, or to
//! compare kernels. The integer products ([`super::quant`]) and the attention kernel
//! ([`super::attention`]) both choose their code from it.

use std::sync::LazyLock;

/// An instruction set throng's kernels are written for, in order of capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    Portable,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 F and BW (with AVX2, FMA and F16C).
    Avx512,
}

/// What the kernels may use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cpu {
    pub isa: Isa,
    /// AVX-512 VNNI (`vpdpbusd`), with [`Isa::Avx512`].
    pub vnni: bool,
}

/// What this CPU has, uncapped.
pub(crate) fn detected() -> Cpu {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw");
        let vnni = avx512 && std::is_x86_feature_detected!("avx512vnni");
        let isa = match (avx512, avx2) {
            (true, _) => Isa::Avx512,
            (false, true) => Isa::Avx2,
            _ => Isa::Portable,
        };
        Cpu { isa, vnni }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Cpu {
        isa: Isa::Portable,
        vnni: false,
    }
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

/// What the kernels use: what this CPU has, within the cap.
pub(crate) static CPU: LazyLock<Cpu> = LazyLock::new(|| {
    let found = detected();
    match cap() {
        Some(cap) if cap < found.isa => Cpu {
            isa: cap,
            vnni: false,
        },
        _ => found,
    }
});
