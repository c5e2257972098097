//! The streams a run's seed is split into (see [`crate::seed::derive`]), one per kind of draw,
//! so that no two kinds ever share numbers.

pub(super) const INIT: u64 = 1;
pub(super) const RESOLVE: u64 = 2;
pub(super) const AGENT: u64 = 3;
pub(super) const POPULATION: u64 = 4;
pub(super) const POLICY: u64 = 5;
pub(super) const LOG_SAMPLE: u64 = 6;
