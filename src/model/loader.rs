//! From a model name to a loaded model: presets, local folders and files, Hugging Face repo
//! ids (cache first, through `hf-hub`), and the packaged assets.

use super::files;
use super::gguf::GgufSource;
use super::llama::WeightSource;
use super::safetensors::SafetensorsSource;
use super::{Llama, ModelConfig, ModelError, PresetSource, Presets, WeightFormat};
use crate::assets;
use candle_core::Device;
use candle_core::quantized::tokenizer::TokenizerFromGguf;
use std::path::{Path, PathBuf};

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    pub weights: WeightFormat,
    /// A `tokenizer.json` that overrides the model's own (needed for GGUF files without one).
    pub tokenizer: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            weights: WeightFormat::Auto,
            tokenizer: None,
        }
    }
}

/// Where a model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face model folder (`config.json`, `*.safetensors`, `tokenizer.json`).
    HfDir(PathBuf),
    /// A GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face repository id.
    Hub { repo: String, revision: String },
    /// A file of a downloadable asset (`models/assets.toml`).
    Asset { asset: String, file: String },
}

impl ModelSource {
    /// Reads `spec` as a preset name, then as a path, then as a Hub repo id (`owner/name`).
    pub fn resolve(spec: &str) -> Result<Self, ModelError> {
        let presets = Presets::builtin();
        if let Some(preset) = presets.get(spec) {
            return Ok(match &preset.source {
                PresetSource::Hub { hub, revision } => ModelSource::Hub {
                    repo: hub.clone(),
                    revision: revision.clone(),
                },
                PresetSource::Asset { asset, file } => ModelSource::Asset {
                    asset: asset.clone(),
                    file: file.clone(),
                },
            });
        }
        let path = Path::new(spec);
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => return Ok(ModelSource::HfDir(path.to_path_buf())),
            Ok(meta) if meta.is_file() => return Ok(ModelSource::Gguf(path.to_path_buf())),
            // A FIFO would block the loader forever; a device or socket is no model either.
            Ok(meta) => {
                return Err(ModelError::NotARegularFile {
                    path: path.to_path_buf(),
                    kind: super::files::file_kind(&meta.file_type()),
                });
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ModelError::io(path, e));
            }
            // A dangling symbolic link exists as an entry, so it is a path too.
            Err(_) if looks_like_path(spec) || path.symlink_metadata().is_ok() => {
                let detail = match std::fs::read_link(path) {
                    Ok(target) => format!(
                        " (it is a symbolic link to {}, which does not exist)",
                        target.display()
                    ),
                    Err(_) => String::new(),
                };
                return Err(ModelError::NoSuchPath {
                    path: path.to_path_buf(),
                    detail,
                });
            }
            Err(_) => {}
        }
        if is_repo_id(spec) {
            let (repo, revision) = match spec.split_once('@') {
                Some((repo, rev)) => (repo.to_string(), rev.to_string()),
                None => (spec.to_string(), "main".to_string()),
            };
            return Ok(ModelSource::Hub { repo, revision });
        }
        Err(ModelError::UnknownModel {
            name: spec.to_string(),
            known: presets.names(),
        })
    }
}

/// Whether `spec` can only mean a path: a GGUF file's name, or a path from the current, the
/// parent or the root folder (`dir/file.gguf` would otherwise read as a Hub repo id).
fn looks_like_path(spec: &str) -> bool {
    spec.to_ascii_lowercase().ends_with(".gguf")
        || ["./", "../", "/", "~/"].iter().any(|p| spec.starts_with(p))
        || spec == "."
        || spec == ".."
}

/// `owner/name` (optionally `@revision`) with the characters the Hub allows.
fn is_repo_id(spec: &str) -> bool {
    let repo = spec.split('@').next().unwrap_or_default();
    let mut parts = repo.split('/');
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None) if ok(a) && ok(b))
        && !repo.starts_with('.')
}

/// The chat-template ingredients of `tokenizer_config.json` (or of GGUF metadata).
#[derive(Debug, Clone, Default)]
pub struct ChatSpec {
    pub template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// A model ready to run, with the tokenizer and chat template that belong to it.
pub struct LoadedModel {
    /// What was asked for (`smollm2-135m-instruct`, a path, a repo id).
    pub name: String,
    pub model: Llama,
    pub tokenizer: tokenizers::Tokenizer,
    pub chat: ChatSpec,
    /// What the weights were stored as and became, e.g. `GGUF (Q4_1) -> f32`.
    pub weights: String,
    /// Where the weights came from, for the model's identity (see [`super::identity`]).
    pub origin: super::Origin,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("name", &self.name)
            .field("weights", &self.weights)
            .finish()
    }
}

