//! Linear layers and the choice of weight format.
//!
//! A GGUF file may store weights in types that a device runs slowly (candle has no x86 SIMD
//! kernel for Q4_1, so it decodes 4x slower than Q8_0). The loader therefore converts every
//! weight once, at load, to the format the device runs fastest; `WeightFormat::Auto` encodes
//! that choice, measured by `benches/engine.rs` and `benches/peer` (see the book's Models
//! chapter, docs/src/models.md): on a CPU with a SIMD integer kernel (AVX2 or AVX-512 VNNI),
//! a GGUF file's own 4- and 8-bit blocks run as they are stored ([`quant`](super::quant)),
//! and any other weights as 8-bit blocks; fastest for a single stream and for batches alike,
//! and batch invariant by construction. A format is among `Auto`'s choices only while it
//! passes the quality gate against f32 (`throng eval`, [`crate::quality`]).

use super::ModelError;
use super::quant::{self, Precision, QuantMatrix, blocks};
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use std::borrow::Cow;

/// The format weights are converted to at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightFormat {
    /// On a CPU with a SIMD integer kernel (AVX2 or AVX-512 VNNI): a GGUF file's blocks as
    /// stored (`gguf`), other weights as `int8`; without one, f32 while the dense model fits
    /// the memory budget, else bf16; bf16 on CUDA.
    Auto,
    /// Keep whatever the file stores (GGUF quantized types run as they are).
    Native,
    F32,
    F16,
    Bf16,
    #[serde(rename = "q8_0")]
    Q8_0,
    /// 8-bit weights in blocks of 32 (quantized from the file's values), activations in two
    /// 8-bit parts per block, integer dot products (CPU).
    Int8,
    /// A GGUF file's own blocks as they are stored (Q4_0, Q4_1, Q4_K, Q8_0; other types as
    /// 8-bit blocks quantized at load), activations in two 8-bit parts per block of 32 (some
    /// 16 bits: f32's next-token distributions to a KL divergence of 1e-6), integer dot
    /// products (CPU).
    Gguf,
    /// As `gguf`, activations in 8 bits per block of 32 (as llama.cpp quantizes them): about
    /// 1.6 times `gguf`'s speed on batches on AVX2, at llama.cpp's accuracy, which changes
    /// some replies.
    Gguf8,
}

/// Dense models above this size are stored as bf16 on the CPU instead of f32 under `Auto`.
/// (q8_0 would take half of bf16's memory, but fails the quality gate: on SmolLM2 its
/// perplexity is 0.6% above f32's and its top-1 agreement 95%.)
const CPU_DENSE_LIMIT_BYTES: usize = 6 << 30;

