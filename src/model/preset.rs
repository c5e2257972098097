//! Named models (`--model llama-3.2-3b-instruct`), one TOML file each under `models/`,
//! compiled into the binary so that it runs from any directory. Each states where the model
//! comes from and, in its `[config]` table, the model's shape as its `config.json` has it, so
//! that `throng plan` can size a model whose weights are not on this machine.

use super::ModelConfig;
use serde::Deserialize;

/// The model a plain `throng run` uses: small, open, and runnable on a laptop CPU.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

const BUILTIN: [(&str, &str); 12] = [
    (
        "smollm2-135m-instruct",
        include_str!("../../models/smollm2-135m-instruct.toml"),
    ),
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
        "llama-3-8b-instruct",
        include_str!("../../models/llama-3-8b-instruct.toml"),
    ),
    (
        "qwen2.5-0.5b-instruct",
        include_str!("../../models/qwen2.5-0.5b-instruct.toml"),
    ),
    (
        "qwen2.5-7b-instruct",
        include_str!("../../models/qwen2.5-7b-instruct.toml"),
    ),
    (
        "qwen2-7b-instruct",
        include_str!("../../models/qwen2-7b-instruct.toml"),
    ),
    (
        "qwen2-72b-instruct",
        include_str!("../../models/qwen2-72b-instruct.toml"),
    ),
    (
        "mistral-7b-instruct",
        include_str!("../../models/mistral-7b-instruct.toml"),
    ),
    (
        "mixtral-8x7b-instruct",
        include_str!("../../models/mixtral-8x7b-instruct.toml"),
    ),
    (
        "mixtral-8x22b-instruct",
        include_str!("../../models/mixtral-8x22b-instruct.toml"),
    ),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub name: String,
    pub description: String,
    pub source: PresetSource,
    /// The model's shape as the preset states it (its `config.json`'s essential fields),
    /// validated: what `throng plan` sizes the model by when its weights are not here. The
    /// loader reads the real `config.json` of the downloaded model, never this.
    pub config: ModelConfig,
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
    /// `config.json`'s fields, as TOML.
    config: serde_json::Value,
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
                    let config = ModelConfig::from_hf_json(&raw.config)
                        .expect("invariant: presets' configs are checked by the tests");
                    Preset {
                        name: name.to_string(),
                        description: raw.description,
                        source: raw.source,
                        config,
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
        for (name, repo) in [
            ("llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
            ("qwen2-7b-instruct", "Qwen/Qwen2-7B-Instruct"),
            ("qwen2-72b-instruct", "Qwen/Qwen2-72B-Instruct"),
            ("qwen2.5-0.5b-instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
            ("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct"),
            ("mistral-7b-instruct", "mistralai/Mistral-7B-Instruct-v0.3"),
            (
                "mixtral-8x7b-instruct",
                "mistralai/Mixtral-8x7B-Instruct-v0.1",
            ),
            (
                "mixtral-8x22b-instruct",
                "mistralai/Mixtral-8x22B-Instruct-v0.1",
            ),
        ] {
            assert_eq!(
                presets.get(name).unwrap().source,
                PresetSource::Hub {
                    hub: repo.into(),
                    revision: "main".into()
                },
                "{name}"
            );
        }
        // Gated repositories say so, with what to do.
        for preset in presets.iter() {
            let gated = matches!(&preset.source, PresetSource::Hub { hub, .. }
                if hub.starts_with("meta-llama/") || hub.starts_with("mistralai/Mistral-"));
            assert_eq!(
                preset.description.contains("gated"),
                gated,
                "{}",
                preset.name
            );
        }
    }

    #[test]
    // Guards the stated shapes against typos: every preset's parameter count is its model's
    // published size (model cards; Mistral AI for the mixtures' totals and per-token counts),
    // within 1.5%, and its family is the one its name says.
    fn presets_state_their_models_published_sizes() {
        use crate::model::Family;
        // name, family, billions of parameters in all, and multiplied per token (mixtures).
        let published = [
            ("smollm2-135m-instruct", Family::Llama, 0.135, None),
            ("llama-3.2-1b-instruct", Family::Llama, 1.24, None),
            ("llama-3.2-3b-instruct", Family::Llama, 3.21, None),
            ("llama-3.1-8b-instruct", Family::Llama, 8.03, None),
            ("llama-3-8b-instruct", Family::Llama, 8.03, None),
            ("qwen2.5-0.5b-instruct", Family::Qwen2, 0.49, None),
            ("qwen2.5-7b-instruct", Family::Qwen2, 7.61, None),
            ("qwen2-7b-instruct", Family::Qwen2, 7.6, None),
            ("qwen2-72b-instruct", Family::Qwen2, 72.7, None),
            ("mistral-7b-instruct", Family::Mistral, 7.25, None),
            ("mixtral-8x7b-instruct", Family::Mixtral, 46.7, Some(12.9)),
            ("mixtral-8x22b-instruct", Family::Mixtral, 141.0, Some(39.0)),
        ];
        let presets = Presets::builtin();
        assert_eq!(
            presets.iter().count(),
            published.len(),
            "a preset without a size"
        );
        let near = |found: u64, billions: f64| (found as f64 / 1e9 / billions - 1.0).abs() < 0.015;
        for (name, family, total, active) in published {
            let cfg = &presets.get(name).unwrap_or_else(|| panic!("{name}")).config;
            assert_eq!(cfg.family, family, "{name}");
            let found = cfg.parameters();
            assert!(
                near(found, total),
                "{name}: {found} parameters, published {total} B"
            );
            let active = active.unwrap_or(total);
            let found = cfg.active_parameters();
            assert!(
                near(found, active),
                "{name}: {found} per token, published {active} B"
            );
            assert_eq!(cfg.experts.is_some(), family == Family::Mixtral, "{name}");
        }
        // Only Mistral v0.1 slides a window; these all attend to every earlier token.
        assert!(presets.iter().all(|p| p.config.sliding_window.is_none()));
    }
}
