//! Bad input gets an error that names the problem and the fix, never a panic.

mod common;

use common::TinyLlama;
use throng::engine::{EngineConfig, Message, Request, RequestError};
use throng::model::{ModelError, loader};

fn load_err(spec: &str) -> String {
    match loader::load(spec, &common::f32_options()) {
        Ok(_) => panic!("loading {spec} should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_truncated_gguf_is_reported_as_truncated() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, keep) in [
        ("cut-in-tensors.gguf", bytes.len() / 2),
        ("cut-in-header.gguf", 200),
    ] {
        let cut = dir.path().join(name);
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        let err = load_err(cut.to_str().unwrap());
        assert!(err.contains("truncated") && err.contains(name), "{err}");
    }
}

#[test]
fn a_safetensors_folder_missing_a_tensor_names_it() {
    let dir = common::tiny_model(&TinyLlama::default());
    let mut weights = TinyLlama::default().weights().unwrap();
    weights.remove("model.layers.1.mlp.down_proj.weight");
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path().to_str().unwrap());
    assert!(
        err.contains("model.layers.1.mlp.down_proj.weight") && err.contains("re-download"),
        "{err}"
    );
}

#[test]
fn a_config_of_another_architecture_is_refused_by_name() {
    let dir = common::tiny_model(&TinyLlama::default());
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("LlamaForCausalLM", "GPTNeoXForCausalLM");
    std::fs::write(&path, text).unwrap();
    match loader::load(dir.path().to_str().unwrap(), &common::f32_options()) {
        Err(ModelError::UnsupportedArchitecture { message, .. }) => {
            assert!(
                message.contains("GPTNeoXForCausalLM") && message.contains("Llama"),
                "{message}"
            )
        }
        other => panic!("expected an architecture error, got {other:?}"),
    }
}

#[test]
fn a_malformed_config_names_its_line() {
    let dir = common::tiny_model(&TinyLlama::default());
    std::fs::write(
        dir.path().join("config.json"),
        "{\n  \"hidden_size\": 64,\n  \"vocab_size\": oops\n}",
    )
    .unwrap();
    let err = load_err(dir.path().to_str().unwrap());
    assert!(
        err.contains("config.json") && err.contains("line 3"),
        "{err}"
    );
}

#[test]
fn an_unknown_model_name_lists_the_presets() {
    let err = load_err("llama-7-gigantic");
    assert!(err.contains("unknown model `llama-7-gigantic`"), "{err}");
    assert!(
        err.contains("llama-3.2-3b-instruct") && err.contains("throng models"),
        "{err}"
    );
}

#[test]
fn a_prompt_longer_than_the_context_fails_alone() {
    let spec = TinyLlama {
        max_position_embeddings: 64,
        ..TinyLlama::default()
    };
    let dir = common::tiny_model(&spec);
    let mut engine = common::engine(dir.path().to_str().unwrap(), EngineConfig::default());
    let results = engine.generate(vec![
        Request::chat(vec![Message::user("x".repeat(200))]).with_max_tokens(4),
        Request::chat(vec![Message::user("hi")]).with_max_tokens(4),
        Request::chat(vec![]).with_max_tokens(4),
    ]);
    match &results[0] {
        Err(e @ RequestError::PromptTooLong { limit: 64, .. }) => {
            assert!(e.to_string().contains("shorten"), "{e}")
        }
        other => panic!("expected PromptTooLong, got {other:?}"),
    }
    assert_eq!(results[1].as_ref().unwrap().generated_tokens, 4);
    assert_eq!(results[2], Err(RequestError::EmptyMessages));
}

