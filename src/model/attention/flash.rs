//! Paged FlashAttention: candle-flash-attn's `flash_attn_varlen_paged_windowed` (FlashAttention-2
//! over a paged KV cache, ragged batches and grouped-query attention) as the attention of
//! prefill chunks and decodes on CUDA.
//!
//! The kernel reads keys and values in place through a block table, so a step never gathers a
//! sequence's context nor writes a `(batch, heads, queries, context)` score matrix. Its inputs
//! are computed on the host by [`FlashInputs::new`], a plain function of the step's spans, so
//! that the CPU tests can check them against the batch the CPU kernel sees.

#[cfg(any(test, feature = "flash-attn"))]
use super::SeqSpan;

/// What the paged varlen kernel needs to know about a step's batch, in host memory.
///
/// Sequence `b` of the batch (in packed order) has its queries at packed rows
/// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and sees `cu_seqlens_k[b + 1] - cu_seqlens_k[b]` keys:
/// its whole context, cached tokens and the new ones. The kernel aligns the causal mask to the
/// bottom right, so query `i` of a chunk of `q` queries over `k` keys sees keys `0..=i + k - q`,
/// which is position `start + i` and everything before it.
#[cfg(any(test, feature = "flash-attn"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlashInputs {
    /// `(batch + 1,)` cumulative query counts.
    pub cu_seqlens_q: Vec<u32>,
    /// `(batch + 1,)` cumulative context lengths.
    pub cu_seqlens_k: Vec<u32>,
    /// `(batch, max_blocks)` row-major: the blocks holding each sequence's positions
    /// `0, block_size, 2 block_size, ...`, padded with block 0. The kernel never reads past a
    /// sequence's context length, so padding is never dereferenced.
    pub block_table: Vec<u32>,
    pub max_blocks: usize,
    /// Most queries of one sequence.
    pub max_seqlen_q: usize,
    /// Longest context; the kernel sizes its key loop from it, so it must bound every one.
    pub max_seqlen_k: usize,
}

#[cfg(any(test, feature = "flash-attn"))]
impl FlashInputs {
    /// `spans` are in packed order, each starting where the previous ended (as
    /// [`crate::model::BatchInputs`] builds them).
    pub fn new(spans: &[SeqSpan], block_size: usize) -> Self {
        let blocks_of = |s: &SeqSpan| s.context_len().div_ceil(block_size);
        let max_blocks = spans.iter().map(blocks_of).max().unwrap_or(0).max(1);
        let mut cu_seqlens_q = Vec::with_capacity(spans.len() + 1);
        let mut cu_seqlens_k = Vec::with_capacity(spans.len() + 1);
        let mut block_table = Vec::with_capacity(spans.len() * max_blocks);
        let (mut q, mut k) = (0u32, 0u32);
        cu_seqlens_q.push(0);
        cu_seqlens_k.push(0);
        for span in spans {
            debug_assert_eq!(span.q_start, q as usize, "spans are packed in order");
            q += span.q_len as u32;
            k += span.context_len() as u32;
            cu_seqlens_q.push(q);
            cu_seqlens_k.push(k);
            let used = blocks_of(span);
            block_table.extend_from_slice(&span.blocks[..used]);
            block_table.extend(std::iter::repeat_n(0, max_blocks - used));
        }
        Self {
            cu_seqlens_q,
            cu_seqlens_k,
            block_table,
            max_blocks,
            max_seqlen_q: spans.iter().map(|s| s.q_len).max().unwrap_or(0),
            max_seqlen_k: spans.iter().map(|s| s.context_len()).max().unwrap_or(0),
        }
    }

    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len() - 1
    }
}

#[cfg(feature = "flash-attn")]
pub(crate) use device::FlashPlan;

#[cfg(feature = "flash-attn")]
mod device {
    use super::super::Heads;
    use super::FlashInputs;
    use candle_core::{Device, Tensor};

    /// [`FlashInputs`] on the device, built once per step and shared by every layer.
    #[derive(Debug)]
    pub(crate) struct FlashPlan {
        /// `(batch + 1,)` u32.
        cu_seqlens_q: Tensor,
        /// `(batch + 1,)` u32.
        cu_seqlens_k: Tensor,
        /// `(batch, max_blocks)` u32.
        block_table: Tensor,
        max_seqlen_q: usize,
        max_seqlen_k: usize,
        block_size: usize,
    }

    impl FlashPlan {
        pub fn new(
            inputs: &FlashInputs,
            block_size: usize,
            device: &Device,
        ) -> candle_core::Result<Self> {
            let batch = inputs.batch();
            Ok(Self {
                cu_seqlens_q: Tensor::from_slice(&inputs.cu_seqlens_q, batch + 1, device)?,
                cu_seqlens_k: Tensor::from_slice(&inputs.cu_seqlens_k, batch + 1, device)?,
                block_table: Tensor::from_slice(
                    &inputs.block_table,
                    (batch, inputs.max_blocks),
                    device,
                )?,
                max_seqlen_q: inputs.max_seqlen_q,
                max_seqlen_k: inputs.max_seqlen_k,
                block_size,
            })
        }

