use std::path::{Path, PathBuf};

/// Everything that can go wrong while loading or running a model, each with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "invalid model config {path}: {message}; correct it (the model's published config.json \
         has the value) or download the model again"
    )]
    Config { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    UnsupportedArchitecture { path: PathBuf, message: String },
    #[error(
        "{path} has no tensor `{name}`: the checkpoint is incomplete or not of the family its config names; \
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
    #[error(
        "{path}: no such file or folder{detail}. A model that ends in .gguf, or starts with ./, \
         ../ or /, is read as a path, not as a preset or a Hugging Face repo id: check the path"
    )]
    NoSuchPath { path: PathBuf, detail: String },
    #[error(
        "{path} is {kind}, not a regular file: give a GGUF file, a model folder, a preset or a \
         Hugging Face repo id (owner/name)"
    )]
    NotARegularFile { path: PathBuf, kind: String },
    #[error(
        "{path} is {kind}, not a regular file: a model's files must be regular files (or \
         symbolic links to them); put the file itself there (download the model again if unsure)"
    )]
    NotARegularModelFile { path: PathBuf, kind: String },
    #[error(
        "tensor `{name}` in {path} holds {found} of its {total} values: a model with such \
         weights computes NaN (or plausible-looking garbage once quantized); the file is damaged \
         or was saved from a diverged training run: download it again or use another checkpoint"
    )]
    NonFiniteWeights {
        path: PathBuf,
        name: String,
        /// What is wrong, e.g. `3 NaN and 1 infinite`.
        found: String,
        total: usize,
    },
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error(
        "out of device memory while {during}: {}; lower the KV budget (--kv-memory), \
         the batch size (--max-batch-tokens) or pick a smaller model",
        candle_cause(source)
    )]
    OutOfMemory {
        during: String,
        source: candle_core::Error,
    },
    #[error("model computation failed: {}", candle_cause(.0))]
    Candle(#[from] candle_core::Error),
}

/// What a candle error says, without the backtrace candle attaches to it when `RUST_BACKTRACE`
/// is set (twenty lines of frames in front of a user): the cause, in a line or two.
pub(crate) fn candle_cause(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => candle_cause(inner),
        E::Context { inner, context } => format!("{context}: {}", candle_cause(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), candle_cause(inner)),
        other => other.to_string(),
    }
}

impl ModelError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn from_config_problem(path: &Path, problem: super::ConfigProblem) -> Self {
        let path = path.to_path_buf();
        let message = problem.to_string();
        match problem {
            super::ConfigProblem::UnsupportedArchitecture { .. } => {
                ModelError::UnsupportedArchitecture { path, message }
            }
            _ => ModelError::Config { path, message },
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