/// What a weight becomes after conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Dense(DType),
    Quantized(GgmlDType),
    /// [`QuantMatrix`] of 8-bit blocks quantized from the file's values, 16-bit inputs: CPU
    /// only.
    Int8,
    /// [`QuantMatrix`] of the file's own blocks where the kernels take them as stored, else
    /// 8-bit blocks quantized from its values, with inputs in `Precision`: CPU only.
    Gguf(Precision),
    Native,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 9] = [
        WeightFormat::Auto,
        WeightFormat::Native,
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Bf16,
        WeightFormat::Q8_0,
        WeightFormat::Int8,
        WeightFormat::Gguf,
        WeightFormat::Gguf8,
    ];

    /// The format as configs, manifests (`weight_format`) and `--weights` spell it.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Auto => "auto",
            WeightFormat::Native => "native",
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Int8 => "int8",
            WeightFormat::Gguf => "gguf",
            WeightFormat::Gguf8 => "gguf8",
        }
    }

    /// The format spelled `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Resolves `Auto` for a model of `params` parameters on `device`, read from a GGUF
    /// file (`gguf`) or not.
    pub(crate) fn target(
        self,
        device: &Device,
        params: usize,
        gguf: bool,
    ) -> Result<Target, ModelError> {
        let cpu_only = |name: &str| {
            ModelError::InvalidRequest(format!(
                "{name} weights run on the CPU only; use `--weights auto` (bf16) or `--weights \
                 f16` on a GPU"
            ))
        };
        Ok(match self {
            WeightFormat::Auto if device.is_cpu() => {
                if !quant::has_simd_kernel() {
                    if params * 4 <= CPU_DENSE_LIMIT_BYTES {
                        Target::Dense(DType::F32)
                    } else {
                        Target::Dense(DType::BF16)
                    }
                } else if gguf {
                    Target::Gguf(Precision::Sixteen)
                } else {
                    Target::Int8
                }
            }
            WeightFormat::Auto => Target::Dense(DType::BF16),
            WeightFormat::Native => Target::Native,
            WeightFormat::F32 => Target::Dense(DType::F32),
            WeightFormat::F16 => Target::Dense(DType::F16),
            WeightFormat::Bf16 => Target::Dense(DType::BF16),
            WeightFormat::Q8_0 => Target::Quantized(GgmlDType::Q8_0),
            WeightFormat::Int8 if device.is_cpu() => Target::Int8,
            WeightFormat::Gguf if device.is_cpu() && gguf => Target::Gguf(Precision::Sixteen),
            WeightFormat::Gguf8 if device.is_cpu() && gguf => Target::Gguf(Precision::Eight),
            WeightFormat::Gguf | WeightFormat::Gguf8 if device.is_cpu() => {
                return Err(ModelError::InvalidRequest(format!(
                    "`--weights {}` keeps a GGUF file's blocks, and this model is not a GGUF \
                     file: use `--weights int8` (8-bit blocks quantized at load) or `auto`",
                    self.name()
                )));
            }
            WeightFormat::Int8 | WeightFormat::Gguf | WeightFormat::Gguf8 => {
                return Err(cpu_only(self.name()));
            }
        })
    }
}

impl Target {
    /// How a model's identity names it (`GGUF (Q4_1) -> gguf a8`): what its replies are a
    /// function of. The integer formats name their block size and input precision, so that
    /// replies of an earlier kernel (int8 in groups of 64) are not taken for theirs.
    pub(crate) fn label(self) -> String {
        match self {
            Target::Int8 => "int8 b32 a16".into(),
            Target::Gguf(Precision::Eight) => "gguf a8".into(),
            Target::Gguf(Precision::Sixteen) => "gguf a16".into(),
            other => format!("{other:?}"),
        }
    }
}

/// A weight as the file holds it, `(out_features, in_features)`.
pub(crate) enum SourceWeight {
    Dense(Tensor),
    Quantized(QTensor),
}

impl SourceWeight {
    fn dims(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            SourceWeight::Dense(t) => t.dims2(),
            SourceWeight::Quantized(q) => q.shape().dims2(),
        }
    }

    fn to_f32(&self, device: &Device) -> candle_core::Result<Tensor> {
        match self {
            SourceWeight::Dense(t) => t.to_dtype(DType::F32),
            SourceWeight::Quantized(q) => q.dequantize(device),
        }
    }
}

/// `y = x W^T` over packed tokens `(T, in) -> (T, out)`.
#[derive(Debug, Clone)]
pub(crate) enum Linear {
    /// `(out, in)` in the activation dtype.
    Dense(Tensor),
    Quantized(QMatMul),
    /// Integer blocks with activations quantized per block (CPU, f32 activations).
    Integer(std::sync::Arc<QuantMatrix>),
    /// Parts of a fused projection that could not share one matrix (GGUF files may mix
    /// quantized types, e.g. q4_k queries with q6_k values); outputs are concatenated.
    Stacked(Vec<Linear>),
}