        /// `q` `(T, heads, head_dim)`, caches `(num_blocks, block_size, kv_heads, head_dim)`;
        /// returns `(T, heads * head_dim)`.
        pub fn attend(
            &self,
            q: &Tensor,
            k_cache: &Tensor,
            v_cache: &Tensor,
            heads: Heads,
        ) -> candle_core::Result<Tensor> {
            let (t, h, d) = q.dims3()?;
            // Causal: no left window, right window 0 (candle-flash-attn's convention).
            let out = candle_flash_attn::flash_attn_varlen_paged_windowed(
                &q.contiguous()?,
                k_cache,
                v_cache,
                &self.cu_seqlens_q,
                &self.cu_seqlens_k,
                &self.block_table,
                None,
                self.max_seqlen_q,
                self.max_seqlen_k,
                heads.scale(),
                None,
                Some(0),
                self.block_size,
                None,
            )?;
            out.reshape((t, h * d))
        }
    }
}

// The integration tests' device helper, by path: test fixtures stay out of the library.
#[cfg(all(test, feature = "flash-attn"))]
#[path = "../../../tests/common/cuda.rs"]
mod cuda;

#[cfg(test)]
mod tests {
    use super::super::{Heads, paged_cpu};
    use super::*;
    use candle_core::{Device, Tensor};
    use rand::{Rng, SeedableRng};

