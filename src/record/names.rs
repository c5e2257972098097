//! The files and folders of a run folder, by name.

pub const CONFIG: &str = "config.toml";
pub const MANIFEST: &str = "manifest.json";
/// The cells' fixed data (a market's network, a population's make-up), one JSON line per
/// cell, appended as each population size starts.
pub const CELLS: &str = "cells.jsonl";
/// The state table's name: `state.parquet`, written in parts under `state.parts/`.
pub const STATE: &str = "state";
pub const STATE_CSV: &str = "state.csv";
/// The agents' LLM-written personas: `personas.parquet`, one row per agent of each replicate
/// of each population size, written as each population size starts.
pub const PERSONAS: &str = "personas";
/// Each group level's aggregates (`groups.parquet`): per step, per group, its place, size and
/// the mean of every numeric state column over its members. Written only when the config has
/// `[[population.groups]]`.
pub const GROUPS: &str = "groups";
pub const STATE_PARQUET: &str = "state.parquet";
pub const DECISIONS: &str = "decisions.jsonl";
/// The whole prompts of logged model decisions, once per distinct prompt (`{hash, text}`).
pub const PROMPTS: &str = "prompts.jsonl";
pub const STEPS: &str = "steps.csv";
pub const AGGREGATES: &str = "aggregates.csv";

/// The config as written, beside the config as run (`config.toml`).
pub const CONFIG_ORIGINAL: &str = "config.original.toml";
/// The folder of the copies, in a run folder.
pub const INPUTS: &str = "inputs";
/// The resolved config as the run started, beside the top-level `config.toml` readers use.
pub const STARTED_CONFIG: &str = "inputs/config.toml";
/// The store's file in a run folder.
pub const STORE: &str = "decisions.redb";
