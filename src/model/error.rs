use std::path::{Path, PathBuf};

/// Everything that can go wrong while loading or running a model, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid model config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    UnsupportedArchitecture { path: PathBuf, message: String },
    #[error(
        "{path} has no tensor `{name}`: the checkpoint is incomplete or not a Llama model; \
         re-download it (a sharded model needs every shard listed in model.safetensors.index.json)"
    )]
    MissingTensor { path: PathBuf, name: String },
    #[error("tensor `{name}` in {path} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path} is not a valid model file: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(
        "unknown model `{name}`: it is neither a preset ({known}) nor an existing path nor a \
         Hugging Face repo id (`owner/name`); run `throng models` to list presets"
    )]
    UnknownModel { name: String, known: String },
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error(
        "out of device memory while {during}: {source}; lower the KV budget (--kv-memory), \
         the batch size (--max-batch-tokens) or pick a smaller model"
    )]
    OutOfMemory {
        during: String,
        source: candle_core::Error,
    },
    #[error("model computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

impl ModelError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn from_config_problem(path: &Path, message: String) -> Self {
        if message.starts_with("unsupported architecture") {
            ModelError::UnsupportedArchitecture {
                path: path.to_path_buf(),
                message,
            }
        } else {
            ModelError::Config {
                path: path.to_path_buf(),
                message,
            }
        }
    }

    pub(crate) fn corrupt(path: &Path, message: impl Into<String>) -> Self {
        ModelError::Corrupt {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    /// Turns an allocation failure into an actionable out-of-memory error, leaving other
    /// candle errors as they are.
    pub(crate) fn during(during: &str, source: candle_core::Error) -> Self {
        let text = source.to_string().to_lowercase();
        if text.contains("out of memory") || text.contains("out_of_memory") {
            ModelError::OutOfMemory {
                during: during.to_string(),
                source,
            }
        } else {
            ModelError::Candle(source)
        }
    }
}