impl Linear {
    /// Builds one layer from `parts` stacked along the output dimension (e.g. q, k and v
    /// projections fused into one matmul), converted to `target` on `device`.
    pub fn fused(
        parts: Vec<SourceWeight>,
        target: Target,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let in_features = parts[0].dims()?.1;
        match target {
            Target::Dense(dtype) => {
                let dense = parts
                    .iter()
                    .map(|p| p.to_f32(device))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Ok(Linear::Dense(
                    cat_rows(dense)?.to_dtype(dtype)?.to_device(device)?,
                ))
            }
            Target::Quantized(dtype) if in_features % dtype.block_size() != 0 => {
                // Rows this short cannot be quantized in blocks; keep them exact instead.
                Linear::fused(parts, Target::Dense(DType::F32), device)
            }
            Target::Quantized(dtype) => {
                let dense = parts
                    .iter()
                    .map(|p| p.to_f32(&Device::Cpu))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                let q = QTensor::quantize_onto(&cat_rows(dense)?, dtype, device)?;
                Ok(Linear::Quantized(QMatMul::from_qtensor(q)?))
            }
            Target::Int8 | Target::Gguf(_) if in_features > quant::MAX_IN_FEATURES => {
                // A row this long would not fit the kernels' indices; such a layer stays exact.
                Linear::fused(parts, Target::Dense(DType::F32), device)
            }
            Target::Int8 => Ok(Linear::Integer(std::sync::Arc::new(quantized(
                &parts,
                Precision::Sixteen,
            )?))),
            Target::Gguf(precision) => stored(parts, precision),
            Target::Native => native(parts, device),
        }
    }

    /// Whether candle's quantized kernels (and their own thread pool) compute this layer.
    pub(crate) fn runs_candle_quantized(&self) -> bool {
        match self {
            Linear::Quantized(_) => true,
            Linear::Stacked(parts) => parts.iter().any(Linear::runs_candle_quantized),
            Linear::Dense(_) | Linear::Integer(_) => false,
        }
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            // gemm takes a matrix-vector path for a single row, which rounds differently
            // from the matrix-matrix path every larger batch takes; running one row as two
            // keeps each row's result independent of how many rows share the call (batch
            // invariance). It costs single-stream decode about half its speed (gemm packs the
            // weights); batches, what simulations run, are unaffected.
            Linear::Dense(w) if x.dim(0)? == 1 && x.device().is_cpu() => {
                Tensor::cat(&[x, x], 0)?.matmul(&w.t()?)?.narrow(0, 0, 1)
            }
            Linear::Dense(w) => x.matmul(&w.t()?),
            Linear::Quantized(q) => q.forward(x),
            Linear::Integer(m) => {
                let rows = x.dim(0)?;
                let x = x.contiguous()?;
                let y = {
                    let (storage, layout) = x.storage_and_layout();
                    match (&*storage, layout.contiguous_offsets()) {
                        (candle_core::Storage::Cpu(cpu), Some((lo, hi))) => {
                            m.forward(&cpu.as_slice::<f32>()?[lo..hi], rows)
                        }
                        _ => candle_core::bail!("integer layers need f32 activations on the CPU"),
                    }
                };
                Tensor::from_vec(y, (rows, m.out_features()), &Device::Cpu)
            }
            Linear::Stacked(parts) => {
                let outs = parts
                    .iter()
                    .map(|p| p.forward(x))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&outs, 1)
            }
        }
    }
}

/// `parts` stacked and quantized to 8-bit blocks from their values.
fn quantized(parts: &[SourceWeight], precision: Precision) -> candle_core::Result<QuantMatrix> {
    let dense = parts
        .iter()
        .map(|p| p.to_f32(&Device::Cpu))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let w = cat_rows(dense)?;
    let (out_features, in_features) = w.dims2()?;
    let w = w.flatten_all()?.to_vec1::<f32>()?;
    Ok(QuantMatrix::quantize(
        &w,
        out_features,
        in_features,
        precision,
    ))
}