    /// Attention as the paged varlen kernel defines it, read only through [`FlashInputs`]:
    /// sequence `b`'s query `i` sees keys `0..=i + k_len - q_len`, key `j` lives in block
    /// `block_table[b][j / block_size]` at offset `j % block_size`. Returns `(T, heads * d)`.
    fn kernel_contract(
        inputs: &FlashInputs,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        block_size: usize,
        heads: Heads,
    ) -> Vec<f32> {
        let (h, kvh, d) = (heads.num_heads, heads.num_kv_heads, heads.head_dim);
        let total_q = *inputs.cu_seqlens_q.last().unwrap() as usize;
        let mut out = vec![0f32; total_q * h * d];
        for b in 0..inputs.batch() {
            let q0 = inputs.cu_seqlens_q[b] as usize;
            let q_len = inputs.cu_seqlens_q[b + 1] as usize - q0;
            let k_len = (inputs.cu_seqlens_k[b + 1] - inputs.cu_seqlens_k[b]) as usize;
            assert!(q_len <= inputs.max_seqlen_q && k_len <= inputs.max_seqlen_k);
            let table = &inputs.block_table[b * inputs.max_blocks..(b + 1) * inputs.max_blocks];
            let slot = |j: usize| table[j / block_size] as usize * block_size + j % block_size;
            for i in 0..q_len {
                for head in 0..h {
                    let kv_head = head / (h / kvh);
                    let qv = &q[((q0 + i) * h + head) * d..][..d];
                    let visible = i + k_len - q_len + 1;
                    let scores: Vec<f32> = (0..visible)
                        .map(|j| {
                            let key = &k[(slot(j) * kvh + kv_head) * d..][..d];
                            qv.iter().zip(key).map(|(a, b)| a * b).sum::<f32>() * heads.scale()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                    let norm: f32 = weights.iter().sum();
                    let o = &mut out[((q0 + i) * h + head) * d..][..d];
                    for (j, w) in weights.iter().enumerate() {
                        let value = &v[(slot(j) * kvh + kv_head) * d..][..d];
                        for (o, x) in o.iter_mut().zip(value) {
                            *o += w / norm * x;
                        }
                    }
                }
            }
        }
        out
    }

    /// A ragged batch as the engine builds one: prefill chunks and decodes of lengths 1, 15,
    /// 16, 17, 33 and 100 (around block boundaries), chunks that start mid-sequence, and
    /// sequences whose first blocks are shared (a common prefix in the prefix cache).
    fn batch(block_size: usize) -> (Vec<SeqSpan>, usize) {
        // (cached tokens, new tokens, shares the prefix blocks)
        let shapes = [
            (0, 1, false),
            (0, 15, false),
            (0, 16, false),
            (0, 17, false),
            (0, 33, false),
            (0, 100, false),
            (14, 1, false),
            (15, 1, false),
            (16, 1, false),
            (32, 1, true),
            (99, 1, true),
            (40, 17, true),
            (64, 33, true),
            (33, 100, true),
        ];
        let prefix_blocks = 2;
        let mut next_block = prefix_blocks as u32;
        let mut spans = Vec::new();
        let mut q_start = 0;
        for (start, q_len, shared) in shapes {
            let ctx: usize = start + q_len;
            let n = ctx.div_ceil(block_size);
            let blocks: Vec<u32> = (0..n)
                .map(|i| {
                    if shared && i < prefix_blocks {
                        i as u32
                    } else {
                        next_block += 1;
                        next_block - 1
                    }
                })
                .collect();
            spans.push(SeqSpan {
                q_start,
                q_len,
                start,
                blocks,
            });
            q_start += q_len;
        }
        (spans, next_block as usize)
    }

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    #[test]
    fn flash_inputs_describe_the_batch_the_cpu_kernel_sees() {
        for block_size in [16, 32] {
            let (spans, num_blocks) = batch(block_size);
            let inputs = FlashInputs::new(&spans, block_size);

            // Structure: one entry per sequence, cumulative, tables padded with a real block.
            assert_eq!(inputs.batch(), spans.len());
            for (b, span) in spans.iter().enumerate() {
                assert_eq!(inputs.cu_seqlens_q[b] as usize, span.q_start);
                let q_len = inputs.cu_seqlens_q[b + 1] - inputs.cu_seqlens_q[b];
                let k_len = inputs.cu_seqlens_k[b + 1] - inputs.cu_seqlens_k[b];
                assert_eq!(q_len as usize, span.q_len);
                assert_eq!(k_len as usize, span.start + span.q_len);
                let row = &inputs.block_table[b * inputs.max_blocks..][..inputs.max_blocks];
                let used = span.context_len().div_ceil(block_size);
                assert_eq!(&row[..used], &span.blocks[..used]);
                assert!(row[used..].iter().all(|&x| x == 0));
            }
            assert_eq!(inputs.max_seqlen_q, 100);
            assert_eq!(inputs.max_seqlen_k, 133);
            assert_eq!(inputs.max_blocks, 133usize.div_ceil(block_size));
            assert!(
                inputs
                    .block_table
                    .iter()
                    .all(|&x| (x as usize) < num_blocks)
            );

            // Semantics: attention computed through the inputs alone, as the kernel reads
            // them, equals the CPU kernel's on the same cache.
            let heads = Heads {
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: 16,
            };
            let (h, kvh, d) = (heads.num_heads, heads.num_kv_heads, heads.head_dim);
            let t = spans.iter().map(|s| s.q_len).sum::<usize>();
            let slots = num_blocks * block_size;
            let (q, k, v) = (
                random(t * h * d, 1),
                random(slots * kvh * d, 2),
                random(slots * kvh * d, 3),
            );
            let contract = kernel_contract(&inputs, &q, &k, &v, block_size, heads);
            let cpu = paged_cpu(
                &Tensor::from_vec(q, (t, h, d), &Device::Cpu).unwrap(),
                &Tensor::from_vec(k, (slots, kvh * d), &Device::Cpu).unwrap(),
                &Tensor::from_vec(v, (slots, kvh * d), &Device::Cpu).unwrap(),
                &spans,
                block_size,
                heads,
                None,
            )
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
            let diff = contract
                .iter()
                .zip(&cpu)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                diff < 1e-5,
                "block size {block_size}: max difference {diff}"
            );
        }
    }

    /// On a GPU: the paged kernel over the batch above equals the gathered path, within bf16
    /// rounding, for both head sizes the build has and blocks of 32 and 64.
    #[test]
    #[cfg(feature = "flash-attn")]
    fn paged_flash_attention_matches_the_gathered_path_on_cuda() {
        use super::super::{GatherPlan, as_rows};
        use candle_core::DType;
        let Some(device) = super::cuda::cuda_device_or_skip() else {
            return;
        };
        for (block_size, head_dim) in [(32, 64), (32, 128), (64, 128)] {
            let (spans, num_blocks) = batch(block_size);
            let heads = Heads {
                num_heads: 8,
                num_kv_heads: 2,
                head_dim,
            };
            let (h, kvh, d) = (heads.num_heads, heads.num_kv_heads, heads.head_dim);
            let t = spans.iter().map(|s| s.q_len).sum::<usize>();
            let bf16 = |data: Vec<f32>, shape: &[usize]| {
                Tensor::from_vec(data, shape, &device)
                    .unwrap()
                    .to_dtype(DType::BF16)
                    .unwrap()
            };
            let q = bf16(random(t * h * d, 1), &[t, h, d]);
            let shape = [num_blocks, block_size, kvh, d];
            let k = bf16(random(shape.iter().product(), 2), &shape);
            let v = bf16(random(shape.iter().product(), 3), &shape);
            let flash = FlashPlan::new(&FlashInputs::new(&spans, block_size), block_size, &device)
                .unwrap()
                .attend(&q, &k, &v, heads)
                .unwrap();
            let gathered = GatherPlan::new(&spans, block_size, None, &device)
                .unwrap()
                .attend(&q, &as_rows(&k).unwrap(), &as_rows(&v).unwrap(), heads)
                .unwrap();
            let diff = (flash.to_dtype(DType::F32).unwrap()
                - gathered.to_dtype(DType::F32).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
            // Outputs are averages of values in [-1, 1]: bf16 keeps them to about 2^-8.
            assert!(
                diff < 2e-2,
                "blocks of {block_size}, head size {head_dim}: max difference {diff}"
            );
        }
    }
}
