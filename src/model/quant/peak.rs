//! What this CPU can do at most with the kernels' instructions, measured: the rate of 8-bit
//! products (`vpmaddubsw` + `vpaddw` per 32 on AVX2, `vpdpbusd` per 64 on AVX-512 VNNI) on
//! every thread, with no memory traffic, and how fast every thread together reads memory. The
//! benchmarks report their rates as shares of these (`throng bench --machine`).

use super::kernel::Kernel;
use rayon::prelude::*;
use std::time::Instant;

/// 8-bit products per second over every thread of the pool, through `kernel`'s instructions.
pub(crate) fn int8_products_per_second(kernel: Kernel) -> f64 {
    const ITERATIONS: u64 = 20_000_000;
    let threads = rayon::current_num_threads();
    let start = Instant::now();
    let products: u64 = (0..threads)
        .into_par_iter()
        .map(|seed| products(kernel, ITERATIONS, seed as u8))
        .sum();
    products as f64 / start.elapsed().as_secs_f64()
}

/// Runs `iterations` rounds of eight independent product chains; returns the products made.
fn products(kernel: Kernel, iterations: u64, seed: u8) -> u64 {
    match kernel {
        // Safety: the kernel is chosen only where the CPU has its instructions.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { avx2(iterations, seed) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { avx512(iterations, seed) },
        Kernel::Portable => {
            let (a, b) = (
                std::hint::black_box(seed as i32),
                std::hint::black_box(3i32),
            );
            let mut acc = [0i32; 8];
            for _ in 0..iterations / 8 {
                for (i, acc) in acc.iter_mut().enumerate() {
                    *acc = acc.wrapping_add(a * (b + i as i32));
                }
            }
            std::hint::black_box(acc);
            iterations / 8 * 8
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(iterations: u64, seed: u8) -> u64 {
    use std::arch::x86_64::*;
    // Each product reads its chain's own sums as its unsigned operand, so no product can be
    // computed once outside the loop (with both operands fixed, the compiler did, and this
    // measured additions alone, twice the real rate). Twelve chains cover the product's
    // latency at two a cycle.
    let b = std::hint::black_box(_mm256_set1_epi8(3));
    let mut acc: [__m256i; 12] =
        std::array::from_fn(|i| _mm256_set1_epi8((seed as i8 & 0x0F) + i as i8));
    for _ in 0..iterations {
        for acc in &mut acc {
            *acc = _mm256_add_epi16(*acc, _mm256_maddubs_epi16(*acc, b));
        }
    }
    std::hint::black_box(acc);
    iterations * 12 * 32
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn avx512(iterations: u64, seed: u8) -> u64 {
    use std::arch::x86_64::*;
    let a = std::hint::black_box(_mm512_set1_epi8(seed as i8 & 0x0F));
    let b = std::hint::black_box(_mm512_set1_epi8(3));
    // The sums are an operand of every product, so each is made in the loop; twelve chains
    // cover its latency.
    let mut acc = [_mm512_setzero_si512(); 12];
    for _ in 0..iterations {
        for acc in &mut acc {
            *acc = _mm512_dpbusd_epi32(*acc, a, b);
        }
    }
    std::hint::black_box(acc);
    iterations * 12 * 64
}

/// Bytes per second every thread of the pool reads together from a buffer far larger than
/// any cache (512 MiB, read three times; the best pass counts).
pub fn memory_read_bytes_per_second() -> f64 {
    const BYTES: usize = 512 << 20;
    let words: Vec<u64> = (0..BYTES / 8).into_par_iter().map(|i| i as u64).collect();
    let chunk = words.len() / (4 * rayon::current_num_threads()).max(1);
    let mut best = 0f64;
    for _ in 0..3 {
        let start = Instant::now();
        let sum: u64 = words
            .par_chunks(chunk.max(1))
            .map(|c| c.iter().fold(0u64, |s, &w| s ^ w))
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(sum);
        best = best.max(BYTES as f64 / start.elapsed().as_secs_f64());
    }
    best
}
