//! The int8 tile kernel in plain Rust: any CPU, one channel at a time, the same integer sums
//! and the same float operations in the same order as [`super::vnni`] (a conversion to f32
//! rounding to nearest even, then a fused multiply-add per group), so the same bits.

use super::panel::{GROUP, PANEL, Panel, STEPS, join};

/// `acc[r][j] = sum_g sw[j, g] * J[r, j, g]` for `rows` rows whose parts are `parts`
/// (`2 * rows * depth` bytes: row r's coarse part, then its residual).
pub(super) fn tile(
    rows: usize,
    parts: &[u8],
    depth: usize,
    panel: Panel<'_>,
    acc: &mut [[f32; PANEL]; 4],
) {
    for (r, acc) in acc.iter_mut().enumerate().take(rows) {
        let coarse = &parts[2 * r * depth..(2 * r + 1) * depth];
        let residual = &parts[(2 * r + 1) * depth..(2 * r + 2) * depth];
        for (j, acc) in acc.iter_mut().enumerate() {
            let mut sum = 0f32;
            for g in 0..panel.groups {
                let (mut c, mut s) = (0i32, 0i32);
                for t in 0..STEPS {
                    let w = &panel.weights[((g * STEPS + t) * PANEL + j) * 4..][..4];
                    let k = g * GROUP + t * 4;
                    for (i, &w) in w.iter().enumerate() {
                        c += coarse[k + i] as i32 * w as i32;
                        s += residual[k + i] as i32 * w as i32;
                    }
                }
                let joined = join(c, s, panel.zero_points[g * PANEL + j]);
                sum = (joined as f32).mul_add(panel.scales[g * PANEL + j], sum);
            }
            *acc = sum;
        }
    }
}