/// `loader::load(spec)`'s error, failing the test when loading succeeds or has not ended
/// after a minute (a loader that blocks on a named pipe would otherwise hang the suite).
fn load_err_within(spec: &std::path::Path, opts: throng::model::LoadOptions) -> String {
    let spec = spec.to_str().unwrap().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let shown = spec.clone();
    std::thread::spawn(move || {
        let _ = tx.send(loader::load(&spec, &opts).map(|_| ()));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(Ok(())) => panic!("loading {shown} should fail"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("loading {shown} still blocked after a minute"),
    }
}

/// The tiny model's weights with `name` changed by `edit`, saved over its model.safetensors.
fn damage_safetensors(dir: &std::path::Path, name: &str, edit: impl Fn(&mut Vec<f32>)) {
    let mut weights = TinyLlama::default().weights().unwrap();
    let t = &weights[name];
    let mut values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    edit(&mut values);
    let damaged = candle_core::Tensor::from_vec(values, t.shape(), &candle_core::Device::Cpu)
        .unwrap()
        .to_dtype(t.dtype())
        .unwrap();
    weights.insert(name.to_string(), damaged);
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
}

/// Copies the GGUF file `from` to `to` with its metadata and tensors changed by `meta` and
/// `tensors` (each tensor dequantized to f32 for the edit and written back as f32).
fn rewrite_gguf(
    from: &std::path::Path,
    to: &std::path::Path,
    meta: impl Fn(&mut Vec<(String, candle_core::quantized::gguf_file::Value)>),
    tensor: impl Fn(&str, &mut Vec<f32>),
) {
    use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
    let mut reader = std::fs::File::open(from).unwrap();
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let mut metadata: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    meta(&mut metadata);
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|name| {
            let q = content
                .tensor(&mut reader, name, &candle_core::Device::Cpu)
                .unwrap();
            let dense = q.dequantize(&candle_core::Device::Cpu).unwrap();
            let mut values = dense.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            tensor(name, &mut values);
            let dense =
                candle_core::Tensor::from_vec(values, dense.shape(), dense.device()).unwrap();
            (
                name.clone(),
                QTensor::quantize(&dense, GgmlDType::F32).unwrap(),
            )
        })
        .collect();
    let meta_refs: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut file = std::fs::File::create(to).unwrap();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
}

/// A tiny model as a GGUF file (with its tokenizer beside it) in a fresh folder.
fn tiny_gguf() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = common::tiny_model(&TinyLlama::default());
    let path = dir.path().join("tiny.gguf");
    TinyLlama::default().write_gguf(&path, false).unwrap();
    (dir, path)
}

fn with_tokenizer(
    dir: &std::path::Path,
    weights: throng::model::WeightFormat,
) -> throng::model::LoadOptions {
    throng::model::LoadOptions {
        weights,
        tokenizer: Some(dir.join("tokenizer.json")),
        ..throng::model::LoadOptions::default()
    }
}

// Guards against issue 30, item 4: a NaN in a norm weight loaded, and under int8 weights gave
// plausible text; an infinity loaded as well. Each is refused at load, by file and tensor,
// whatever the format the weights become.
#[test]
fn a_nan_or_infinite_weight_is_refused_at_load_naming_its_file_and_tensor() {
    use throng::model::WeightFormat;
    let dir = common::tiny_model(&TinyLlama::default());
    for (name, value, words) in [
        ("model.layers.1.input_layernorm.weight", f32::NAN, "1 NaN"),
        ("model.embed_tokens.weight", f32::INFINITY, "1 infinite"),
        (
            "model.layers.0.mlp.down_proj.weight",
            f32::NEG_INFINITY,
            "1 infinite",
        ),
    ] {
        damage_safetensors(dir.path(), name, |v| v[3] = value);
        for weights in [WeightFormat::Int8, WeightFormat::F32, WeightFormat::Bf16] {
            let opts = throng::model::LoadOptions {
                weights,
                ..throng::model::LoadOptions::default()
            };
            let err = load_err_within(dir.path(), opts);
            assert!(
                err.contains(&format!("`{name}`"))
                    && err.contains("model.safetensors")
                    && err.contains(words)
                    && err.contains("download it again"),
                "{name} under {weights:?}: {err}"
            );
        }
    }
    // The same in a GGUF file, whatever the weights become.
    let (dir, gguf) = tiny_gguf();
    let damaged = dir.path().join("damaged.gguf");
    rewrite_gguf(
        &gguf,
        &damaged,
        |_| {},
        |name, v| {
            if name == "blk.1.attn_norm.weight" {
                v[0] = f32::NAN;
            }
        },
    );
    for weights in [WeightFormat::Native, WeightFormat::Int8, WeightFormat::F32] {
        let err = load_err_within(&damaged, with_tokenizer(dir.path(), weights));
        assert!(
            err.contains("`blk.1.attn_norm.weight`")
                && err.contains("damaged.gguf")
                && err.contains("1 NaN"),
            "{weights:?}: {err}"
        );
    }
}

