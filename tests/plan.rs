//! `throng plan`: its figures against a hand computation, for a tiny model and a known
//! config, and its estimate's arithmetic.

mod common;

use common::TinyLlama;
use std::path::PathBuf;
use std::process::Command;
use throng::model::CausalLm;
use throng::plan::device::{Figure, Inputs, Source, Speed};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
// Guards the model figures: parameters and KV bytes per token of the tiny model, counted by
// hand from its shape.
fn model_figures_match_a_hand_count() {
    let spec = TinyLlama::default();
    let dir = common::tiny_model(&spec);
    let loaded =
        throng::model::loader::load(dir.path().to_str().unwrap(), &common::f32_options()).unwrap();
    let cfg = loaded.model.config();
    // vocab 260 x hidden 64 (tied head); per layer q 64x64, k and v 64x32 each, o 64x64,
    // gate/up/down 3 x 64x128, two norms of 64; two layers; the final norm.
    let hand = 260 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64;
    assert_eq!(cfg.parameters(), hand);
    assert_eq!(hand, 90_688);
    // Keys and values, 2 layers, 2 KV heads of 16, f32.
    assert_eq!(cfg.kv_bytes_per_token(4), 2 * 2 * 2 * 16 * 4);
}

fn inputs() -> Inputs {
    Inputs {
        devices: 2,
        memory_per_device: Figure::new(1e9, Source::Assumed),
        weight_bytes: Figure::new(1e8, Source::Computed),
        parameters: 5e7 as u64,
        active_parameters: 5e7 as u64,
        experts: None,
        kv_bytes_per_token: Figure::new(512.0, Source::Computed),
        cells: 4,
        decisions: 100,
        prompt_tokens: Figure::new(300.0, Source::Measured),
        shared_tokens: Figure::new(200.0, Source::Measured),
        prefixes: 2,
        prefix_tokens: 200.0,
        reply_tokens: Figure::new(20.0, Source::Measured),
        max_seqs: 256,
        speed: Speed::Measured {
            decisions: 10,
            seconds: 2.0,
        },
    }
}

#[test]
// Guards the estimate's arithmetic, worked by hand: memory, KV, batch, step time, devices.
fn the_estimate_matches_a_hand_computation() {
    let e = inputs().estimate();
    assert_eq!(e.decisions_per_device, 50);
    // Own prompt 100 + reply 20 tokens of 512 bytes.
    assert_eq!(e.kv_per_sequence, 120.0 * 512.0);
    // 4 cells on 2 devices deal out evenly: each holds 1 of the 2 system prompts.
    assert_eq!(e.kv_prefixes, 200.0 * 512.0);
    // 90% of 1 GB, less 100 MB of weights.
    assert_eq!(e.kv_memory, 8e8);
    assert_eq!(e.kv_whole_step, 200.0 * 512.0 + 50.0 * 120.0 * 512.0);
    assert_eq!(e.batch, 50);
    assert!(e.fits);
    assert!((e.shared_share - 2.0 / 3.0).abs() < 1e-12);
    // 0.2 s a decision, 50 per device.
    assert_eq!(e.step_seconds, Figure::new(10.0, Source::Measured));
    // 5 s needs at most 25 decisions a device: 4 devices.
    assert_eq!(inputs().devices_for(5.0, 64), Some(4));
    // Weights larger than the memory: nothing fits.
    let mut big = inputs();
    big.weight_bytes = Figure::new(2e9, Source::Computed);
    assert!(!big.estimate().fits);
    assert_eq!(big.devices_for(5.0, 64), None);
}