/// Keeps the file's blocks where the kernels take them as stored: parts of one kind become
/// one matrix, their rows decoded block by block (no value rounded again); parts of
/// different kinds, or of types kept as 8-bit blocks, are stacked.
fn stored(parts: Vec<SourceWeight>, precision: Precision) -> candle_core::Result<Linear> {
    let kind_of = |p: &SourceWeight| match p {
        SourceWeight::Quantized(q) => blocks::stored_kind(q.dtype()),
        SourceWeight::Dense(_) => None,
    };
    let first = kind_of(&parts[0]);
    if parts.iter().any(|p| kind_of(p) != first) {
        let singles = parts
            .into_iter()
            .map(|p| stored(vec![p], precision))
            .collect::<candle_core::Result<Vec<_>>>()?;
        return Ok(Linear::Stacked(singles));
    }
    let Some(kind) = first else {
        return Ok(Linear::Integer(std::sync::Arc::new(quantized(
            &parts, precision,
        )?)));
    };
    let in_features = parts[0].dims()?.1;
    // (dtype, bytes of one row, the rows' bytes) per part.
    let mut sources = Vec::with_capacity(parts.len());
    let mut out_features = 0;
    for part in &parts {
        let SourceWeight::Quantized(q) = part else {
            unreachable!("invariant: every part has a stored kind");
        };
        let (rows, cols) = q.shape().dims2()?;
        if cols != in_features || cols % q.dtype().block_size() != 0 {
            candle_core::bail!(
                "a weight of {rows}x{cols} is not whole blocks of {:?}",
                q.dtype()
            );
        }
        let data = q.data()?.into_owned();
        sources.push((q.dtype(), data.len() / rows.max(1), data, out_features));
        out_features += rows;
    }
    let matrix = QuantMatrix::pack(kind, precision, out_features, in_features, |c| {
        let (dtype, row, data, first) = sources
            .iter()
            .rev()
            .find(|s| s.3 <= c)
            .expect("invariant: every channel has a part");
        let at = (c - first) * row;
        let mut out = Vec::with_capacity(in_features.div_ceil(quant::BLOCK));
        blocks::decode_row(*dtype, &data[at..at + row], &mut out);
        out
    });
    Ok(Linear::Integer(std::sync::Arc::new(matrix)))
}

fn cat_rows(parts: Vec<Tensor>) -> candle_core::Result<Tensor> {
    if parts.len() == 1 {
        Ok(parts.into_iter().next().expect("invariant: one part"))
    } else {
        Tensor::cat(&parts, 0)
    }
}

/// Keeps the file's types: quantized parts of one type are joined byte for byte (rows of a
/// quantized matrix are whole blocks, so stacking rows is stacking bytes).
fn native(parts: Vec<SourceWeight>, device: &Device) -> candle_core::Result<Linear> {
    let first = match &parts[0] {
        SourceWeight::Quantized(q) => Some(q.dtype()),
        SourceWeight::Dense(_) => None,
    };
    let uniform = parts.iter().all(|p| match p {
        SourceWeight::Quantized(q) => Some(q.dtype()) == first,
        SourceWeight::Dense(_) => first.is_none(),
    });
    if !uniform {
        let singles = parts
            .into_iter()
            .map(|p| native(vec![p], device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        return Ok(Linear::Stacked(singles));
    }
    let in_features = parts[0].dims()?.1;
    let mut dense = Vec::new();
    let mut quantized = Vec::new();
    for part in parts {
        match part {
            SourceWeight::Dense(t) => dense.push(t.to_device(device)?),
            SourceWeight::Quantized(q) => quantized.push(q),
        }
    }
    match first {
        None => Ok(Linear::Dense(cat_rows(dense)?)),
        Some(_) if quantized.len() == 1 => {
            let q = quantized.pop().expect("invariant: one part");
            Ok(Linear::Quantized(QMatMul::from_qtensor(q)?))
        }
        Some(dtype) => {
            let mut rows = 0;
            let mut bytes = Vec::new();
            for q in &quantized {
                rows += q.shape().dims2()?.0;
                bytes.extend_from_slice(&q.data()?);
            }
            let storage = QStorage::from_data(Cow::Owned(bytes), device, dtype)?;
            let joined = QTensor::new(storage, (rows, in_features))?;
            Ok(Linear::Quantized(QMatMul::from_qtensor(joined)?))
        }
    }
}
