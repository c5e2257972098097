//! Integer linear layers: weights in 4- or 8-bit blocks of 32 (a GGUF file's Q4_0, Q4_1,
//! Q4_K and Q8_0 blocks as they are stored, or any weights quantized to 8 bits), activations
//! quantized per block of 32 in two 8-bit parts ([`rows`]), products summed exactly in 32-bit
//! integers per block and the blocks joined in f32 in one fixed order.
//!
//! `y[r, c] = sum_b (J[r, c, b] * (d[c, b] * scale[r, b]) + m[c, b] * sum[r, b])`, where `J`
//! is the exact integer product of block `b`'s quants with the row's two parts joined
//! (`256 coarse + residual`), `d` and `m` the block's scale and min (8-bit weights have no
//! min), `scale` the row block's step and `sum` its inputs' sum times it.
//!
//! **Batch invariance by construction.** Each block's integer sum is exact, and every kernel
//! joins the blocks of one output with the same float operations in the same order, reading
//! only that row and that channel. Row `r` of a batch is therefore bit for bit the same as
//! row `r` computed alone, whichever kernel or thread computes it, on every CPU.
//!
//! **Speed.** One read of a panel's weights serves every row of the step: rows go through it
//! four at a time while it stays in the cache, so prefill and many-agent decode are bound by
//! the integer units, and a single stream by reading the weights once (5 to 9 bits per
//! weight). The kernels: [`avx512`] (VNNI, `vpdpbusd`), [`avx2`] (`vpmaddubsw`/`vpmaddwd`),
//! [`portable`]; [`kernel`] picks one at run time.

mod avx2;
mod avx512;
pub(crate) mod blocks;
pub(crate) mod kernel;
mod layout;
mod peak;
mod portable;
mod rows;

pub(crate) use kernel::Kernel;
pub(crate) use layout::{BLOCK, Block, Kind, PANEL};
pub use peak::memory_read_bytes_per_second;
use rayon::prelude::*;
pub(crate) use rows::Precision;
use rows::Rows;

/// Rows per block of work: enough that a panel's weights, read once from memory, serve many
/// rows from the cache.
const ROWS_PER_BLOCK: usize = 64;

/// Sums of `in_features` terms stay exact in 32 bits for any width (each block's sum is
/// bounded and blocks are joined in f32), so only a row's size in memory limits it.
pub(crate) const MAX_IN_FEATURES: usize = 1 << 24;

/// A record's bytes, aligned to a cache line so that no 64-byte step straddles two.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Whether this CPU has a SIMD kernel (and not only the portable one), which is what makes
/// integer weights the fastest format on it.
pub fn has_simd_kernel() -> bool {
    Kernel::best() != Kernel::Portable
}

/// The name of the kernel integer layers run on this CPU (`avx2`).
pub fn kernel_name() -> &'static str {
    Kernel::best().name()
}

/// 8-bit products per second this CPU makes at most through the kernel in use, on every
/// thread of the pool ([`peak`]).
pub fn int8_peak() -> f64 {
    peak::int8_products_per_second(Kernel::best())
}

/// An `(out_features, in_features)` weight matrix in integer blocks, in panels of [`PANEL`]
/// channels (see [`layout`]).
pub(crate) struct QuantMatrix {
    kind: Kind,
    /// How its inputs are quantized.
    precision: Precision,
    lines: Vec<Line>,
    in_features: usize,
    /// `in_features` rounded up to [`BLOCK`].
    depth: usize,
    out_features: usize,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("kind", &self.kind)
            .field("precision", &self.precision)
            .field("out_features", &self.out_features)
            .field("in_features", &self.in_features)
            .finish_non_exhaustive()
    }
}

impl QuantMatrix {
    /// Packs a matrix whose channel `c`'s blocks `channel(c)` gives (`in_features` rounded up
    /// to [`BLOCK`] of them, in order), its inputs to be quantized to `precision`.
    pub(crate) fn pack(
        kind: Kind,
        precision: Precision,
        out_features: usize,
        in_features: usize,
        channel: impl Fn(usize) -> Vec<Block> + Sync,
    ) -> Self {
        assert!(
            in_features <= MAX_IN_FEATURES,
            "invariant: the loader keeps wider layers dense"
        );
        let depth = in_features.next_multiple_of(BLOCK).max(BLOCK);
        let blocks = depth / BLOCK;
        let panels = out_features.div_ceil(PANEL);
        let record = kind.record_bytes();
        let panel_lines = blocks * record / 64;
        let mut lines = vec![Line([0; 64]); panels * panel_lines];
        lines
            .par_chunks_mut(panel_lines)
            .enumerate()
            .for_each(|(p, lines)| {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(lines);
                for j in 0..PANEL.min(out_features - p * PANEL) {
                    let channel = channel(p * PANEL + j);
                    assert_eq!(channel.len(), blocks, "invariant: a block per 32 inputs");
                    for (b, block) in channel.iter().enumerate() {
                        layout::put(kind, &mut bytes[b * record..(b + 1) * record], j, block);
                    }
                }
            });
        Self {
            kind,
            precision,
            lines,
            in_features,
            depth,
            out_features,
        }
    }