#[test]
// Guards the token counts `throng plan` prints: they equal the prompt tokens the engine
// reports for the same first step of a real run (the byte tokenizer: one token a byte).
fn plan_counts_the_prompt_tokens_a_run_uses() {
    let spec = TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    };
    let model = common::tiny_model(&spec);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("guess.toml");
    std::fs::write(
        &config,
        format!(
            r#"name = "plan-tiny"
seed = 3
steps = 1
replicates = 2
policy = "llm"
templates = {:?}
agents = 6

[llm]
max_tokens = 12

[scenario]
name = "guess"
"#,
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    let model = model.path().to_str().unwrap();
    let run = tmp.path().join("run");
    let throng = env!("CARGO_BIN_EXE_throng");
    let out = Command::new(throng)
        .args([
            "run",
            config.to_str().unwrap(),
            "--no-report",
            "--model",
            model,
        ])
        .args(["--weights", "f32", "--out", run.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prompt_tokens: Vec<f64> = std::fs::read_to_string(run.join("decisions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt_tokens"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(prompt_tokens.len(), 12);
    let mean = prompt_tokens.iter().sum::<f64>() / 12.0;
    let out = Command::new(throng)
        .args([
            "plan",
            config.to_str().unwrap(),
            "--model",
            model,
            "--weights",
            "f32",
        ])
        .args(["--sample", "4", "--devices", "2", "--target-step", "100"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("90688 parameters"), "{text}");
    // `auto` keeps keys and values in f16 on the CPU: 2 layers x 2 kv heads x 16 dims x
    // keys and values x 2 bytes.
    assert!(text.contains("KV 256 B per token [computed]"), "{text}");
    assert!(
        text.contains("2 cells, 12 decisions in the first step"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "prompt tokens per agent  {mean:.1} [measured: 12 first-step"
        )),
        "mean of the run's prompt tokens {mean:.1}:\n{text}"
    );
    assert!(
        text.contains("batch per device         6 sequences of 6 decisions"),
        "{text}"
    );
    assert!(text.contains("fits                     yes"), "{text}");
    // With a profile the numbers are the device's, and labelled so: in bf16, what `auto`
    // becomes on a GPU (`--weights` names the device's format under a profile).
    let out = Command::new(throng)
        .args(["plan", config.to_str().unwrap(), "--model", model])
        .args(["--sample", "0", "--device-profile", "h200"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("h200 (stated figures)") && text.contains("[assumed: stated bandwidth"),
        "{text}"
    );
    assert!(
        text.contains("KV 256 B per token [computed]"),
        "bf16 halves it:\n{text}"
    );
}

/// `throng plan` of a 6-agent, 2-replicate guessing game on the tiny model with `args`.
fn plan_tiny(args: &[&str]) -> (Option<i32>, String) {
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("guess.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"plan-inputs\"\nsteps = 1\nreplicates = 2\npolicy = \"llm\"\ntemplates = {:?}\nagents = [6, 3]\n\n[llm]\nmax_tokens = 8\n\n[scenario]\nname = \"guess\"\n",
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    let ran = common::cli::output(
        common::cli::throng()
            .args(["plan", config.to_str().unwrap(), "--model"])
            .arg(model.path())
            .args(["--weights", "f32"])
            .args(args),
    );
    (ran.code, ran.text)
}

#[test]
// Guards against issue 17, item 17: `--devices 100000` answered "fits yes, 0.00 s" for a step
// of a few decisions, and `--target-step` accepted NaN, -5 and 0.
fn absurd_plan_inputs_are_refused_with_the_fix() {
    // More devices than the first step has decisions (6 agents x 2 replicates, and 3 x 2).
    for devices in ["100000", "13", "7"] {
        let (code, text) = plan_tiny(&["--sample", "1", "--devices", devices]);
        assert_eq!(code, Some(1), "{text}");
        assert!(
            text.contains(&format!(
                "--devices {devices}: population 3 has 6 decisions in its first step"
            )) && text.contains("--devices 6 or fewer"),
            "{text}"
        );
        assert!(!text.contains("fits "), "refused before sizing: {text}");
    }
    // One device per decision of the smaller population is the most.
    let (code, text) = plan_tiny(&["--sample", "1", "--devices", "6"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("fits                     yes"), "{text}");
    // A step time must be a number of seconds above 0.
    for target in ["nan", "NaN", "-5", "0", "-0", "inf", "1e400", "soon"] {
        let (code, text) = plan_tiny(&["--sample", "1", "--target-step", target]);
        assert_eq!(code, Some(2), "--target-step {target}: {text}");
        assert!(
            text.contains(&format!("invalid value '{target}' for '--target-step"))
                && (text.contains("a number above 0") || text.contains("not a number of seconds")),
            "{text}"
        );
    }
    // An unreachable target names the most devices that could help: one per decision.
    let (code, text) = plan_tiny(&["--sample", "1", "--target-step", "1e-9"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("not reachable with up to 12 devices (one per decision of the step)"),
        "{text}"
    );
    for (args, words) in [
        (&["--devices", "0"][..], "--devices must be at least 1"),
        (
            &["--sample", "0"][..],
            "with --sample 0 nothing measures the speed",
        ),
    ] {
        let (code, text) = plan_tiny(args);
        assert_eq!(code, Some(1), "{args:?}: {text}");
        assert!(text.contains(words), "{text}");
    }
    // Refused by the argument's own check, as `throng run` refuses it.
    let (code, text) = plan_tiny(&["--max-seqs", "0"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("'--max-seqs <MAX_SEQS>'") && text.contains("give at least 1"),
        "{text}"
    );
}

/// `throng plan` of a 40-agent guessing game on `model` with `args`, where no model's weights
/// are (an empty Hugging Face cache, offline), or `None` without the Llama 3 tokenizer asset.
fn plan_without_weights(model: &str, args: &[&str]) -> Option<(Option<i32>, String)> {
    common::llama3_tokenizer_dir()?;
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("guess.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"plan-stated\"\nsteps = 1\npolicy = \"llm\"\ntemplates = {:?}\nagents = 40\n\n[llm]\nmax_tokens = 24\n\n[scenario]\nname = \"guess\"\n",
            repo().join("templates/guess").display().to_string()
        ),
    )
    .unwrap();
    let ran = common::cli::output(
        common::cli::throng()
            .args(["plan", config.to_str().unwrap(), "--model", model])
            .args(args)
            .env("HF_HOME", tmp.path().join("hf"))
            .env("HF_HUB_OFFLINE", "1"),
    );
    Some((ran.code, ran.text))
}

#[test]
// Guards planning without the weights (issue 20): with a device profile, a preset whose
// weights are not on this machine is sized from the preset's stated config, its prompts
// counted with the stand-in Llama 3 tokenizer, and every such figure says so; without a
// profile the loader's error says how to plan without the weights.
fn a_preset_without_its_weights_is_planned_from_its_stated_config() {
    let Some((code, text)) =
        plan_without_weights("llama-3-8b-instruct", &["--device-profile", "h200"])
    else {
        return;
    };
    assert_eq!(code, Some(0), "{text}");
    for words in [
        "the model's weights are not on this machine: sized from the preset's stated config",
        "8030261248 parameters (8.0 B) [computed from the preset's stated config]",
        "weights 16.1 GB [computed from the preset's stated config: 2 bytes a weight (bf16)]",
        "KV 131.1 kB per token [computed from the preset's stated config]",
        "[assumed: counted with the Llama 3 tokenizer and chat template",
        "reply tokens per agent   24.0 [assumed: max_tokens = 24",
        "[assumed: stated bandwidth and FLOP/s",
        "device 1: llama-3-8b-instruct (weights 16.1 GB, 40 decisions)",
        "fits                     yes",
    ] {
        assert!(text.contains(words), "`{words}` in:\n{text}");
    }
    assert!(
        !text.contains("measured"),
        "nothing is measured here:\n{text}"
    );
    let (code, text) = plan_without_weights("llama-3-8b-instruct", &["--sample", "1"]).unwrap();
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("is not in the Hugging Face cache")
            && text.contains("Or plan it without the weights: with --device-profile NAME"),
        "{text}"
    );
}

#[test]
// Guards the mixture of experts' figures: the plan states all experts' parameters (what
// memory holds) and the routed experts' (what a token is multiplied by), sizes the weights
// by the total and says which experts a decode step reads, labelled as assumed.
fn a_mixture_of_experts_plan_shows_total_and_active_parameters() {
    let Some((code, text)) =
        plan_without_weights("mixtral-8x7b-instruct", &["--device-profile", "h200"])
    else {
        return;
    };
    assert_eq!(code, Some(0), "{text}");
    for words in [
        "model mixtral-8x7b-instruct (Mixtral): 46702792704 parameters (46.7 B) in memory, \
         12879925248 (12.9 B) multiplied per token (2 of 8 experts)",
        "weights 93.4 GB [computed from the preset's stated config",
        "experts per decode step ",
        "[assumed: uniform routing]; compute counts the 2 routed experts of each token (12.9 B parameters)",
        "fits                     yes",
    ] {
        assert!(text.contains(words), "`{words}` in:\n{text}");
    }
}

#[test]
// Guards a model too large for one device in bf16 (Qwen2-72B: 145 GB on a 141 GB H200): the
// plan says it does not fit, that more devices would not help (each holds the whole model),
// and which weight format would fit; with that format it fits. A model that fits in no
// format (Mixtral-8x22B, 150 GB in q8_0) is said to be not runnable on the device.
fn a_72b_model_in_bf16_does_not_fit_one_h200_and_the_plan_names_the_format_that_does() {
    let Some((code, text)) = plan_without_weights(
        "qwen2-72b-instruct",
        &["--device-profile", "h200", "--devices", "2"],
    ) else {
        return;
    };
    assert_eq!(code, Some(0), "{text}");
    for words in [
        "weights 145.4 GB [computed from the preset's stated config: 2 bytes a weight (bf16)]",
        "step time                none: it does not fit",
        "fits                     NO in bf16: its weights (145.4 GB) are more than the 126.9 GB",
        "It fits with --weights q8_0 (80.9 GB of weights; its KV cache is f32",
        "More devices do not help: each of the 2 holds the whole model",
        "the weights alone pass the 126.9 GB usable",
    ] {
        assert!(text.contains(words), "`{words}` in:\n{text}");
    }
    let (code, text) = plan_without_weights(
        "qwen2-72b-instruct",
        &["--device-profile", "h200", "--weights", "q8_0"],
    )
    .unwrap();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(
            "weights 80.9 GB [computed from the preset's stated config: matrices in q8_0"
        ) && text.contains("KV 655.4 kB per token")
            && text.contains("fits                     yes"),
        "{text}"
    );
    let (code, text) =
        plan_without_weights("mixtral-8x22b-instruct", &["--device-profile", "h200"]).unwrap();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("(q8_0, the smallest, takes 150.0 GB): not runnable on one h200"),
        "{text}"
    );
}
