//! The Llama architecture, and its relatives Qwen2, Mistral and Mixtral, over ragged batches.
//!
//! See "LLaMA: Open and Efficient Foundation Language Models" (arXiv:2302.13971) and, for the
//! 3.x details (grouped-query attention, `llama3` RoPE scaling, tied embeddings), Meta's
//! model cards. The relatives differ only in data ([`ModelConfig`]): Qwen2 adds biases to the
//! q, k and v projections; Mistral v0.1 attends over a sliding window (which the attention
//! plan applies); Mixtral replaces each MLP by a sparse mixture of experts ("Mixtral of
//! Experts", arXiv:2401.04088). Weights are named after Hugging Face's checkpoints; a GGUF
//! file's names are mapped onto the same [`Part`]s by the loader.

use super::attention::Heads;
use super::fused;
use super::linear::{Linear, SourceWeight, Target};
use super::profile::{Op, Profile};
use super::rope::Rope;
use super::{BatchInputs, CausalLm, KvCache, ModelConfig, ModelError};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// One named weight of a Llama model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Embedding,
    FinalNorm,
    LmHead,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    MlpNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    /// A mixture's router: one row of scores per expert.
    Router(usize),
    /// Expert `.1` of layer `.0`.
    ExpertGate(usize, usize),
    ExpertUp(usize, usize),
    ExpertDown(usize, usize),
}

impl Part {
    pub fn hf_name(self) -> String {
        match self {
            Part::Embedding => "model.embed_tokens.weight".into(),
            Part::FinalNorm => "model.norm.weight".into(),
            Part::LmHead => "lm_head.weight".into(),
            Part::AttnNorm(l) => format!("model.layers.{l}.input_layernorm.weight"),
            Part::Q(l) => format!("model.layers.{l}.self_attn.q_proj.weight"),
            Part::K(l) => format!("model.layers.{l}.self_attn.k_proj.weight"),
            Part::V(l) => format!("model.layers.{l}.self_attn.v_proj.weight"),
            Part::O(l) => format!("model.layers.{l}.self_attn.o_proj.weight"),
            Part::MlpNorm(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            Part::Gate(l) => format!("model.layers.{l}.mlp.gate_proj.weight"),
            Part::Up(l) => format!("model.layers.{l}.mlp.up_proj.weight"),
            Part::Down(l) => format!("model.layers.{l}.mlp.down_proj.weight"),
            Part::QBias(l) => format!("model.layers.{l}.self_attn.q_proj.bias"),
            Part::KBias(l) => format!("model.layers.{l}.self_attn.k_proj.bias"),
            Part::VBias(l) => format!("model.layers.{l}.self_attn.v_proj.bias"),
            Part::Router(l) => format!("model.layers.{l}.block_sparse_moe.gate.weight"),
            // Mixtral names the expert's matrices after the paper's w1 (gate), w2 (down), w3 (up).
            Part::ExpertGate(l, e) => {
                format!("model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight")
            }
            Part::ExpertDown(l, e) => {
                format!("model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight")
            }
            Part::ExpertUp(l, e) => {
                format!("model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight")
            }
        }
    }

    pub(crate) fn gguf_name(self) -> String {
        match self {
            Part::Embedding => "token_embd.weight".into(),
            Part::FinalNorm => "output_norm.weight".into(),
            Part::LmHead => "output.weight".into(),
            Part::AttnNorm(l) => format!("blk.{l}.attn_norm.weight"),
            Part::Q(l) => format!("blk.{l}.attn_q.weight"),
            Part::K(l) => format!("blk.{l}.attn_k.weight"),
            Part::V(l) => format!("blk.{l}.attn_v.weight"),
            Part::O(l) => format!("blk.{l}.attn_output.weight"),
            Part::MlpNorm(l) => format!("blk.{l}.ffn_norm.weight"),
            Part::Gate(l) => format!("blk.{l}.ffn_gate.weight"),
            Part::Up(l) => format!("blk.{l}.ffn_up.weight"),
            Part::Down(l) => format!("blk.{l}.ffn_down.weight"),
            Part::QBias(l) => format!("blk.{l}.attn_q.bias"),
            Part::KBias(l) => format!("blk.{l}.attn_k.bias"),
            Part::VBias(l) => format!("blk.{l}.attn_v.bias"),
            Part::Router(l) => format!("blk.{l}.ffn_gate_inp.weight"),
            // One tensor per expert, as llama.cpp wrote Mixtral at first; newer files stack
            // the experts in one tensor (see [`Part::gguf_stacked`]).
            Part::ExpertGate(l, e) => format!("blk.{l}.ffn_gate.{e}.weight"),
            Part::ExpertUp(l, e) => format!("blk.{l}.ffn_up.{e}.weight"),
            Part::ExpertDown(l, e) => format!("blk.{l}.ffn_down.{e}.weight"),
        }
    }

    /// For an expert's matrix, the GGUF tensor that stacks that matrix of every expert of the
    /// layer, `(experts, out, in)`, and the expert's index in it.
    pub(crate) fn gguf_stacked(self) -> Option<(String, usize)> {
        match self {
            Part::ExpertGate(l, e) => Some((format!("blk.{l}.ffn_gate_exps.weight"), e)),
            Part::ExpertUp(l, e) => Some((format!("blk.{l}.ffn_up_exps.weight"), e)),
            Part::ExpertDown(l, e) => Some((format!("blk.{l}.ffn_down_exps.weight"), e)),
            _ => None,
        }
    }

    /// The shape the architecture expects, `(out, in)` for matrices.
    pub fn shape(self, cfg: &ModelConfig) -> Vec<usize> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        match self {
            Part::Embedding | Part::LmHead => vec![cfg.vocab_size, h],
            Part::FinalNorm | Part::AttnNorm(_) | Part::MlpNorm(_) => vec![h],
            Part::Q(_) => vec![cfg.num_heads * d, h],
            Part::K(_) | Part::V(_) => vec![cfg.num_kv_heads * d, h],
            Part::O(_) => vec![h, cfg.num_heads * d],
            Part::Gate(_) | Part::Up(_) | Part::ExpertGate(..) | Part::ExpertUp(..) => {
                vec![cfg.intermediate_size, h]
            }
            Part::Down(_) | Part::ExpertDown(..) => vec![h, cfg.intermediate_size],
            Part::QBias(_) => vec![cfg.num_heads * d],
            Part::KBias(_) | Part::VBias(_) => vec![cfg.num_kv_heads * d],
            Part::Router(_) => vec![cfg.experts.map_or(0, |e| e.count), h],
        }
    }
}

