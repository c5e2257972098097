//! Qwen2, Mistral and Mixtral in throng's own paged, batched forward pass: each family's
//! tiny random-weight model against candle-transformers' reference implementation of it,
//! against itself in ragged batches and on a prefix-cache hit, from GGUF as from
//! safetensors, and through the engine (continuous batching, prefix cache, constrained
//! decoding) under every weight format `auto` can pick on a CPU.

mod common;

use candle_core::{DType, Device, IndexOp, Tensor};
use common::TinyLlama;
use common::ragged::{batched, max_abs_diff, solo, tokens};
use serde_json::{Value, json};
use throng::engine::{EngineConfig, Message, Request};
use throng::model::{
    AttentionBackend, BatchInputs, CausalLm, Family, KvCache, LoadOptions, SeqChunk, WeightFormat,
};

/// Logits of f32 forward passes that compute the same function in another order (fused
/// projections, paged attention) agree with the reference to about 1e-6 of their scale.
const F32_TOLERANCE: f32 = 1e-4;

/// The families' tiny models: Qwen2 (biases, tied embeddings), Mistral v0.3 (no window),
/// Mistral v0.1 (a window shorter than the test prompts), Mixtral (4 experts, top-2).
fn families() -> Vec<(&'static str, TinyLlama)> {
    vec![
        ("qwen2", TinyLlama::qwen2()),
        ("mistral v0.3", TinyLlama::mistral(None)),
        ("mistral v0.1", TinyLlama::mistral(Some(12))),
        ("mixtral", TinyLlama::mixtral(4, 2)),
    ]
}

fn load(dir: &std::path::Path, weights: WeightFormat) -> throng::model::LoadedModel {
    let (spec, opts) = common::load_options(dir.to_str().unwrap(), weights);
    throng::model::loader::load(&spec, &opts).unwrap()
}

/// candle-transformers' implementation of the family, loaded from the same folder. Its
/// sliding window lets a query see `window + 1` keys where Hugging Face's (and llama.cpp's,
/// and vLLM's) see `window`, itself included; it is given one less to mean the same.
enum Reference {
    Qwen2(candle_transformers::models::qwen2::ModelForCausalLM),
    Mistral(candle_transformers::models::mistral::Model),
    Mixtral(candle_transformers::models::mixtral::Model),
}

impl Reference {
    fn load(dir: &std::path::Path, spec: &TinyLlama) -> Self {
        use candle_transformers::models::{mistral, mixtral, qwen2};
        let mut cfg: Value = spec.config_json();
        cfg["hidden_act"] = "silu".into();
        cfg["use_flash_attn"] = false.into();
        // A window longer than any test sequence stands for none where candle needs a number.
        let window = spec.sliding_window.map_or(100_000, |w| w - 1);
        cfg["sliding_window"] = window.into();
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &Device::Cpu,
            )
            .unwrap()
        };
        match spec.family {
            Family::Qwen2 => {
                let cfg: qwen2::Config = serde_json::from_value(cfg).unwrap();
                Reference::Qwen2(qwen2::ModelForCausalLM::new(&cfg, vb).unwrap())
            }
            Family::Mistral => {
                let cfg: mistral::Config = serde_json::from_value(cfg).unwrap();
                Reference::Mistral(mistral::Model::new(&cfg, vb).unwrap())
            }
            Family::Mixtral => {
                let cfg: mixtral::Config = serde_json::from_value(cfg).unwrap();
                Reference::Mixtral(mixtral::Model::new(&cfg, vb).unwrap())
            }
            Family::Llama => unreachable!("tests/model_forward.rs covers Llama"),
        }
    }

    /// Logits after the last of `toks`, which start at position `offset`.
    fn forward(&mut self, toks: &[u32], offset: usize) -> Tensor {
        let input = Tensor::new(toks, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let out = match self {
            Reference::Qwen2(m) => m.forward(&input, offset),
            Reference::Mistral(m) => m.forward(&input, offset),
            Reference::Mixtral(m) => m.forward(&input, offset),
        };
        out.unwrap().flatten_all().unwrap()
    }
}

// Guards against a family whose forward pass computes something else than the reference
// implementation: wrong bias, RoPE base, tied head, window or expert routing.
#[test]
fn each_family_gives_candle_transformers_logits() {
    for (name, spec) in families() {
        let dir = common::tiny_model(&spec);
        let model = load(dir.path(), WeightFormat::F32).model;
        let mut reference = Reference::load(dir.path(), &spec);
        let toks = tokens(40, 1);
        // One prefill longer than Mistral v0.1's window (candle applies its window within
        // one call only, so decoding is compared below, against the gathered path).
        let ours = solo(&model, &toks[..30], 30, 16);
        let expected = reference.forward(&toks[..30], 0);
        let diff = max_abs_diff(&ours[0], &expected);
        assert!(diff < F32_TOLERANCE, "{name}: prefill differs by {diff}");
        if spec.sliding_window.is_none() {
            let ours = solo(&model, &toks, 30, 16);
            for pos in 30..toks.len() {
                let expected = reference.forward(&toks[pos..pos + 1], pos);
                let diff = max_abs_diff(&ours[pos - 29], &expected);
                assert!(
                    diff < F32_TOLERANCE,
                    "{name}: decode at {pos} differs by {diff}"
                );
            }
        }
    }
}

