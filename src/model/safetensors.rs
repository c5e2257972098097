//! Hugging Face checkpoint folders: `config.json` plus one or many memory-mapped
//! `*.safetensors` shards.

use super::error::candle_cause;
use super::linear::SourceWeight;
use super::llama::{Part, WeightSource};
use super::{ModelConfig, ModelError};
use candle_core::Device;
use candle_core::safetensors::MmapedSafetensors;
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

pub(crate) struct SafetensorsSource {
    dir: PathBuf,
    files: MmapedSafetensors,
    names: HashSet<String>,
}

impl SafetensorsSource {
    /// Maps the shards of the checkpoint in `dir`: those listed by
    /// `model.safetensors.index.json` when it exists, else every `*.safetensors` file.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let shards = shard_paths(dir)?;
        for shard in &shards {
            if !shard.is_file() {
                return Err(ModelError::corrupt(
                    dir,
                    format!(
                        "shard {} listed in model.safetensors.index.json is missing; download it again",
                        shard.display()
                    ),
                ));
            }
        }
        // SAFETY: the files are mapped read-only and throng never writes to them; as with
        // every memory-mapped loader, another process truncating them meanwhile is undefined.
        let files = unsafe { MmapedSafetensors::multi(&shards) }.map_err(|e| {
            ModelError::corrupt(
                dir,
                format!("cannot read safetensors: {}", candle_cause(&e)),
            )
        })?;
        let names = files.tensors().into_iter().map(|(name, _)| name).collect();
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            names,
        })
    }
}

pub(crate) fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::corrupt(&index, format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::corrupt(&index, "no `weight_map` object"))?;
        let files: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(ModelError::corrupt(
            dir,
            "no *.safetensors file: a Hugging Face model folder needs config.json and its weights",
        ));
    }
    Ok(shards)
}

impl WeightSource for SafetensorsSource {
    fn get(&mut self, part: Part, cfg: &ModelConfig) -> Result<SourceWeight, ModelError> {
        let name = part.hf_name();
        if !self.names.contains(&name) {
            return Err(ModelError::MissingTensor {
                path: self.dir.clone(),
                name,
            });
        }
        let tensor = self.files.load(&name, &Device::Cpu).map_err(|e| {
            ModelError::corrupt(&self.dir, format!("tensor `{name}`: {}", candle_cause(&e)))
        })?;
        let expected = part.shape(cfg);
        if tensor.dims() != expected.as_slice() {
            return Err(ModelError::TensorShape {
                path: self.dir.clone(),
                name,
                found: tensor.dims().to_vec(),
                expected,
            });
        }
        Ok(SourceWeight::Dense(tensor))
    }

    fn contains(&self, part: Part) -> bool {
        self.names.contains(&part.hf_name())
    }
}