/// A checkpoint's tensors, by [`Part`]; implemented for safetensors folders and GGUF files.
pub(crate) trait WeightSource {
    /// The weight, checked against `part.shape(cfg)`.
    fn get(&mut self, part: Part, cfg: &ModelConfig) -> Result<SourceWeight, ModelError>;
    fn contains(&self, part: Part) -> bool;
}

#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    /// q, k and v projections fused: `(T, hidden) -> (T, (heads + 2 kv_heads) head_dim)`.
    qkv: Linear,
    /// q, k and v biases concatenated, `(qkv_width,)`, where the family has them.
    qkv_bias: Option<Tensor>,
    o_proj: Linear,
    mlp_norm: Tensor,
    mlp: Mlp,
}

/// A SwiGLU MLP: `down(silu(gate x) * up x)`.
#[derive(Debug)]
struct Ffn {
    /// gate and up projections fused: `(T, hidden) -> (T, 2 intermediate)`.
    gate_up: Linear,
    down: Linear,
}

#[derive(Debug)]
enum Mlp {
    Dense(Ffn),
    Experts(Mixture),
}

/// A sparse mixture of SwiGLU experts.
#[derive(Debug)]
struct Mixture {
    /// `(experts, hidden)` router weights, kept in f32 whatever the weight format (as
    /// llama.cpp keeps them): a rounding here could change which experts a token gets.
    router: Router,
    experts: Vec<Ffn>,
    per_token: usize,
}

/// A mixture's router weights where its scores are computed.
#[derive(Debug)]
enum Router {
    /// On the CPU, each expert's row, scored by [`dot`] in one fixed order: a matrix
    /// product's kernels round differently by batch size, which could change a token's
    /// experts.
    Host(Vec<Vec<f32>>),
    /// On a GPU, `(experts, hidden)`, scored by one matrix product.
    Device(Tensor),
}

