//! Rotary position embeddings for packed tokens, each at its own position.
//!
//! Tables are built per step from the batch's positions (T x head_dim/2 values) instead of
//! precomputed for the whole context, which for Llama 3.1's 131072 positions would be 64 MB.

use super::{ModelConfig, RopeStyle};
use candle_core::{DType, Device, Tensor};

#[derive(Debug, Clone)]
pub(crate) struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Self {
        Self {
            inv_freq: cfg.inverse_frequencies(),
            style: cfg.rope.style,
        }
    }

    /// `(cos, sin)`, each `(T, 1, head_dim / 2)`, for the given positions.
    pub fn tables(
        &self,
        positions: &[u32],
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let shape = (positions.len(), 1, half);
        Ok((
            Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        ))
    }

    /// Rotates `x` `(T, heads, head_dim)`, contiguous.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let (t, heads, d) = x.dims3()?;
        match self.style {
            // (b=T, t=1, heads, d): each token is its own "batch" with its own table row.
            RopeStyle::Halves => {
                candle_nn::rotary_emb::rope_thd(&x.reshape((t, 1, heads, d))?, cos, sin)?
            }
            // (b=T, heads, t=1, d)
            RopeStyle::Interleaved => {
                candle_nn::rotary_emb::rope_i(&x.reshape((t, heads, 1, d))?, cos, sin)?
            }
        }
        .reshape((t, heads, d))
    }
}