/// Loads the model `spec` names (see [`ModelSource::resolve`]).
pub fn load(spec: &str, opts: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let source = ModelSource::resolve(spec)?;
    let mut loaded = load_source(&source, opts)?;
    loaded.name = spec.to_string();
    Ok(loaded)
}

pub(crate) fn load_source(
    source: &ModelSource,
    opts: &LoadOptions,
) -> Result<LoadedModel, ModelError> {
    match source {
        ModelSource::HfDir(dir) => load_hf_dir(dir, opts),
        ModelSource::Gguf(path) => load_gguf(path, opts),
        ModelSource::Hub { repo, revision } => load_hf_dir(&hub_snapshot(repo, revision)?, opts),
        ModelSource::Asset { asset, file } => {
            let path = assets::ensure_file(asset, file)
                .map_err(|e| ModelError::Unavailable(e.to_string()))?;
            load_gguf(&path, opts)
        }
    }
}

fn load_hf_dir(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let mut cfg = ModelConfig::from_hf_file(&dir.join("config.json"))?;
    extend_eos_from_generation_config(&mut cfg, dir)?;
    let tokenizer_path = opts
        .tokenizer
        .clone()
        .unwrap_or_else(|| dir.join("tokenizer.json"));
    let tokenizer = read_tokenizer(&tokenizer_path)?;
    let chat = read_chat_spec(dir)?;
    let mut source = SafetensorsSource::open(dir)?;
    let mut files = vec![dir.join("config.json"), tokenizer_path.clone()];
    // The chat template and the stop tokens come from these when they are there: an edit to
    // one changes the prompts' tokens or where replies end, so it changes the identity.
    files.extend(
        [
            "tokenizer_config.json",
            "chat_template.jinja",
            "generation_config.json",
        ]
        .map(|name| dir.join(name))
        .into_iter()
        .filter(|path| path.is_file()),
    );
    files.extend(super::safetensors::shard_paths(dir)?);
    let read = Read {
        name: dir.display().to_string(),
        tokenizer,
        chat,
        stored: "safetensors".into(),
        files,
    };
    assemble(cfg, &mut source, opts, false, read)
}

/// What a loader read of a model beside its weights.
struct Read {
    name: String,
    tokenizer: tokenizers::Tokenizer,
    chat: ChatSpec,
    /// How the file stores its weights (`safetensors`, `GGUF (Q4_1/Q8_0)`).
    stored: String,
    /// The files its replies depend on.
    files: Vec<std::path::PathBuf>,
}

/// The model of `cfg` built from `source` in the weight format `opts` asks for (`gguf`: the
/// source is a GGUF file, whose blocks some formats keep), with what was read beside it.
fn assemble(
    cfg: ModelConfig,
    source: &mut dyn WeightSource,
    opts: &LoadOptions,
    gguf: bool,
    read: Read,
) -> Result<LoadedModel, ModelError> {
    let target = opts
        .weights
        .target(&opts.device, cfg.parameters() as usize, gguf)?;
    let model = Llama::load(cfg, source, target, &opts.device)?;
    Ok(LoadedModel {
        name: read.name,
        model,
        tokenizer: read.tokenizer,
        chat: read.chat,
        weights: format!("{} -> {}", read.stored, target.label()),
        origin: super::Origin::Files(read.files),
    })
}

fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let mut source = GgufSource::open(path)?;
    let cfg = source.config()?;
    let tokenizer = match &opts.tokenizer {
        Some(p) => read_tokenizer(p)?,
        None => {
            // llama.cpp names some pre-tokenizers after the model that brought them, though
            // they split text as another does (DeepSeek-R1's Qwen distills split as Qwen2).
            let pre = source.meta_string("tokenizer.ggml.pre");
            if let Some(same) = pre.as_deref().and_then(same_pre_tokenizer) {
                source.content.metadata.insert(
                    "tokenizer.ggml.pre".into(),
                    candle_core::quantized::gguf_file::Value::String(same.into()),
                );
            }
            let mut tokenizer = tokenizers::Tokenizer::from_gguf(&source.content).map_err(|e| {
                ModelError::corrupt(
                    path,
                    format!("cannot build a tokenizer from its metadata ({e}); pass --tokenizer path/to/tokenizer.json"),
                )
            })?;
            let pre = source
                .meta_string("tokenizer.ggml.pre")
                .unwrap_or_else(|| "gpt2".into());
            let add_space_prefix = source
                .content
                .metadata
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(false);
            fix_gguf_pre_tokenizer(&mut tokenizer, &pre, add_space_prefix);
            tokenizer
        }
    };
    let token = |key: &str| {
        let id = source.content.metadata.get(key)?.to_u32().ok()?;
        tokenizer.id_to_token(id)
    };
    let chat = ChatSpec {
        template: source.meta_string("tokenizer.chat_template"),
        bos_token: token("tokenizer.ggml.bos_token_id"),
        eos_token: token("tokenizer.ggml.eos_token_id"),
    };
    let stored = {
        let mut types: Vec<String> = source
            .content
            .tensor_infos
            .values()
            .map(|t| format!("{:?}", t.ggml_dtype))
            .collect();
        types.sort();
        types.dedup();
        types.join("/")
    };
    let read = Read {
        name: path.display().to_string(),
        tokenizer,
        chat,
        stored: format!("GGUF ({stored})"),
        files: std::iter::once(path.to_path_buf())
            .chain(opts.tokenizer.clone())
            .collect(),
    };
    assemble(cfg, &mut source, opts, true, read)
}

/// The pre-tokenizer that GGUF's `tokenizer.ggml.pre` = `pre` is another name of, as
/// llama.cpp's `llama-vocab.cpp` maps them.
fn same_pre_tokenizer(pre: &str) -> Option<&'static str> {
    match pre {
        "deepseek-r1-qwen" => Some("qwen2"),
        _ => None,
    }
}

/// candle builds the tokenizer of every GGUF file whose `tokenizer.ggml.pre` it does not
/// know (SmolLM's `smollm`, plain `gpt2`) as GPT-2 with a space added before the text, which
/// turns `<|im_start|>user` into `<|im_start|> user`; llama.cpp, and these models' own
/// tokenizer.json, add no space unless `tokenizer.ggml.add_space_prefix` says so, and SmolLM
/// splits digits one by one. The pre-tokenizers candle gets right are left alone.
fn fix_gguf_pre_tokenizer(
    tokenizer: &mut tokenizers::Tokenizer,
    pre: &str,
    add_space_prefix: bool,
) {
    use tokenizers::pre_tokenizers::{byte_level::ByteLevel, digits::Digits, sequence::Sequence};
    let byte_level = ByteLevel::new(add_space_prefix, true, true);
    match pre {
        "qwen2" | "llama3" | "smaug-bpe" | "lfm2" => {}
        "smollm" => {
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
                Digits::new(true).into(),
                byte_level.into(),
            ])));
        }
        _ => {
            tokenizer.with_pre_tokenizer(Some(byte_level));
        }
    }
}

fn read_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer, ModelError> {
    let bytes = match files::read_regular(path) {
        Ok(bytes) => bytes,
        Err(e) if files::is_not_found(&e) => {
            return Err(ModelError::corrupt(
                path,
                "tokenizer.json is missing: the model folder is incomplete (or pass --tokenizer path/to/tokenizer.json)",
            ));
        }
        Err(e) => return Err(e),
    };
    tokenizers::Tokenizer::from_bytes(bytes)
        .map_err(|e| ModelError::corrupt(path, format!("cannot read the tokenizer: {e}")))
}

/// Llama 3.x list every end-of-turn token in `generation_config.json`; stopping on only the
/// config's `eos_token_id` would let replies run on past `<|eot_id|>`.
fn extend_eos_from_generation_config(cfg: &mut ModelConfig, dir: &Path) -> Result<(), ModelError> {
    let Some(text) = files::read_optional_text(&dir.join("generation_config.json"))? else {
        return Ok(());
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(());
    };
    let ids: Vec<u32> = match json.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|n| vec![n as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    };
    for id in ids {
        if !cfg.eos_token_ids.contains(&id) {
            cfg.eos_token_ids.push(id);
        }
    }
    Ok(())
}

