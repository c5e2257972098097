//! The forward pass, specified against candle-transformers' reference Llama and against
//! itself: a sequence's logits must not depend on how it is chunked or what shares its batch.

mod common;

use candle_core::{DType, Device, IndexOp, Tensor};
use common::TinyLlama;
use common::ragged::{batched, max_abs_diff, solo, tokens};
use throng::model::{BatchInputs, CausalLm, KvCache, LoadOptions, SeqChunk, WeightFormat};

fn f32_options() -> LoadOptions {
    LoadOptions {
        weights: WeightFormat::F32,
        ..LoadOptions::default()
    }
}

/// Reference logits for every position after the first `prefill` tokens: one prefill call,
/// then one call per token, through candle-transformers' own Llama.
fn reference_logits(dir: &std::path::Path, toks: &[u32], prefill: usize) -> Vec<Tensor> {
    use candle_transformers::models::llama as reference;
    let cfg: reference::LlamaConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let cfg = cfg.into_config(false);
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    let model = reference::Llama::load(vb, &cfg).unwrap();
    let mut cache = reference::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
    let mut out = Vec::new();
    let input = Tensor::new(&toks[..prefill], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    out.push(model.forward(&input, 0, &mut cache).unwrap().i(0).unwrap());
    for (pos, &t) in toks.iter().enumerate().skip(prefill) {
        let input = Tensor::new(&[t], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        out.push(
            model
                .forward(&input, pos, &mut cache)
                .unwrap()
                .i(0)
                .unwrap(),
        );
    }
    out
}

#[test]
fn forward_matches_candle_transformers_reference_llama() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyLlama::default();
    spec.write(dir.path()).unwrap();
    let loaded = throng::model::loader::load(dir.path().to_str().unwrap(), &f32_options()).unwrap();
    let model = loaded.model;
    let cfg = model.config().clone();
    assert!(
        cfg.rope.scaling.is_some() && cfg.tie_word_embeddings && cfg.num_kv_heads < cfg.num_heads
    );

    let toks = tokens(40, 1);
    let prefill = 30;
    let expected = reference_logits(dir.path(), &toks, prefill);

    let block_size = 16;
    let mut kv = KvCache::new(&cfg, 4, block_size, DType::F32, &Device::Cpu).unwrap();
    let blocks = [2u32, 0, 3];
    let mut ours = Vec::new();
    let batch = BatchInputs::new(
        &[SeqChunk {
            tokens: &toks[..prefill],
            start: 0,
            blocks: &blocks,
            wants_logits: true,
        }],
        &kv,
    )
    .unwrap();
    ours.push(model.forward(&batch, &mut kv).unwrap().i(0).unwrap());
    for pos in prefill..toks.len() {
        let batch = BatchInputs::new(
            &[SeqChunk {
                tokens: &toks[pos..pos + 1],
                start: pos,
                blocks: &blocks,
                wants_logits: true,
            }],
            &kv,
        )
        .unwrap();
        ours.push(model.forward(&batch, &mut kv).unwrap().i(0).unwrap());
    }
    for (step, (a, b)) in ours.iter().zip(&expected).enumerate() {
        let diff = max_abs_diff(a, b);
        assert!(diff < 1e-4, "step {step}: logits differ by {diff}");
    }
}

/// The logits of `toks` alone in a fresh cache of 16-token blocks: after its first `from`
/// tokens, then after each later one.
fn alone(model: &dyn CausalLm, toks: &[u32], from: usize) -> Vec<Tensor> {
    solo(model, toks, from, 16)
}

#[test]
fn ragged_batches_give_each_sequence_its_solo_logits() {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama::default().write(dir.path()).unwrap();
    let model = throng::model::loader::load(dir.path().to_str().unwrap(), &f32_options())
        .unwrap()
        .model;
    let block_size = 16;
    let decode_steps = 6;
    let lengths = [1usize, 15, 16, 17, 33, 100];
    // Prompts are `len` tokens; each then decodes `decode_steps` more (fixed, not sampled).
    let all: Vec<Vec<u32>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| tokens(n + decode_steps, i as u32))
        .collect();
    let expected: Vec<Vec<Tensor>> = all
        .iter()
        .zip(lengths)
        .map(|(t, n)| alone(&model, t, n))
        .collect();

    // One shared pool, blocks handed out from the top down so no sequence gets contiguous
    // ids; prefill in chunks of at most 24 tokens per sequence per step, then decode together.
    let got = batched(&model, &all, &lengths, block_size, 24);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        // The last token's logits are produced but the comparison covers every step.
        assert_eq!(g.len(), e.len(), "sequence {i}");
        for (step, (a, b)) in g.iter().zip(e).enumerate() {
            let diff = max_abs_diff(a, b);
            assert!(
                diff < 1e-4,
                "sequence of length {} step {step}: differs by {diff}",
                lengths[i]
            );
        }
    }
}