// Guards against a sliding window applied in prefill but not in decode, or differently by
// the paged CPU kernel and the gathered path (the one CUDA takes for windowed models).
#[test]
fn a_window_shorter_than_the_prompt_holds_in_decode_on_both_attention_paths() {
    let spec = TinyLlama::mistral(Some(12));
    let dir = common::tiny_model(&spec);
    let model = load(dir.path(), WeightFormat::F32).model;
    let seqs: Vec<Vec<u32>> = [(50, 1), (9, 2), (31, 3)]
        .iter()
        .map(|&(n, seed)| tokens(n + 8, seed))
        .collect();
    let prompts = [50, 9, 31];
    let paged = batched(&model, &seqs, &prompts, 16, 24);
    let gathered = common::ragged::batched_with(
        &model,
        &seqs,
        &prompts,
        16,
        24,
        Some(AttentionBackend::Gathered),
    );
    for (i, (p, g)) in paged.iter().zip(&gathered).enumerate() {
        for (step, (a, b)) in p.iter().zip(g).enumerate() {
            let diff = max_abs_diff(a, b);
            assert!(diff < F32_TOLERANCE, "sequence {i} step {step}: {diff}");
        }
    }
    // And the window matters: the same weights without it give other logits.
    let mut unwindowed = spec.clone();
    unwindowed.sliding_window = None;
    let dir = common::tiny_model(&unwindowed);
    let full = load(dir.path(), WeightFormat::F32).model;
    let diff = max_abs_diff(&solo(&full, &seqs[0], 50, 16)[0], &paged[0][0]);
    assert!(
        diff > 1e-3,
        "a window of 12 over 50 tokens changes the logits"
    );
}

// Guards against a family whose sequences see each other in a ragged batch (bias rows,
// expert routing mixing tokens), in f32 within rounding and, under the integer formats (what
// `auto` picks on this CPU), bit for bit.
#[test]
fn ragged_batches_give_each_sequence_its_solo_logits_in_every_family() {
    let lengths = [1usize, 15, 16, 17, 33, 70];
    let seqs: Vec<Vec<u32>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| tokens(n + 5, i as u32))
        .collect();
    for (name, spec) in families() {
        let dir = common::tiny_model(&spec);
        for weights in common::CPU_FORMATS {
            let model = load(dir.path(), weights).model;
            let got = batched(&model, &seqs, &lengths, 16, 24);
            for (i, (g, s)) in got.iter().zip(&seqs).enumerate() {
                let alone = solo(&model, s, lengths[i], 16);
                for (step, (a, b)) in g.iter().zip(&alone).enumerate() {
                    let diff = max_abs_diff(a, b);
                    let exact = weights != WeightFormat::F32 && weights != WeightFormat::Bf16;
                    let bound = if exact { 0.0 } else { F32_TOLERANCE };
                    assert!(
                        diff <= bound,
                        "{name} {weights:?}: sequence {i} step {step} differs by {diff}"
                    );
                }
            }
        }
    }
}

// Guards against a prefix-cache hit (keys and values another sequence wrote) giving other
// logits than computing the prefix afresh.
#[test]
fn a_prefix_cache_hit_gives_the_cold_start_logits_in_every_family() {
    for (name, spec) in families() {
        let dir = common::tiny_model(&spec);
        let model = load(dir.path(), WeightFormat::F32).model;
        let cfg = model.config().clone();
        let prefix = tokens(32, 9);
        let first = [prefix.clone(), tokens(7, 1)].concat();
        let second = [prefix.clone(), tokens(11, 2)].concat();
        let cold = solo(&model, &second, second.len(), 16);
        let mut kv = KvCache::new(&cfg, 8, 16, DType::F32, &Device::Cpu).unwrap();
        // The first sequence fills blocks 5 and 3 with the prefix, and 1 with its own tail.
        let first_blocks = [5u32, 3, 1];
        let batch = BatchInputs::new(
            &[SeqChunk {
                tokens: &first,
                start: 0,
                blocks: &first_blocks,
                wants_logits: true,
            }],
            &kv,
        )
        .unwrap();
        model.forward(&batch, &mut kv).unwrap();
        // The second shares the two full prefix blocks and computes only its own tail.
        let second_blocks = [5u32, 3, 6];
        let batch = BatchInputs::new(
            &[SeqChunk {
                tokens: &second[32..],
                start: 32,
                blocks: &second_blocks,
                wants_logits: true,
            }],
            &kv,
        )
        .unwrap();
        let hit = model.forward(&batch, &mut kv).unwrap().i(0).unwrap();
        let diff = max_abs_diff(&hit, &cold[0]);
        assert!(diff < F32_TOLERANCE, "{name}: differs by {diff}");
    }
}

