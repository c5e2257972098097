//! The packed layout the kernels read: groups, panels, and the sum of a group's two parts.

/// Weights per scale along a channel, and the depth every row is padded to a multiple of.
pub(crate) const GROUP: usize = 64;
/// Output channels per packed panel: two 16-lane vectors.
pub(crate) const PANEL: usize = 32;
/// 4-byte steps per group: `vpdpbusd` sums four byte products per lane.
pub(crate) const STEPS: usize = GROUP / 4;

/// One panel's data, as a kernel reads it.
#[derive(Clone, Copy)]
pub(crate) struct Panel<'a> {
    /// `groups * STEPS * PANEL * 4` bytes.
    pub weights: &'a [i8],
    /// `groups * PANEL`.
    pub scales: &'a [f32],
    /// `groups * PANEL`.
    pub zero_points: &'a [i32],
    pub groups: usize,
}

/// A group's joined integer sum from the two parts' sums (each carrying the zero point):
/// `256 * (coarse - zp) + (residual - zp)`, with `zero_point = 257 * zp`.
#[inline(always)]
pub(crate) fn join(coarse: i32, residual: i32, zero_point: i32) -> i32 {
    (coarse << 8) + residual - zero_point
}