#[test]
fn a_sequence_leaving_and_another_reusing_its_blocks_leaves_the_others_untouched() {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama::default().write(dir.path()).unwrap();
    let model = throng::model::loader::load(dir.path().to_str().unwrap(), &f32_options())
        .unwrap()
        .model;
    let cfg = model.config().clone();
    let block_size = 16;
    let mut kv = KvCache::new(&cfg, 16, block_size, DType::F32, &Device::Cpu).unwrap();
    let a = tokens(40, 1);
    let b = tokens(50, 2);
    let c = tokens(45, 3);
    let (a_blocks, b_blocks) = (vec![0u32, 1, 2], vec![3u32, 4, 5, 6]);
    let expected_a = alone(&model, &a, 20);
    let expected_c = alone(&model, &c, 30);

    // a and b prefill together.
    let batch = BatchInputs::new(
        &[
            SeqChunk {
                tokens: &a[..20],
                start: 0,
                blocks: &a_blocks,
                wants_logits: true,
            },
            SeqChunk {
                tokens: &b[..30],
                start: 0,
                blocks: &b_blocks,
                wants_logits: true,
            },
        ],
        &kv,
    )
    .unwrap();
    let first = model.forward(&batch, &mut kv).unwrap();
    let mut got_a = vec![first.i(0).unwrap()];
    // b leaves after its prefill; c arrives into b's freed blocks (garbage still in them).
    let c_blocks = b_blocks.clone();
    let mut c_done = 0;
    for pos in 20..a.len() {
        let mut chunks = vec![SeqChunk {
            tokens: &a[pos..pos + 1],
            start: pos,
            blocks: &a_blocks,
            wants_logits: true,
        }];
        let c_end = if c_done < 30 { 30 } else { c_done + 1 };
        if c_done < c.len() {
            chunks.push(SeqChunk {
                tokens: &c[c_done..c_end],
                start: c_done,
                blocks: &c_blocks,
                wants_logits: true,
            });
        }
        let batch = BatchInputs::new(&chunks, &kv).unwrap();
        let logits = model.forward(&batch, &mut kv).unwrap();
        got_a.push(logits.i(0).unwrap());
        if chunks.len() == 2 {
            let diff = max_abs_diff(&logits.i(1).unwrap(), &expected_c[c_end - 30]);
            assert!(diff < 1e-4, "newcomer c at {c_end}: differs by {diff}");
            c_done = c_end;
        }
    }
    for (step, (g, e)) in got_a.iter().zip(&expected_a).enumerate() {
        let diff = max_abs_diff(g, e);
        assert!(diff < 1e-4, "sequence a step {step}: differs by {diff}");
    }
}

/// The bf16 tolerance the CUDA checks use (`BF16_LOGIT_TOLERANCE`) is what bf16 costs on the
/// CPU too: the tiny models in bf16 (gathered attention) against f32, on ragged batches.
#[test]
fn bf16_logits_stay_within_the_stated_bf16_tolerance_of_f32() {
    use common::tiny::BF16_LOGIT_TOLERANCE;
    let wide = TinyLlama {
        hidden_size: 256,
        intermediate_size: 512,
        ..TinyLlama::default()
    };
    for spec in [TinyLlama::default(), wide] {
        let dir = tempfile::tempdir().unwrap();
        spec.write(dir.path()).unwrap();
        let load = |weights| {
            let opts = LoadOptions {
                weights,
                ..LoadOptions::default()
            };
            throng::model::loader::load(dir.path().to_str().unwrap(), &opts)
                .unwrap()
                .model
        };
        let (f32_model, bf16_model) = (load(WeightFormat::F32), load(WeightFormat::Bf16));
        let lengths = [1usize, 17, 33, 100];
        let seqs: Vec<Vec<u32>> = lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(n + 4, i as u32))
            .collect();
        let (mut worst, mut scale) = (0f32, 0f32);
        for (s, &n) in seqs.iter().zip(&lengths) {
            for (a, b) in alone(&f32_model, s, n).iter().zip(alone(&bf16_model, s, n)) {
                worst = worst.max(max_abs_diff(a, &b));
                scale = scale.max(
                    a.abs()
                        .unwrap()
                        .max_all()
                        .unwrap()
                        .to_scalar::<f32>()
                        .unwrap(),
                );
            }
        }
        eprintln!(
            "hidden {}: bf16 differs from f32 by {worst} ({:.4} of the largest logit {scale})",
            spec.hidden_size,
            worst / scale
        );
        assert!(
            worst <= BF16_LOGIT_TOLERANCE * scale,
            "bf16 logits differ by {worst}, over {BF16_LOGIT_TOLERANCE} of {scale}"
        );
    }
}

#[test]
// Guards `throng bench --shape tiny` against drifting from the tests' tiny model: the library
// writes the shape out itself (no test fixture ships in it), so the two are compared here.
fn the_bench_tiny_shape_is_the_tests_tiny_model() {
    let mut fixture = TinyLlama::default().config_json();
    fixture["max_position_embeddings"] = 8192.into();
    assert_eq!(throng::model::synthetic::Shape::Tiny.config_json(), fixture);
}