// Guards against a family's GGUF layout (llama.cpp's names, permuted q/k rows for `llama`
// files, NeoX rotation for `qwen2`, Mixtral's experts one per tensor or stacked) read into
// other weights than the safetensors checkpoint's.
#[test]
fn each_family_from_gguf_gives_the_safetensors_logits() {
    let plain_llama = TinyLlama {
        llama3_rope_scaling: false,
        ..TinyLlama::default()
    };
    let mut all = families();
    all.push(("llama", plain_llama));
    for (name, spec) in all {
        let dir = common::tiny_model(&spec);
        let from_safetensors = load(dir.path(), WeightFormat::F32);
        let stackings: &[bool] = if spec.experts.is_some() {
            &[false, true]
        } else {
            &[false]
        };
        for &stacked in stackings {
            let gguf = dir.path().join(format!("tiny-{stacked}.gguf"));
            spec.write_gguf(&gguf, stacked).unwrap();
            let opts = LoadOptions {
                weights: WeightFormat::F32,
                tokenizer: Some(dir.path().join("tokenizer.json")),
                ..LoadOptions::default()
            };
            let from_gguf = throng::model::loader::load(gguf.to_str().unwrap(), &opts).unwrap();
            let (a, b) = (from_safetensors.model.config(), from_gguf.model.config());
            assert_eq!(
                (a.family, a.attention_bias, a.sliding_window, a.experts),
                (b.family, b.attention_bias, b.sliding_window, b.experts),
                "{name}"
            );
            let toks = tokens(45, 4);
            let x = solo(&from_safetensors.model, &toks, 30, 16);
            let y = solo(&from_gguf.model, &toks, 30, 16);
            for (step, (a, b)) in x.iter().zip(&y).enumerate() {
                let diff = max_abs_diff(a, b);
                assert!(
                    diff < F32_TOLERANCE,
                    "{name} (stacked {stacked}) step {step}: {diff}"
                );
            }
        }
    }
}

// Guards against slicing one expert out of a quantized stacked tensor at the wrong bytes:
// Mixtral in q8_0, experts stacked or one per tensor, run as stored, gives the same bits.
#[test]
fn stacked_and_separate_quantized_experts_are_the_same_weights() {
    let spec = TinyLlama::mixtral(4, 2);
    let dir = common::tiny_model(&spec);
    let logits = |stacked: bool| {
        let gguf = dir.path().join(format!("q8-{stacked}.gguf"));
        spec.write_gguf_as(&gguf, stacked, candle_core::quantized::GgmlDType::Q8_0)
            .unwrap();
        let opts = LoadOptions {
            weights: WeightFormat::Native,
            tokenizer: Some(dir.path().join("tokenizer.json")),
            ..LoadOptions::default()
        };
        let loaded = throng::model::loader::load(gguf.to_str().unwrap(), &opts).unwrap();
        assert!(loaded.weights.contains("Q8_0"), "{}", loaded.weights);
        solo(&loaded.model, &tokens(30, 5), 20, 16)
    };
    let (separate, stacked) = (logits(false), logits(true));
    for (a, b) in separate.iter().zip(&stacked) {
        assert_eq!(max_abs_diff(a, b), 0.0);
    }
}

fn requests(n: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            Request::chat(vec![
                Message::system("You are an agent in a market. Reply with your bid."),
                Message::user(format!("Agent {i}, round {}: your bid?", i % 5)),
            ])
            .with_max_tokens(16)
            .with_schema(json!({
                "type": "object",
                "properties": {"bid": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["bid"], "additionalProperties": false
            }))
        })
        .collect()
}

// Guards against a family that the engine serves differently from Llama: every constrained
// reply parses, and replies do not depend on who shares the batch or on the prefix cache,
// under every weight format `auto` can pick.
#[test]
fn the_engine_serves_every_family_with_constrained_batch_invariant_replies() {
    for (name, spec) in families() {
        let dir = common::tiny_model(&spec);
        for weights in common::CPU_FORMATS {
            let engine = |cfg| common::engine_with(dir.path().to_str().unwrap(), cfg, weights);
            let together: Vec<_> = engine(EngineConfig::default())
                .generate(requests(12))
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            for reply in &together {
                let v: Value = serde_json::from_str(&reply.text).unwrap_or_else(|e| {
                    panic!("{name} {weights:?}: {:?} does not parse: {e}", reply.text)
                });
                assert!(v["bid"].as_i64().is_some_and(|b| (0..=99).contains(&b)));
            }
            let mut alone = engine(EngineConfig {
                prefix_caching: false,
                ..EngineConfig::default()
            });
            for (r, reply) in requests(12).into_iter().zip(&together) {
                let solo = alone.generate(vec![r]).remove(0).unwrap();
                assert_eq!(solo.token_ids, reply.token_ids, "{name} {weights:?}");
            }
        }
    }
}
