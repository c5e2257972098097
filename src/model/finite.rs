//! Weights that are not finite numbers, found as each tensor is read.
//!
//! A NaN in one norm weight made every logit NaN, and once the weights were quantized to int8
//! it gave plausible-looking text instead; an infinity does the same. Each tensor is checked
//! once, as the file holds it (one pass over its values, split across the thread pool), so
//! that the damaged tensor is named at load and not guessed at from the replies.

use super::ModelError;
use super::error::candle_cause;
use candle_core::quantized::{QStorage, QTensor};
use candle_core::{DType, Device, Storage, Tensor, WithDType};
use rayon::prelude::*;
use std::borrow::Cow;
use std::path::Path;

/// The values of one tensor that are not finite.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NonFinite {
    pub nan: usize,
    pub infinite: usize,
}

impl NonFinite {
    fn add(self, other: Self) -> Self {
        Self {
            nan: self.nan + other.nan,
            infinite: self.infinite + other.infinite,
        }
    }

    fn is_none(&self) -> bool {
        self.nan == 0 && self.infinite == 0
    }

    /// `3 NaN and 1 infinite`, `1 NaN`, `2 infinite`.
    fn describe(&self) -> String {
        match (self.nan, self.infinite) {
            (n, 0) => format!("{n} NaN"),
            (0, i) => format!("{i} infinite"),
            (n, i) => format!("{n} NaN and {i} infinite"),
        }
    }
}

/// Values per task of the thread pool: large enough that a task outweighs its hand-off.
const CHUNK: usize = 1 << 16;

fn count<T: Copy + Send + Sync>(values: &[T], is: impl Fn(T) -> (bool, bool) + Sync) -> NonFinite {
    values
        .par_chunks(CHUNK)
        .map(|chunk| {
            chunk.iter().fold(NonFinite::default(), |acc, &v| {
                let (nan, infinite) = is(v);
                NonFinite {
                    nan: acc.nan + nan as usize,
                    infinite: acc.infinite + infinite as usize,
                }
            })
        })
        .reduce(NonFinite::default, NonFinite::add)
}

fn in_slice<T: WithDType>(
    t: &Tensor,
    is: impl Fn(T) -> (bool, bool) + Sync,
) -> candle_core::Result<NonFinite> {
    let t = t.to_device(&Device::Cpu)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(cpu), Some((lo, hi))) => Ok(count(&cpu.as_slice::<T>()?[lo..hi], is)),
        _ => candle_core::bail!("invariant: a contiguous tensor on the host"),
    }
}

/// The non-finite values of a dense tensor (integer tensors have none).
pub(crate) fn in_dense(t: &Tensor) -> candle_core::Result<NonFinite> {
    match t.dtype() {
        DType::F32 => in_slice::<f32>(t, |v| (v.is_nan(), v.is_infinite())),
        DType::F64 => in_slice::<f64>(t, |v| (v.is_nan(), v.is_infinite())),
        DType::F16 => in_slice::<half::f16>(t, |v| (v.is_nan(), v.is_infinite())),
        DType::BF16 => in_slice::<half::bf16>(t, |v| (v.is_nan(), v.is_infinite())),
        _ => Ok(NonFinite::default()),
    }
}

/// The non-finite values of a quantized tensor: its blocks dequantized a chunk at a time, in
/// parallel (a block's values are finite unless its scales are not).
pub(crate) fn in_quantized(q: &QTensor) -> candle_core::Result<NonFinite> {
    let dtype = q.dtype();
    let data = q.data()?;
    let (block_bytes, block_values) = (dtype.type_size(), dtype.block_size());
    let chunk_bytes = (CHUNK / block_values).max(1) * block_bytes;
    data.par_chunks(chunk_bytes)
        .map(|chunk| {
            let values = chunk.len() / block_bytes * block_values;
            let storage = QStorage::from_data(Cow::Borrowed(chunk), &Device::Cpu, dtype)?;
            let dense = QTensor::new(storage, (values,))?.dequantize(&Device::Cpu)?;
            in_dense(&dense)
        })
        .try_reduce(NonFinite::default, |a, b| Ok(a.add(b)))
}

