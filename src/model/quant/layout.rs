//! The packed layout every kernel reads: weights in panels of [`PANEL`] output channels, each
//! panel a run of records, one record per block of [`BLOCK`] inputs.
//!
//! A record holds the block's quants of the panel's sixteen channels in 4-byte steps (four
//! consecutive inputs of one channel per 4 bytes, channels 0-7 then 8-15 per 64-byte step,
//! which is one 512-bit vector or two 256-bit ones), then the channels' scales (and for 4-bit
//! weights their mins) as f32:
//!
//! - **4-bit** ([`Kind::Q4`]): `w = d q + m`, `q` in 0..=15. A step pair `s` is 64 bytes
//!   whose low nibbles are the inputs `8 s .. 8 s + 4` and high nibbles `8 s + 4 .. 8 s + 8`:
//!   one load and two masks give two steps of 4-byte weights. 256 bytes of quants, then
//!   `d[16]`, then `m[16]`: 384 bytes for 512 weights.
//! - **8-bit** ([`Kind::Q8`]): `w = d q`, `q` in -128..=127, stored as `q + 128` (a `u8`, the
//!   operand `vpdpbusd` multiplies unsigned). Eight 64-byte steps, then `d[16]`: 576 bytes.
//!
//! Channels past the matrix's last are zeros; so are inputs past its width.

/// Inputs per scale along a channel, and per activation scale along a row.
pub(crate) const BLOCK: usize = 32;
/// Output channels per panel.
pub(crate) const PANEL: usize = 16;
/// Channels per 256-bit vector of 32-bit lanes.
pub(crate) const HALF: usize = 8;
/// Bytes of one step (four inputs of every channel of a panel).
pub(crate) const STEP: usize = PANEL * 4;

/// How a matrix's weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// 4-bit quants with a scale and a min per channel and block (GGUF Q4_0, Q4_1, Q4_K).
    Q4,
    /// 8-bit quants with a scale per channel and block (GGUF Q8_0, or any weights quantized).
    Q8,
}

impl Kind {
    /// Bytes of quants in one record.
    pub(crate) const fn quant_bytes(self) -> usize {
        match self {
            Kind::Q4 => BLOCK / 2 * PANEL,
            Kind::Q8 => BLOCK * PANEL,
        }
    }

    /// Bytes of one record: quants, scales and (4-bit) mins.
    pub(crate) const fn record_bytes(self) -> usize {
        match self {
            Kind::Q4 => self.quant_bytes() + 2 * PANEL * 4,
            Kind::Q8 => self.quant_bytes() + PANEL * 4,
        }
    }
}

/// One block of one channel, decoded: `w[i] = d * q[i] + m` (4-bit) or `d * q[i]` (8-bit,
/// `m` zero).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Block {
    pub q: [i16; BLOCK],
    pub d: f32,
    pub m: f32,
}

impl Block {
    pub(crate) const ZERO: Block = Block {
        q: [0; BLOCK],
        d: 0.0,
        m: 0.0,
    };
}

/// Writes `block` as channel `j` (`0..PANEL`) of `record`.
pub(crate) fn put(kind: Kind, record: &mut [u8], j: usize, block: &Block) {
    let (quants, scales) = record.split_at_mut(kind.quant_bytes());
    let at = (j / HALF) * 32 + (j % HALF) * 4;
    match kind {
        Kind::Q4 => {
            for s in 0..BLOCK / 8 {
                for i in 0..4 {
                    let lo = block.q[8 * s + i] as u8 & 0x0F;
                    let hi = block.q[8 * s + 4 + i] as u8 & 0x0F;
                    quants[s * STEP + at + i] = lo | (hi << 4);
                }
            }
            scales[4 * j..4 * j + 4].copy_from_slice(&block.d.to_le_bytes());
            scales[4 * (PANEL + j)..4 * (PANEL + j) + 4].copy_from_slice(&block.m.to_le_bytes());
        }
        Kind::Q8 => {
            for t in 0..BLOCK / 4 {
                for i in 0..4 {
                    quants[t * STEP + at + i] = (block.q[4 * t + i] as i8 as u8) ^ 0x80;
                }
            }
            scales[4 * j..4 * j + 4].copy_from_slice(&block.d.to_le_bytes());
        }
    }
}

/// The quant of channel `j` at input `k` (`0..BLOCK`) of `record`, as [`put`] wrote it.
#[inline(always)]
pub(crate) fn quant(kind: Kind, record: &[u8], j: usize, k: usize) -> i32 {
    let at = (j / HALF) * 32 + (j % HALF) * 4;
    match kind {
        Kind::Q4 => {
            let byte = record[(k / 8) * STEP + at + k % 4];
            if k % 8 < 4 {
                (byte & 0x0F) as i32
            } else {
                (byte >> 4) as i32
            }
        }
        Kind::Q8 => (record[(k / 4) * STEP + at + k % 4] ^ 0x80) as i8 as i32,
    }
}

/// The scale of channel `j` in `record`.
#[inline(always)]
pub(crate) fn scale(kind: Kind, record: &[u8], j: usize) -> f32 {
    let at = kind.quant_bytes() + 4 * j;
    f32::from_le_bytes(record[at..at + 4].try_into().expect("invariant: 4 bytes"))
}

/// The min of channel `j` in a 4-bit `record`.
#[inline(always)]
pub(crate) fn min(record: &[u8], j: usize) -> f32 {
    let at = Kind::Q4.quant_bytes() + 4 * (PANEL + j);
    f32::from_le_bytes(record[at..at + 4].try_into().expect("invariant: 4 bytes"))
}
