//! Which kernel computes a tile, chosen at run time from what this CPU has ([`super::cpu`]),
//! never from the flags the program was compiled with: one binary runs the AVX-512 VNNI
//! kernel where the CPU has it, the AVX2 one on the CPUs most people have, and plain Rust
//! elsewhere. All give the same bits.

use super::layout::{Kind, PANEL};
use super::rows::Rows;
use crate::model::cpu::{self, Cpu, Isa};

/// A tile kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kernel {
    /// [`super::portable`]: plain Rust, any CPU.
    Portable,
    /// [`super::avx2`]: AVX2 and FMA, eight channels per vector.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// [`super::avx512`]: AVX-512 F, BW and VNNI, sixteen channels per vector.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

fn kernel_of(cpu: Cpu) -> Kernel {
    match (cpu.isa, cpu.vnni) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512, true) => Kernel::Avx512,
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512 | Isa::Avx2, _) => Kernel::Avx2,
        _ => Kernel::Portable,
    }
}

impl Kernel {
    /// The fastest kernel this CPU runs (within `THRONG_MAX_CPU_ISA`).
    pub(crate) fn best() -> Self {
        kernel_of(*cpu::CPU)
    }

    /// Every kernel this CPU runs.
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Self> {
        let best = kernel_of(cpu::detected());
        let mut all = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        all.extend(
            [Kernel::Avx2, Kernel::Avx512]
                .into_iter()
                .filter(|k| *k <= best),
        );
        all
    }

    /// The name `throng` prints (`avx2`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => "avx512-vnni",
        }
    }

    /// `acc[i][j]` for rows `first..first + n` (`n <= 4`) of `rows` and channel `j` of
    /// `panel` (`rows.blocks()` records of `kind`).
    pub(crate) fn tile(
        self,
        kind: Kind,
        rows: &Rows,
        first: usize,
        n: usize,
        panel: &[u8],
        acc: &mut [[f32; PANEL]; 4],
    ) {
        assert!((1..=4).contains(&n), "invariant: tiles of one to four rows");
        assert!(first + n <= rows.len(), "invariant: rows");
        assert_eq!(
            panel.len(),
            rows.blocks() * kind.record_bytes(),
            "invariant: the panel's depth is the rows'"
        );
        match self {
            Kernel::Portable => super::portable::tile(kind, rows, first, n, panel, acc),
            // Safety: `Kernel::Avx2` is chosen only where the CPU has AVX2 and FMA, and the
            // asserts above give the sizes the kernel reads.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { super::avx2::tile(kind, rows, first, n, panel, acc) },
            // Safety: as above, for AVX-512 F, BW and VNNI.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { super::avx512::tile(kind, rows, first, n, panel, acc) },
        }
    }
}