/// Refuses tensor `name` of the file `path` when `found` holds a non-finite value.
fn refuse(path: &Path, name: &str, found: NonFinite, total: usize) -> Result<(), ModelError> {
    if found.is_none() {
        return Ok(());
    }
    Err(ModelError::NonFiniteWeights {
        path: path.to_path_buf(),
        name: name.to_string(),
        found: found.describe(),
        total,
    })
}

/// Checks dense tensor `name` of `path` (see [`in_dense`]).
pub(crate) fn check_dense(path: &Path, name: &str, t: &Tensor) -> Result<(), ModelError> {
    let found = in_dense(t)
        .map_err(|e| ModelError::corrupt(path, format!("tensor `{name}`: {}", candle_cause(&e))))?;
    refuse(path, name, found, t.elem_count())
}

/// Checks quantized tensor `name` of `path` (see [`in_quantized`]).
pub(crate) fn check_quantized(path: &Path, name: &str, q: &QTensor) -> Result<(), ModelError> {
    let found = in_quantized(q)
        .map_err(|e| ModelError::corrupt(path, format!("tensor `{name}`: {}", candle_cause(&e))))?;
    refuse(path, name, found, q.shape().elem_count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    #[test]
    fn every_float_type_counts_nan_and_infinity_apart() {
        let mut values = vec![0.5f32; 3 * CHUNK + 7];
        values[5] = f32::NAN;
        values[CHUNK + 1] = f32::INFINITY;
        values[3 * CHUNK + 6] = f32::NEG_INFINITY;
        let t = Tensor::from_vec(values, (3 * CHUNK + 7,), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let found = in_dense(&t.to_dtype(dtype).unwrap()).unwrap();
            assert_eq!(
                found,
                NonFinite {
                    nan: 1,
                    infinite: 2
                },
                "{dtype:?}"
            );
        }
        let clean = Tensor::ones((4, 8), DType::BF16, &Device::Cpu).unwrap();
        assert!(in_dense(&clean).unwrap().is_none());
    }

    // The packaged SmolLM2 (Q4_1 matrices, f32 vectors), read and checked tensor by tensor as
    // the loader does: every value is finite, and the check's cost, printed beside the
    // reading's, is what the book's Models chapter (docs/src/models.md) states.
    #[test]
    fn smollm2s_tensors_are_all_finite_and_checked_at_a_small_cost() {
        use candle_core::quantized::gguf_file::Content;
        let Ok(path) =
            crate::assets::ensure_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
        else {
            eprintln!("SKIPPED: SmolLM2 is not in the cache (scripts/fetch-models)");
            return;
        };
        let mut reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
        let content = Content::read(&mut reader).unwrap();
        let (mut reading, mut checking, mut values) = (0.0, 0.0, 0);
        for name in content.tensor_infos.keys() {
            let started = std::time::Instant::now();
            let q = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
            reading += started.elapsed().as_secs_f64();
            let started = std::time::Instant::now();
            assert!(in_quantized(&q).unwrap().is_none(), "{name}");
            checking += started.elapsed().as_secs_f64();
            values += q.shape().elem_count();
        }
        eprintln!(
            "SmolLM2: {values} values in {} tensors read in {reading:.3} s, checked in {checking:.3} s",
            content.tensor_infos.len()
        );
    }

    #[test]
    fn a_quantized_block_with_a_nan_scale_is_found() {
        // Q8_0 blocks: an f16 scale, then 32 signed bytes; the value is scale x byte.
        let block = |scale: half::f16| {
            let mut b = scale.to_le_bytes().to_vec();
            b.extend([3u8; 32]);
            b
        };
        let q = |blocks: Vec<Vec<u8>>| {
            let n = blocks.len();
            let bytes: Vec<u8> = blocks.concat();
            let storage =
                QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, GgmlDType::Q8_0).unwrap();
            QTensor::new(storage, (n, 32)).unwrap()
        };
        let fine = half::f16::from_f32(0.01);
        assert!(in_quantized(&q(vec![block(fine); 4])).unwrap().is_none());
        let damaged = q(vec![block(fine), block(half::f16::NAN), block(fine)]);
        assert_eq!(
            in_quantized(&damaged).unwrap(),
            NonFinite {
                nan: 32,
                infinite: 0
            }
        );
        let err = check_quantized(Path::new("m.gguf"), "blk.0.attn_q.weight", &damaged)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`blk.0.attn_q.weight`")
                && err.contains("m.gguf")
                && err.contains("32 NaN"),
            "{err}"
        );
    }
}
