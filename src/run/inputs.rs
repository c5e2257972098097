//! What a new run reads, written into its folder before it starts: the config as run and a
//! copy of every prompt template.

use super::error::{RunError, refuse};
use crate::record;
use crate::scenarios::Registry;
use crate::sim::experiment::Experiment;
use std::collections::BTreeMap;
use std::path::Path;

/// What a new run reads, resolved before its folder is written: `config.toml`, the experiment
/// as run (command-line overrides applied), so that `--resume` and readers need nothing else;
/// and a copy of every prompt template, which `config.toml` points at (under `inputs/`), so
/// that a resume runs the templates the run started with, whatever happens to the originals.
pub struct Inputs {
    /// `config.toml`'s text.
    config: String,
    /// The config file as written, before overrides.
    original: String,
    /// Each template's path in the folder and its text.
    templates: Vec<(String, String)>,
}

impl Inputs {
    pub fn of(registry: &Registry, exp: &Experiment) -> Result<Self, RunError> {
        let folder = Path::new(record::inputs::INPUTS).join("templates");
        let templates = registry
            .prompts(exp)?
            .templates()
            .map(|(name, text)| {
                let path = folder.join(format!("{name}.jinja"));
                (path.display().to_string(), text.to_string())
            })
            .collect();
        let mut table: toml::Table = toml::from_str(&exp.source.text)?;
        let c = &exp.config;
        table.insert(
            "replicates".into(),
            toml::Value::Integer(c.replicates.0 as i64),
        );
        table.insert("steps".into(), toml::Value::Integer(c.steps.0 as i64));
        table.insert("policy".into(), toml::Value::String(c.policy.name().into()));
        table.insert(
            "agents".into(),
            toml::Value::Array(
                c.agents
                    .0
                    .iter()
                    .map(|&a| toml::Value::Integer(a as i64))
                    .collect(),
            ),
        );
        table.insert(
            "templates".into(),
            toml::Value::String(folder.display().to_string()),
        );
        let llm = table
            .entry("llm")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(llm) = llm {
            llm.insert(
                "model".into(),
                toml::Value::String(super::settings::model_of(exp)),
            );
        }
        Ok(Self {
            config: toml::to_string_pretty(&table)?,
            original: exp.source.text.clone(),
            templates,
        })
    }

    /// The sha256 of each file the run reads, as the manifest keeps them.
    pub fn fingerprints(&self) -> BTreeMap<String, String> {
        std::iter::once((record::CONFIG.to_string(), &self.config))
            .chain(
                self.templates
                    .iter()
                    .map(|(path, text)| (path.clone(), text)),
            )
            .map(|(path, text)| (path, record::inputs::fingerprint(text.as_bytes())))
            .collect()
    }

    /// Writes the copies first and `config.toml` last, so that a folder with a `config.toml`
    /// holds every input.
    pub fn write(&self, dir: &Path) -> Result<(), RunError> {
        let write = |file: &str, text: &str| -> Result<(), RunError> {
            let path = dir.join(file);
            if let Some(parent) = path.parent()
                && let Err(e) = std::fs::create_dir_all(parent)
            {
                refuse!("{}: {e}", parent.display());
            }
            if let Err(e) = std::fs::write(&path, text) {
                refuse!("{}: {e}", path.display());
            }
            Ok(())
        };
        for (path, text) in &self.templates {
            write(path, text)?;
        }
        write(record::inputs::STARTED_CONFIG, &self.config)?;
        write(record::CONFIG_ORIGINAL, &self.original)?;
        write(record::CONFIG, &self.config)
    }
}
