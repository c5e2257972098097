//! What a model's replies are a function of, beside the request: the weights (the sha256 of
//! the files they came from, or how they were generated), the format they became, and the
//! class of device that computes them. Two engines of the same identity give the same bits
//! for the same request, which is what lets a run reuse another's decisions.

use super::ModelError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where a model's weights came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The files read: weights, config and tokenizer.
    Files(Vec<PathBuf>),
    /// Weights made in the process (a random model of a preset's shape), as described.
    Generated(String),
}

/// A model as its replies depend on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// The sha256 of the files the model was read from, in order, or how it was generated.
    pub weights: String,
    /// What the weights were stored as and became (`GGUF (Q4_1) -> gguf a8`).
    pub format: String,
    /// The class of device computing it: `cpu:avx512`, `cpu:avx2`, `cpu:portable` (throng's
    /// CPU kernels pick their code by instruction set) or `cuda`.
    pub device: String,
    /// The type the KV cache keeps keys and values in (`F16`, `BF16`, `F32`): attention reads
    /// them back rounded to it, so another type gives other bits. Empty in the identities of
    /// stores written before it was recorded.
    #[serde(default)]
    pub kv: String,
}

impl ModelIdentity {
    pub fn new(
        origin: &Origin,
        format: &str,
        device: &candle_core::Device,
        kv: candle_core::DType,
    ) -> Result<Self, ModelError> {
        let weights = match origin {
            Origin::Generated(how) => format!("generated: {how}"),
            Origin::Files(files) => {
                let mut all = Sha256::new();
                for file in files {
                    all.update(file_digest(file)?.as_bytes());
                }
                hex(&all.finalize())
            }
        };
        Ok(Self {
            weights,
            format: format.to_string(),
            device: device_class(device),
            kv: format!("{kv:?}"),
        })
    }
}

/// The class of `device` whose computations give the same bits (see [`ModelIdentity::device`]).
pub(crate) fn device_class(device: &candle_core::Device) -> String {
    if !device.is_cpu() {
        return "cuda".into();
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "cpu:avx512".into();
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "cpu:avx2".into();
        }
    }
    format!("cpu:portable-{}", std::env::consts::ARCH)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where digests of model files are kept, by path, size and modification time, so that a
/// model of many gigabytes is hashed once per machine, not at every load.
fn digests_file() -> PathBuf {
    crate::assets::cache_dir().join("digests.json")
}

/// The sha256 of `path`, from the digests kept when the file is unchanged since.
fn file_digest(path: &Path) -> Result<String, ModelError> {
    let io = |e| ModelError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let key = format!("{}|{}|{modified}", canonical.display(), meta.len());
    let kept: BTreeMap<String, String> = std::fs::read(digests_file())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(digest) = kept.get(&key) {
        return Ok(digest.clone());
    }
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    let digest = hex(&hasher.finalize());
    // Kept for next time; a cache that cannot be written only costs the next load a hash.
    let mut kept = kept;
    kept.insert(key, digest.clone());
    if let Ok(text) = serde_json::to_vec_pretty(&kept) {
        let file = digests_file();
        let tmp = file.with_extension(format!("json.{}", std::process::id()));
        if std::fs::create_dir_all(crate::assets::cache_dir()).is_ok()
            && std::fs::write(&tmp, text).is_ok()
        {
            let _ = std::fs::rename(&tmp, &file);
        }
    }
    Ok(digest)
}
