//! The tile kernel in plain Rust: any CPU, one channel at a time. Each block's integer sum is
//! exact, and the floats are joined as every SIMD kernel joins them, lane by lane: per
//! block `t = d * scale`, `y = fma(J, t, y)`, then for 4-bit weights `y = fma(m, sum, y)`.
//! So every kernel gives these bits.

use super::layout::{self, BLOCK, Kind, PANEL};
use super::rows::{Precision, Rows};

/// `acc[i][j]` for rows `first..first + n` and the panel's channels `j`.
pub(super) fn tile(
    kind: Kind,
    rows: &Rows,
    first: usize,
    n: usize,
    panel: &[u8],
    acc: &mut [[f32; PANEL]; 4],
) {
    let blocks = rows.blocks();
    let record = kind.record_bytes();
    for (i, acc) in acc.iter_mut().enumerate().take(n) {
        let r = first + i;
        let coarse = rows.part(r, 0);
        let residual = (rows.precision == Precision::Sixteen).then(|| rows.part(r, 1));
        for (j, acc) in acc.iter_mut().enumerate() {
            let mut y = 0f32;
            for b in 0..blocks {
                let rec = &panel[b * record..(b + 1) * record];
                let (mut jc, mut jr) = (0i32, 0i32);
                for k in 0..BLOCK {
                    let w = layout::quant(kind, rec, j, k);
                    jc += w * coarse[b * BLOCK + k] as i32;
                    if let Some(residual) = residual {
                        jr += w * residual[b * BLOCK + k] as i32;
                    }
                }
                let joined = match residual {
                    Some(_) => (jc << 8) + jr,
                    None => jc,
                };
                let t = layout::scale(kind, rec, j) * rows.scale[r * blocks + b];
                y = (joined as f32).mul_add(t, y);
                if kind == Kind::Q4 {
                    y = layout::min(rec, j).mul_add(rows.sum[r * blocks + b], y);
                }
            }
            *acc = y;
        }
    }
}
