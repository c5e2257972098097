//! Seed derivation: every random draw in throng comes from an RNG seeded with
//! `derive(run_seed, &[stream, ...])`, so that a result depends only on the run seed and on
//! where the draw happens (replicate, agent, step), never on thread count or scheduling.

/// SplitMix64's finaliser: a bijective mix with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of the stream at `path` under `seed` (e.g. `[replicate, agent, step]`).
pub fn derive(seed: u64, path: &[u64]) -> u64 {
    path.iter().fold(mix(seed), |acc, &p| {
        mix(acc ^ mix(p.wrapping_add(0x9e37_79b9_7f4a_7c15)))
    })
}

#[cfg(test)]
mod tests {
    use super::derive;

    #[test]
    fn streams_differ_and_are_stable() {
        assert_eq!(derive(42, &[1, 2]), derive(42, &[1, 2]));
        assert_ne!(derive(42, &[1, 2]), derive(42, &[2, 1]));
        assert_ne!(derive(42, &[0]), derive(43, &[0]));
        assert_ne!(derive(0, &[0]), derive(0, &[]));
    }
}
