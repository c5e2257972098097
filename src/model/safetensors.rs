//! Hugging Face checkpoint folders: `config.json` plus one or many memory-mapped
//! `*.safetensors` shards.

use super::error::candle_cause;
use super::linear::SourceWeight;
use super::llama::{Part, WeightSource};
use super::{ModelConfig, ModelError};
use super::{files, finite};
use candle_core::Device;
use candle_core::safetensors::MmapedSafetensors;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

pub(crate) struct SafetensorsSource {
    dir: PathBuf,
    files: MmapedSafetensors,
    names: HashSet<String>,
    /// The shard of each tensor, as the index lists them (or the one shard of all).
    shard_of: HashMap<String, PathBuf>,
}

impl SafetensorsSource {
    /// Maps the shards of the checkpoint in `dir`: those listed by
    /// `model.safetensors.index.json` when it exists, else every `*.safetensors` file.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let shards = shard_paths(dir)?;
        let indexed = dir.join(INDEX).exists();
        for shard in &shards {
            // Opened once here (without blocking, regular files only) so that a FIFO cannot
            // hang the mapping below and a folder or a missing shard is named as what it is.
            match files::open_regular(shard) {
                Ok(_) => {}
                Err(e) if files::is_not_found(&e) => {
                    let why = match std::fs::read_link(shard) {
                        Ok(target) => format!(
                            "is a symbolic link to {}, which does not exist",
                            target.display()
                        ),
                        Err(_) if indexed => format!("is listed in {INDEX} but missing"),
                        Err(_) => "is missing".to_string(),
                    };
                    return Err(ModelError::corrupt(
                        dir,
                        format!("shard {} {why}; download the model again", shard.display()),
                    ));
                }
                Err(e) => return Err(e),
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
        let names: HashSet<String> = files.tensors().into_iter().map(|(name, _)| name).collect();
        let shard_of = match (shards.as_slice(), index_map(dir)?) {
            ([one], _) => names.iter().map(|n| (n.clone(), one.clone())).collect(),
            (_, Some(map)) => map
                .into_iter()
                .filter_map(|(name, file)| Some((name, dir.join(file.as_str()?))))
                .collect(),
            _ => HashMap::new(),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            names,
            shard_of,
        })
    }
}

/// The index of a sharded checkpoint: which shard holds each tensor.
const INDEX: &str = "model.safetensors.index.json";

/// The index's `weight_map` (tensor name -> shard file name), when the folder has an index.
fn index_map(dir: &Path) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ModelError> {
    let index = dir.join(INDEX);
    let Some(text) = files::read_optional_text(&index)? else {
        return Ok(None);
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::corrupt(&index, format!("not JSON: {e}")))?;
    match json {
        serde_json::Value::Object(mut o) => match o.remove("weight_map") {
            Some(serde_json::Value::Object(map)) => Ok(Some(map)),
            _ => Err(ModelError::corrupt(&index, "no `weight_map` object")),
        },
        _ => Err(ModelError::corrupt(&index, "no `weight_map` object")),
    }
}

pub(crate) fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join(INDEX);
    if let Some(map) = index_map(dir)? {
        let files: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        return files
            .into_iter()
            .map(|f| shard_inside(dir, &index, f))
            .collect();
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

/// The shard `name` of the index `index` in the model folder `dir`, refused unless it lies in
/// that folder: an index names shards by their file names, and one that leads elsewhere (`..`,
/// an absolute path, a symbolic link that leaves the folder) would have throng map whatever
/// file it names. The one way out allowed is the Hugging Face cache's own: a snapshot's files
/// are links into the repository's `blobs` folder beside `snapshots`.
fn shard_inside(dir: &Path, index: &Path, name: &str) -> Result<PathBuf, ModelError> {
    use std::path::Component;
    let refuse = |why: String| {
        ModelError::corrupt(
            index,
            format!(
                "`weight_map` names the shard {name:?}, which {why}: an index names shards inside \
                 the model folder; put the shard in the folder and name it by its file name"
            ),
        )
    };
    let relative = Path::new(name);
    let inside = |c: Component| matches!(c, Component::Normal(_) | Component::CurDir);
    if name.is_empty() || !relative.components().all(inside) {
        return Err(refuse(
            "is not a file name inside the folder (it is empty, absolute, or climbs out with `..`)"
                .into(),
        ));
    }
    let path = dir.join(relative);
    // A shard that is not there is reported as missing when the folder is opened.
    let Ok(real) = path.canonicalize() else {
        return Ok(path);
    };
    let home = dir.canonicalize().map_err(|e| ModelError::io(dir, e))?;
    let blobs = (home.parent().and_then(Path::file_name) == Some("snapshots".as_ref()))
        .then(|| home.parent()?.parent().map(|repo| repo.join("blobs")))
        .flatten();
    if real.starts_with(&home) || blobs.is_some_and(|b| real.starts_with(b)) {
        Ok(path)
    } else {
        Err(refuse(format!(
            "is a symbolic link out of the model folder, to {}",
            real.display()
        )))
    }
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
        let file = self.shard_of.get(&name).unwrap_or(&self.dir);
        finite::check_dense(file, &name, &tensor)?;
        Ok(SourceWeight::Dense(tensor))
    }

    fn contains(&self, part: Part) -> bool {
        self.names.contains(&part.hf_name())
    }
}