// Guards against issue 30, item 4: `rope_theta` 0 or negative and `rms_norm_eps` negative
// loaded and generated garbage. Each impossible number is refused at load, by its name in the
// file (config.json's key, or the GGUF metadata key), with the way on.
#[test]
fn impossible_model_hyperparameters_are_refused_by_their_key() {
    let dir = common::tiny_model(&TinyLlama::default());
    let config = dir.path().join("config.json");
    let original = std::fs::read_to_string(&config).unwrap();
    let json: serde_json::Value = serde_json::from_str(&original).unwrap();
    for (key, value, words) in [
        ("rope_theta", serde_json::json!(0.0), "`rope_theta` is 0"),
        (
            "rope_theta",
            serde_json::json!(-10000.0),
            "`rope_theta` is -10000",
        ),
        (
            "rms_norm_eps",
            serde_json::json!(-1e-5),
            "`rms_norm_eps` is -0.00001",
        ),
        (
            "rms_norm_eps",
            serde_json::json!(0.0),
            "`rms_norm_eps` is 0",
        ),
        (
            "vocab_size",
            serde_json::json!(0),
            "`vocab_size` must be positive",
        ),
        (
            "num_hidden_layers",
            serde_json::json!(0),
            "`num_hidden_layers` must be positive",
        ),
        (
            "hidden_size",
            serde_json::json!(66),
            "`hidden_size` (66) is not a multiple of `num_attention_heads` (4)",
        ),
        (
            "num_key_value_heads",
            serde_json::json!(3),
            "must be a multiple of `num_key_value_heads` (3)",
        ),
        (
            "eos_token_id",
            serde_json::json!([9999]),
            "outside the vocabulary",
        ),
    ] {
        let mut bad = json.clone();
        bad[key] = value;
        std::fs::write(&config, bad.to_string()).unwrap();
        let err = load_err(dir.path().to_str().unwrap());
        assert!(
            err.contains("config.json")
                && err.contains(words)
                && err.contains("download the model again"),
            "{key}: {err}"
        );
    }
    std::fs::write(&config, original).unwrap();
    // A GGUF file says the same by its own keys.
    use candle_core::quantized::gguf_file::Value;
    let (dir, gguf) = tiny_gguf();
    let damaged = dir.path().join("damaged.gguf");
    for (key, value, words) in [
        (
            "llama.rope.freq_base",
            Value::F32(0.0),
            "`llama.rope.freq_base` is 0",
        ),
        (
            "llama.rope.freq_base",
            Value::F32(f32::NAN),
            "`llama.rope.freq_base` is NaN",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(-1e-5),
            "`llama.attention.layer_norm_rms_epsilon` is -0.0000",
        ),
        ("llama.block_count", Value::I32(-2), "llama.block_count"),
        (
            "llama.embedding_length",
            Value::U32(0),
            "`llama.embedding_length` must be positive",
        ),
    ] {
        rewrite_gguf(
            &gguf,
            &damaged,
            |meta| {
                for (k, v) in meta.iter_mut() {
                    if k == key {
                        *v = value.clone();
                    }
                }
            },
            |_, _| {},
        );
        let opts = with_tokenizer(dir.path(), throng::model::WeightFormat::F32);
        let err = load_err_within(&damaged, opts);
        assert!(
            err.contains("damaged.gguf")
                && err.contains(words)
                && err.contains("download it again"),
            "{key}: {err}"
        );
    }
}

