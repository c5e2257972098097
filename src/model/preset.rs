//! Named models (`--model llama-3.2-3b-instruct`), one TOML file each under `models/`,
//! compiled into the binary so that it runs from any directory.

use serde::Deserialize;

/// The model a plain `throng run` uses: small, open, and runnable on a laptop CPU.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

const BUILTIN: [(&str, &str); 4] = [
    (
        "llama-3.2-1b-instruct",
        include_str!("../../models/llama-3.2-1b-instruct.toml"),
    ),
    (
        "llama-3.2-3b-instruct",
        include_str!("../../models/llama-3.2-3b-instruct.toml"),
    ),
    (
        "llama-3.1-8b-instruct",
        include_str!("../../models/llama-3.1-8b-instruct.toml"),
    ),
    (
        "smollm2-135m-instruct",
        include_str!("../../models/smollm2-135m-instruct.toml"),
    ),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub name: String,
    pub description: String,
    pub source: PresetSource,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum PresetSource {
    /// A Hugging Face repository, resolved through the local cache first.
    Hub { hub: String, revision: String },
    /// A file of one of throng's downloadable assets (`models/assets.toml`).
    Asset { asset: String, file: String },
}

#[derive(Deserialize)]
struct RawPreset {
    description: String,
    #[serde(flatten)]
    source: PresetSource,
}

/// The built-in presets.
#[derive(Debug, Clone)]
pub struct Presets(Vec<Preset>);

impl Presets {
    pub fn builtin() -> Self {
        Presets(
            BUILTIN
                .iter()
                .map(|(name, text)| {
                    let raw: RawPreset =
                        toml::from_str(text).expect("invariant: presets are checked by the tests");
                    Preset {
                        name: name.to_string(),
                        description: raw.description,
                        source: raw.source,
                    }
                })
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Option<&Preset> {
        self.0.iter().find(|p| p.name == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Preset> {
        self.0.iter()
    }

    pub fn names(&self) -> String {
        self.0
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_models_is_a_builtin_preset() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let presets = Presets::builtin();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy().to_string();
            if path.extension().is_some_and(|e| e == "toml") && stem != "assets" {
                assert!(
                    presets.get(&stem).is_some(),
                    "models/{stem}.toml is not compiled in"
                );
            }
        }
        assert!(presets.get(DEFAULT_MODEL).is_some());
    }

    #[test]
    fn presets_point_at_the_expected_sources() {
        let presets = Presets::builtin();
        assert_eq!(
            presets.get("llama-3.2-3b-instruct").unwrap().source,
            PresetSource::Hub {
                hub: "meta-llama/Llama-3.2-3B-Instruct".into(),
                revision: "main".into()
            }
        );
        assert!(matches!(
            presets.get("smollm2-135m-instruct").unwrap().source,
            PresetSource::Asset { .. }
        ));
    }
}