/// `a . b` in eight interleaved partial sums, then the sums in order: vectorisable, and the
/// same bits whatever else is computed alongside.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

impl Ffn {
    fn forward(&self, x: &Tensor, p: Option<&Profile>) -> candle_core::Result<Tensor> {
        let gate_up = timed(p, Op::GateUpProj, || self.gate_up.forward(x))?;
        let mlp = timed(p, Op::Swiglu, || fused::swiglu(&gate_up))?;
        timed(p, Op::DownProj, || self.down.forward(&mlp))
    }
}

impl Mixture {
    /// Each token's chosen experts and their weights: the router's softmax over all
    /// experts, the `per_token` largest (the lower index first among equals), renormalised
    /// to sum to one. Returned per expert: the packed rows it serves and their weights.
    fn route(&self, x: &Tensor) -> candle_core::Result<Vec<(Vec<u32>, Vec<f32>)>> {
        let x = x.to_dtype(DType::F32)?;
        let scores: Vec<Vec<f32>> = match &self.router {
            Router::Host(w) => x
                .to_vec2::<f32>()?
                .iter()
                .map(|row| w.iter().map(|expert| dot(row, expert)).collect())
                .collect(),
            Router::Device(w) => x.matmul(&w.t()?)?.to_vec2()?,
        };
        let mut routes = vec![(Vec::new(), Vec::new()); self.experts.len()];
        let mut order: Vec<usize> = Vec::with_capacity(self.experts.len());
        for (row, s) in scores.iter().enumerate() {
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let probs: Vec<f32> = s.iter().map(|v| (v - max).exp()).collect();
            let total: f32 = probs.iter().sum();
            order.clear();
            order.extend(0..probs.len());
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let chosen = &order[..self.per_token];
            let kept: f32 = chosen.iter().map(|&e| probs[e] / total).sum();
            for &e in chosen {
                routes[e].0.push(row as u32);
                routes[e].1.push(probs[e] / total / kept);
            }
        }
        Ok(routes)
    }

    /// Every token through its experts, summed with the router's weights. Experts add their
    /// rows in expert order, so a token's result is one fixed sum whatever shares its batch.
    fn forward(&self, x: &Tensor, p: Option<&Profile>) -> candle_core::Result<Tensor> {
        let routes = timed(p, Op::Router, || self.route(x))?;
        let mut out = x.zeros_like()?;
        for (expert, (rows, weights)) in self.experts.iter().zip(routes) {
            if rows.is_empty() {
                continue;
            }
            let n = rows.len();
            let rows = Tensor::from_vec(rows, n, x.device())?;
            let inputs = timed(p, Op::Copies, || x.index_select(&rows, 0))?;
            let y = expert.forward(&inputs, p)?;
            let weights = Tensor::from_vec(weights, (n, 1), x.device())?.to_dtype(y.dtype())?;
            out = timed(p, Op::Router, || {
                out.index_add(&rows, &y.broadcast_mul(&weights)?, 0)
            })?;
        }
        Ok(out)
    }
}

#[derive(Debug)]
pub struct Llama {
    cfg: ModelConfig,
    /// `(vocab, hidden)` in the activation dtype.
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    heads: Heads,
    device: Device,
    dtype: DType,
    /// Per-operation timings, when turned on by [`Llama::enable_profiling`].
    profile: Option<Arc<Profile>>,
    /// Whether forward passes keep the thread pool's workers spinning ([`on_busy_pool`]): on
    /// the CPU, unless candle's quantized kernels run, whose own spinning pool would then
    /// compete with ours for the cores (q8_0 decoded four times slower).
    busy_pool: bool,
}

/// Runs `f`, charged to `op` when profiling.
fn timed<R>(profile: Option<&Profile>, op: Op, f: impl FnOnce() -> R) -> R {
    match profile {
        Some(p) => p.time(op, f),
        None => f(),
    }
}

impl Llama {
    /// Times every operation of every later forward pass (a few percent slower on the
    /// smallest steps); the returned profile fills as the model runs.
    pub(crate) fn enable_profiling(&mut self) -> Arc<Profile> {
        self.profile
            .get_or_insert_with(|| Arc::new(Profile::default()))
            .clone()
    }