/// `tokenizer_config.json` names special tokens either as strings or as `{"content": ...}`.
fn token_string(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

pub fn read_chat_spec(dir: &Path) -> Result<ChatSpec, ModelError> {
    let path = dir.join("tokenizer_config.json");
    let mut spec = ChatSpec::default();
    if let Some(text) = files::read_optional_text(&path)? {
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::corrupt(&path, format!("line {}: {e}", e.line())))?;
        spec.template = match json.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: use the default one.
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string),
            _ => None,
        };
        spec.bos_token = token_string(json.get("bos_token"));
        spec.eos_token = token_string(json.get("eos_token"));
    }
    if spec.template.is_none() {
        spec.template = files::read_optional_text(&dir.join("chat_template.jinja"))?;
    }
    Ok(spec)
}

/// Resolves a Hub repository to a local snapshot folder: from the Hugging Face cache when
/// every file is there (no network needed), else by downloading the missing files.
pub(crate) fn hub_snapshot(repo: &str, revision: &str) -> Result<PathBuf, ModelError> {
    use hf_hub::{Cache, Repo, RepoType};
    let hub_repo = Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string());
    let cache = Cache::from_env().repo(hub_repo.clone());
    if let Some(config) = cache.get("config.json") {
        let dir = config
            .parent()
            .expect("invariant: a cached file has a folder")
            .to_path_buf();
        if snapshot_complete(&dir) {
            return Ok(dir);
        }
    }
    let unavailable = |e: &dyn std::fmt::Display| {
        ModelError::Unavailable(format!(
            "model `{repo}` (revision {revision}) is not in the Hugging Face cache ({}) and cannot be \
             downloaded: {e}. Download it on a machine with network (`huggingface-cli download {repo}`, \
             after accepting the model's license and setting HF_TOKEN for gated Meta models) and copy \
             the cache over, set HF_HOME to where it is, or pass a local folder with --model path/",
            Cache::from_env().path().display()
        ))
    };
    if std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return Err(unavailable(&"HF_HUB_OFFLINE is set"));
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .map_err(|e| unavailable(&e))?
        .repo(hub_repo);
    let info = api.info().map_err(|e| unavailable(&e))?;
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let wanted = |f: &str| {
        f.ends_with(".safetensors")
            || matches!(
                f,
                "config.json"
                    | "generation_config.json"
                    | "tokenizer.json"
                    | "tokenizer_config.json"
                    | "chat_template.jinja"
                    | "model.safetensors.index.json"
            )
    };
    let mut dir = None;
    for file in files.iter().filter(|f| wanted(f) && !f.contains('/')) {
        let path = api.get(file).map_err(|e| unavailable(&e))?;
        dir = path.parent().map(Path::to_path_buf);
    }
    dir.ok_or_else(|| unavailable(&"the repository lists no config.json"))
}

/// Whether `repo` is in the Hugging Face cache, complete enough to load without network.
pub fn hub_snapshot_cached(repo: &str, revision: &str) -> bool {
    let hub_repo = hf_hub::Repo::with_revision(
        repo.to_string(),
        hf_hub::RepoType::Model,
        revision.to_string(),
    );
    hf_hub::Cache::from_env()
        .repo(hub_repo)
        .get("config.json")
        .and_then(|c| c.parent().map(snapshot_complete))
        .unwrap_or(false)
}

/// A snapshot is usable offline when its config, tokenizer and every weight shard are there.
fn snapshot_complete(dir: &Path) -> bool {
    if !dir.join("tokenizer.json").is_file() {
        return false;
    }
    let index = dir.join("model.safetensors.index.json");
    // Only a regular file is read: a FIFO would block this check forever.
    if let Ok(text) = files::read_regular_text(&index) {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            return false;
        };
        return json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .is_some_and(|m| {
                m.values()
                    .filter_map(|v| v.as_str())
                    .all(|f| dir.join(f).is_file())
            });
    }
    dir.join("model.safetensors").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_presets_paths_and_repo_ids() {
        assert!(matches!(
            ModelSource::resolve("llama-3.1-8b-instruct").unwrap(),
            ModelSource::Hub { repo, .. } if repo == "meta-llama/Llama-3.1-8B-Instruct"
        ));
        assert_eq!(
            ModelSource::resolve("test-org/tiny-llama@v2").unwrap(),
            ModelSource::Hub {
                repo: "test-org/tiny-llama".into(),
                revision: "v2".into()
            }
        );
        let err = ModelSource::resolve("llama-9-huge")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown model `llama-9-huge`") && err.contains("smollm2-135m-instruct"),
            "{err}"
        );
    }
}