    /// `w` (`(out_features, in_features)`, row-major f32) quantized to 8-bit blocks.
    pub(crate) fn quantize(
        w: &[f32],
        out_features: usize,
        in_features: usize,
        precision: Precision,
    ) -> Self {
        assert_eq!(w.len(), out_features * in_features, "invariant: shape");
        Self::pack(Kind::Q8, precision, out_features, in_features, |c| {
            let mut blocks = Vec::with_capacity(in_features.div_ceil(BLOCK));
            blocks::quantize_row(&w[c * in_features..(c + 1) * in_features], &mut blocks);
            blocks
        })
    }

    pub(crate) fn out_features(&self) -> usize {
        self.out_features
    }

    fn panels(&self) -> usize {
        self.out_features.div_ceil(PANEL)
    }

    fn panel(&self, p: usize) -> &[u8] {
        let bytes = self.depth / BLOCK * self.kind.record_bytes();
        &bytemuck::cast_slice(&self.lines)[p * bytes..(p + 1) * bytes]
    }

    /// `x` `(rows, in_features)` row-major -> `(rows, out_features)` row-major.
    pub(crate) fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.forward_with(x, rows, Kernel::best())
    }

    /// [`forward`](Self::forward) through a chosen kernel; all give the same bits.
    pub(crate) fn forward_with(&self, x: &[f32], rows: usize, kernel: Kernel) -> Vec<f32> {
        let n = self.out_features;
        let quantized = Rows::quantize(x, rows, self.in_features, self.depth, self.precision);
        // Blocks of rows by blocks of panels, enough of them to keep every thread busy.
        let panels = self.panels();
        let row_blocks = rows.div_ceil(ROWS_PER_BLOCK).max(1);
        let wanted = 2 * rayon::current_num_threads();
        let panel_blocks = wanted.div_ceil(row_blocks).clamp(1, panels);
        let per_block = panels.div_ceil(panel_blocks);
        let tasks: Vec<(usize, usize)> = (0..row_blocks)
            .flat_map(|rb| (0..panels.div_ceil(per_block)).map(move |pb| (rb, pb)))
            .collect();
        let mut y = vec![0f32; rows * n];
        let out = SharedOut(y.as_mut_ptr());
        tasks.par_iter().for_each(|&(rb, pb)| {
            let first_row = rb * ROWS_PER_BLOCK;
            let last_row = ((rb + 1) * ROWS_PER_BLOCK).min(rows);
            let panels_here = pb * per_block..((pb + 1) * per_block).min(panels);
            for p in panels_here {
                let panel = self.panel(p);
                let cols = PANEL.min(n - p * PANEL);
                let mut first = first_row;
                while first < last_row {
                    let tile = (last_row - first).min(4);
                    let mut acc = [[0f32; PANEL]; 4];
                    kernel.tile(self.kind, &quantized, first, tile, panel, &mut acc);
                    for (i, acc) in acc.iter().take(tile).enumerate() {
                        // Safety: each (row, panel) pair belongs to exactly one task, so
                        // no two threads write the same outputs, and `y` outlives the loop.
                        unsafe { out.write((first + i) * n + p * PANEL, &acc[..cols]) };
                    }
                    first += tile;
                }
            }
        });
        y
    }
}

/// The output matrix, written by the tasks of [`QuantMatrix::forward_with`], each its own
/// rows and columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// Safety: the tasks write disjoint parts of the buffer (see its one use).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// # Safety
    /// `at..at + values.len()` must be inside the buffer and written by no other thread.
    unsafe fn write(self, at: usize, values: &[f32]) {
        // Safety: forwarded from the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(at), values.len());
        }
    }
}

#[cfg(test)]
mod tests;