    /// Builds the model from `source`, converting every matrix to `target` on `device`.
    pub(crate) fn load(
        cfg: ModelConfig,
        source: &mut dyn WeightSource,
        target: Target,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let dtype = match target {
            Target::Dense(dtype) => dtype,
            Target::Quantized(_) | Target::Int8 | Target::Gguf(_) | Target::Native => DType::F32,
        };
        let wrap = |e| ModelError::during("loading weights", e);
        let vector = |source: &mut dyn WeightSource, part: Part| -> Result<Tensor, ModelError> {
            match source.get(part, &cfg)? {
                SourceWeight::Dense(t) => t.to_dtype(dtype)?.to_device(device).map_err(wrap),
                SourceWeight::Quantized(q) => q.dequantize(device)?.to_dtype(dtype).map_err(wrap),
            }
        };
        let embed_f32 = match source.get(Part::Embedding, &cfg)? {
            SourceWeight::Dense(t) => t.to_dtype(DType::F32)?,
            SourceWeight::Quantized(q) => q.dequantize(&Device::Cpu)?,
        };
        let embed = embed_f32.to_dtype(dtype)?.to_device(device).map_err(wrap)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let ffn = |source: &mut dyn WeightSource,
                   gate: Part,
                   up: Part,
                   down: Part|
         -> Result<Ffn, ModelError> {
            let gate_up = vec![source.get(gate, &cfg)?, source.get(up, &cfg)?];
            let down = source.get(down, &cfg)?;
            Ok(Ffn {
                gate_up: Linear::fused(gate_up, target, device).map_err(wrap)?,
                down: Linear::fused(vec![down], target, device).map_err(wrap)?,
            })
        };
        for l in 0..cfg.num_layers {
            let mut get = |part: Part| source.get(part, &cfg);
            let qkv = vec![get(Part::Q(l))?, get(Part::K(l))?, get(Part::V(l))?];
            let o = get(Part::O(l))?;
            let qkv_bias = if cfg.attention_bias {
                let parts = [Part::QBias(l), Part::KBias(l), Part::VBias(l)]
                    .into_iter()
                    .map(|part| vector(source, part))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(Tensor::cat(&parts, 0).map_err(wrap)?)
            } else {
                None
            };
            let mlp = match cfg.experts {
                None => Mlp::Dense(ffn(source, Part::Gate(l), Part::Up(l), Part::Down(l))?),
                Some(e) => {
                    let router = match source.get(Part::Router(l), &cfg)? {
                        SourceWeight::Dense(t) => t.to_dtype(DType::F32),
                        SourceWeight::Quantized(q) => q.dequantize(&Device::Cpu),
                    }
                    .map_err(wrap)?;
                    let router = match device.is_cpu() {
                        true => Router::Host(router.to_vec2().map_err(wrap)?),
                        false => Router::Device(router.to_device(device).map_err(wrap)?),
                    };
                    let experts = (0..e.count)
                        .map(|x| {
                            let parts = (
                                Part::ExpertGate(l, x),
                                Part::ExpertUp(l, x),
                                Part::ExpertDown(l, x),
                            );
                            ffn(source, parts.0, parts.1, parts.2)
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Mlp::Experts(Mixture {
                        router,
                        experts,
                        per_token: e.per_token,
                    })
                }
            };
            layers.push(Layer {
                attn_norm: vector(source, Part::AttnNorm(l))?,
                qkv: Linear::fused(qkv, target, device).map_err(wrap)?,
                qkv_bias,
                o_proj: Linear::fused(vec![o], target, device).map_err(wrap)?,
                mlp_norm: vector(source, Part::MlpNorm(l))?,
                mlp,
            });
        }
        let final_norm = vector(source, Part::FinalNorm)?;
        let lm_head = if !cfg.tie_word_embeddings && source.contains(Part::LmHead) {
            source.get(Part::LmHead, &cfg)?
        } else if matches!(target, Target::Gguf(_)) {
            // Tied to the embedding: its blocks as stored, read again rather than rounded
            // from the f32 the lookup table holds.
            source.get(Part::Embedding, &cfg)?
        } else {
            SourceWeight::Dense(embed_f32)
        };
        let lm_head = Linear::fused(vec![lm_head], target, device).map_err(wrap)?;
        let busy_pool = device.is_cpu()
            && !layers
                .iter()
                .flat_map(|l| {
                    let ffns: Vec<&Ffn> = match &l.mlp {
                        Mlp::Dense(f) => vec![f],
                        Mlp::Experts(m) => m.experts.iter().collect(),
                    };
                    [&l.qkv, &l.o_proj]
                        .into_iter()
                        .chain(ffns.into_iter().flat_map(|f| [&f.gate_up, &f.down]))
                })
                .chain([&lm_head])
                .any(Linear::runs_candle_quantized);
        Ok(Self {
            busy_pool,
            heads: Heads {
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
            },
            rope: Rope::new(&cfg),
            cfg,
            embed,
            layers,
            final_norm,
            lm_head,
            device: device.clone(),
            dtype,
            profile: None,
        })
    }

    fn forward_inner(&self, batch: &BatchInputs, kv: &mut KvCache) -> candle_core::Result<Tensor> {
        let cfg = &self.cfg;
        let (h, kvh, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let (hidden, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let eps = cfg.rms_norm_eps as f32;
        let t = batch.num_tokens();
        let p = self.profile.as_deref();
        // Multiply-adds of one row through each projection, for the profile's rates.
        let macs = |op: Op, rows: usize, per_row: usize| {
            if let Some(p) = p {
                p.add_macs(op, (rows * per_row) as u64);
            }
        };
        let (cos, sin) = timed(p, Op::Rope, || {
            self.rope.tables(&batch.positions, self.dtype, &self.device)
        })?;
        // (T, hidden)
        let mut x = timed(p, Op::Embedding, || {
            self.embed.index_select(&batch.token_ids, 0)
        })?;
        let mut normed = timed(p, Op::Norms, || {
            fused::rms_norm(&x, &self.layers[0].attn_norm, eps)
        })?;
        for (l, layer) in self.layers.iter().enumerate() {
            // (T, (h + 2 kvh) d)
            let mut qkv = timed(p, Op::QkvProj, || layer.qkv.forward(&normed))?;
            if let Some(bias) = &layer.qkv_bias {
                qkv = timed(p, Op::QkvProj, || qkv.broadcast_add(bias))?;
            }
            macs(Op::QkvProj, t, hidden * (h + 2 * kvh) * d);
            // q and k rotate together: (T, h + kvh, d)
            let qk = timed(p, Op::Copies, || {
                qkv.narrow(1, 0, (h + kvh) * d)?
                    .contiguous()?
                    .reshape((t, h + kvh, d))
            })?;
            let qk = timed(p, Op::Rope, || self.rope.apply(&qk, &cos, &sin))?;
            let (q, k, v) = timed(p, Op::Copies, || -> candle_core::Result<_> {
                Ok((
                    qk.narrow(1, 0, h)?.contiguous()?,
                    qk.narrow(1, h, kvh)?.contiguous()?.reshape((t, kvh * d))?,
                    qkv.narrow(1, (h + kvh) * d, kvh * d)?.contiguous()?,
                ))
            })?;
            timed(p, Op::KvWrite, || kv.write(l, &k, &v, &batch.slots))?;
            let (k_cache, v_cache) = kv.layer(l);
            // (T, h d)
            let attn = timed(p, Op::Attention, || {
                batch.attend(&q, k_cache, v_cache, self.heads)
            })?;
            let o = timed(p, Op::OProj, || layer.o_proj.forward(&attn))?;
            macs(Op::OProj, t, h * d * hidden);
            (x, normed) = timed(p, Op::Residual, || {
                fused::add_rms_norm(&x, &o, &layer.mlp_norm, eps)
            })?;
            let down = match &layer.mlp {
                Mlp::Dense(ffn) => ffn.forward(&normed, p)?,
                Mlp::Experts(mixture) => mixture.forward(&normed, p)?,
            };
            let per_token = cfg.experts.map_or(1, |e| e.per_token);
            macs(Op::GateUpProj, t * per_token, hidden * 2 * inter);
            macs(Op::DownProj, t * per_token, inter * hidden);
            // The next layer's input norm, or the final norm after the last layer.
            let next_norm = self
                .layers
                .get(l + 1)
                .map_or(&self.final_norm, |next| &next.attn_norm);
            (x, normed) = timed(p, Op::Residual, || {
                fused::add_rms_norm(&x, &down, next_norm, eps)
            })?;
        }
        if batch.num_logit_rows() == 0 {
            return Tensor::zeros((0, cfg.vocab_size), DType::F32, &self.device);
        }
        // Only the rows that sample a next token pay for the vocabulary projection.
        let last = normed.index_select(&batch.logit_rows, 0)?;
        let logits = timed(p, Op::LmHead, || self.lm_head.forward(&last))?;
        macs(Op::LmHead, batch.num_logit_rows(), hidden * cfg.vocab_size);
        logits.to_dtype(DType::F32)
    }
}

/// Runs `f` (a CPU forward pass) on a worker of the thread pool while the other workers spin,
/// taking its parallel work the moment it appears.
///
/// A pass makes a few hundred parallel operations, each a few to a few hundred microseconds
/// long. Called from outside the pool, each would be injected and the caller put to sleep
/// until done; inside, idle workers still fall asleep between operations and each operation
/// pays to wake one (a futex wake and, on a virtual machine, an interrupt to another core).
/// Both together halved the speed of a single stream on two cores. The spinning workers run
/// [`rayon::yield_now`], which executes whatever work they can take, so nothing waits on them.
pub(crate) fn on_busy_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Stops the spinners however `f` ends, a panic included, so that the scope can close.
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let done = &AtomicBool::new(false);
    rayon::scope(|scope| {
        let home = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            scope.spawn(move |_| {
                // The pass's own thread may pick a spinner up while it waits for stolen work;
                // spinning there would wait on itself.
                if rayon::current_thread_index() == home {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        let _done = Done(done);
        f()
    })
}

impl CausalLm for Llama {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn forward(&self, batch: &BatchInputs, kv: &mut KvCache) -> Result<Tensor, ModelError> {
        let start = std::time::Instant::now();
        let logits = if self.busy_pool && rayon::current_thread_index().is_none() {
            on_busy_pool(|| self.forward_inner(batch, kv))
        } else {
            self.forward_inner(batch, kv)
        }
        .map_err(|e| ModelError::during("running a forward pass", e))?;
        if let Some(p) = &self.profile {
            p.forward_done(start.elapsed(), batch.num_tokens());
        }
        Ok(logits)
    }

    fn profile(&self) -> Option<&Profile> {
        self.profile.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::on_busy_pool;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Runs `f` on its own thread and fails, rather than hanging the suite, if it takes long.
    fn within_a_minute<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(60))
            .expect("on_busy_pool did not return: a spinner kept the scope open")
    }

    /// The pass runs on the pool, its parallel work is done by every worker, and its result
    /// comes back; many passes in a row leave no spinner behind.
    #[test]
    fn a_pass_on_the_busy_pool_returns_its_result() {
        let sums = within_a_minute(|| {
            (0..200)
                .map(|i: u64| {
                    on_busy_pool(|| {
                        use rayon::prelude::*;
                        assert!(rayon::current_thread_index().is_some());
                        (0..10_000u64).into_par_iter().map(|v| v * i).sum::<u64>()
                    })
                })
                .sum::<u64>()
        });
        assert_eq!(sums, (0..200u64).sum::<u64>() * (0..10_000u64).sum::<u64>());
    }

    /// A pass that fails by panicking stops the spinners too: the panic reaches the caller
    /// instead of the process hanging.
    #[test]
    fn a_panicking_pass_stops_the_spinners() {
        let caught = within_a_minute(|| {
            std::panic::catch_unwind(|| on_busy_pool(|| panic!("a kernel invariant broke")))
        });
        assert!(caught.is_err());
    }

    /// Pools of one thread (`--threads 1`: no one to spin), two and three threads (a spinner
    /// may land on the pass's own thread, or inside another spinner) all finish the pass.
    #[test]
    fn every_pool_size_finishes_the_pass() {
        for threads in 1..=3 {
            let value = within_a_minute(move || {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                pool.install(|| {
                    (0..50)
                        .map(|_| {
                            on_busy_pool(|| {
                                use rayon::prelude::*;
                                (0..1000u64).into_par_iter().sum::<u64>()
                            })
                        })
                        .sum::<u64>()
                })
            });
            assert_eq!(value, 50 * (0..1000u64).sum::<u64>(), "{threads} threads");
        }
    }
}