// Guards against issue 30, item 8b: a sharded model's index could name shards outside the
// model folder (`../x`, an absolute path, a symbolic link out), which were then mapped.
#[test]
fn an_index_that_names_a_shard_outside_the_model_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    TinyLlama::default().write(&model).unwrap();
    let outside = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::rename(
        model.join("model.safetensors"),
        outside.join("w.safetensors"),
    )
    .unwrap();
    let index = |shard: &str| {
        let weights = TinyLlama::default().weights().unwrap();
        let map: serde_json::Map<String, serde_json::Value> = weights
            .keys()
            .map(|k| (k.clone(), serde_json::Value::from(shard)))
            .collect();
        std::fs::write(
            model.join("model.safetensors.index.json"),
            serde_json::json!({ "metadata": {}, "weight_map": map }).to_string(),
        )
        .unwrap();
    };
    std::os::unix::fs::symlink(
        outside.join("w.safetensors"),
        model.join("link.safetensors"),
    )
    .unwrap();
    let absolute = outside.join("w.safetensors").display().to_string();
    for (shard, words) in [
        ("../elsewhere/w.safetensors", "climbs out with `..`"),
        (absolute.as_str(), "absolute"),
        (
            "link.safetensors",
            "a symbolic link out of the model folder",
        ),
        ("", "is empty"),
    ] {
        index(shard);
        let err = load_err(model.to_str().unwrap());
        assert!(
            err.contains("model.safetensors.index.json")
                && err.contains("weight_map")
                && err.contains(words),
            "{shard:?}: {err}"
        );
    }
    // A shard in the folder, and one a link leads to inside it, load.
    std::fs::remove_file(model.join("link.safetensors")).unwrap();
    std::fs::rename(outside.join("w.safetensors"), model.join("w.safetensors")).unwrap();
    std::os::unix::fs::symlink("w.safetensors", model.join("link.safetensors")).unwrap();
    for shard in ["w.safetensors", "link.safetensors"] {
        index(shard);
        loader::load(model.to_str().unwrap(), &common::f32_options())
            .unwrap_or_else(|e| panic!("{shard}: {e}"));
    }
    // The Hugging Face cache links a snapshot's files into the repository's blobs folder.
    let repo = tmp.path().join("models--someone--tiny");
    let snapshot = repo.join("snapshots/abc123");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    TinyLlama::default().write(&snapshot).unwrap();
    std::fs::rename(snapshot.join("model.safetensors"), repo.join("blobs/f00d")).unwrap();
    std::os::unix::fs::symlink("../../blobs/f00d", snapshot.join("model.safetensors")).unwrap();
    let weights = TinyLlama::default().weights().unwrap();
    let map: serde_json::Map<String, serde_json::Value> = weights
        .keys()
        .map(|k| (k.clone(), serde_json::Value::from("model.safetensors")))
        .collect();
    std::fs::write(
        snapshot.join("model.safetensors.index.json"),
        serde_json::json!({ "weight_map": map }).to_string(),
    )
    .unwrap();
    loader::load(snapshot.to_str().unwrap(), &common::f32_options()).unwrap();
}

// Guards against issue 30, items 14b and 21: a named pipe for `config.json` made `generate`
// wait forever, and a folder (or a pipe) named `model.safetensors` was reported as "a shard
// listed in model.safetensors.index.json is missing" in a folder without an index. Each file
// of a model folder that is not a regular file is named, with what it is.
#[test]
fn a_model_file_that_is_not_a_regular_file_is_named_and_never_waited_on() {
    for (file, kind) in [
        ("config.json", "FIFO"),
        ("tokenizer.json", "FIFO"),
        ("tokenizer_config.json", "FIFO"),
        ("generation_config.json", "FIFO"),
        ("model.safetensors", "FIFO"),
        ("model.safetensors", "folder"),
        ("config.json", "folder"),
    ] {
        let dir = common::tiny_model(&TinyLlama::default());
        let path = dir.path().join(file);
        let _ = std::fs::remove_file(&path);
        match kind {
            "FIFO" => {
                let status = std::process::Command::new("mkfifo")
                    .arg(&path)
                    .status()
                    .unwrap();
                assert!(status.success());
            }
            _ => std::fs::create_dir(&path).unwrap(),
        }
        let err = load_err_within(dir.path(), common::f32_options());
        let what = match kind {
            "FIFO" => "is a named pipe (FIFO), not a regular file",
            _ => "is a folder, not a regular file",
        };
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains(what),
            "{file} as a {kind}: {err}"
        );
        assert!(!err.contains("listed in"), "{file} as a {kind}: {err}");
    }
    // `generate` through the binary ends too, naming the pipe.
    let dir = common::tiny_model(&TinyLlama::default());
    let config = dir.path().join("config.json");
    std::fs::remove_file(&config).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&config)
            .status()
            .unwrap()
            .success()
    );
    let ran = common::cli::output_within(
        common::cli::throng()
            .args(["generate", "--prompt", "hi", "--model"])
            .arg(dir.path()),
        std::time::Duration::from_secs(120),
    );
    assert!(
        !ran.ok && ran.text.contains("config.json") && ran.text.contains("named pipe (FIFO)"),
        "{}",
        ran.text
    );
}
