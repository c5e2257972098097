//! LLM-written personas: the model turns each agent's sampled profile (its population
//! attributes) into a short persona, from a meta-prompt template. Personas are generated in
//! batches through the engine and kept in a cache under `$THRONG_CACHE/personas/`, keyed by
//! a hash of (profile, template, model, sampling, the agent's seed), so that later runs of the
//! same population reuse them instead of asking again.

use super::error::PolicyError;
use crate::engine::{Engine, Message, Request, SamplingParams};
use crate::sim::population::{PersonaConfig, Population};
use crate::sim::prompt::PromptBook;
use minijinja::context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize)]
struct Entry {
    key: String,
    persona: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache file of one (template, model) pair.
fn cache_file(dir: &Path, template: &str, model: &str) -> PathBuf {
    let mut h = Sha256::new();
    h.update(template.as_bytes());
    h.update([0]);
    h.update(model.as_bytes());
    dir.join(format!("{}.jsonl", &hex(&h.finalize())[..16]))
}

/// Appends whole lines to the cache under an exclusive lock, in one write. Every rank of a
/// cluster run (and any other run of the same population) may be adding the same personas
/// at once; without the lock their lines could interleave mid-line, and a torn line is a
/// persona asked for again next time. Where the file system has no locks (some network
/// mounts), the single append still keeps lines whole on local disks.
fn append_entries(file: &mut std::fs::File, lines: &str) -> std::io::Result<()> {
    let locked = file.lock().is_ok();
    let written = file.write_all(lines.as_bytes()).and_then(|()| file.flush());
    if locked {
        file.unlock()?;
    }
    written
}

/// How personas are written and where they are kept.
pub struct Writer<'a> {
    pub cfg: &'a PersonaConfig,
    /// The meta-prompt's name in the prompt book.
    pub template: &'a str,
    /// The model's name, part of the cache key.
    pub model: &'a str,
    pub cache_dir: &'a Path,
}

/// The personas the cache file at `path` holds, by key (none when it cannot be read).
fn read_cache(path: &Path) -> HashMap<String, String> {
    let mut known: HashMap<String, String> = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(path) {
        // A line cut short by a crash is skipped; its persona is asked for again.
        for entry in text
            .lines()
            .filter_map(|l| serde_json::from_str::<Entry>(l).ok())
        {
            known.insert(entry.key, entry.persona);
        }
    }
    known
}

/// Each agent's cache key: a hash of its profile, its sampling seed and the sampling settings.
fn cache_keys(cfg: &PersonaConfig, population: &Population, seed: u64) -> Vec<String> {
    (0..population.size)
        .map(|agent| {
            let mut h = Sha256::new();
            for (name, value) in population.profile(agent) {
                h.update(name.as_bytes());
                h.update([0]);
                h.update(value.to_string().as_bytes());
                h.update([0]);
            }
            h.update(crate::seed::derive(seed, &[agent as u64]).to_le_bytes());
            h.update(cfg.max_tokens.to_le_bytes());
            h.update(cfg.temperature.to_le_bytes());
            hex(&h.finalize())
        })
        .collect()
}

/// One persona per agent of `population`: from the cache where present, else written by the
/// model (and added to the cache). `seed` is the population's; agent `i` samples with
/// `derive(seed, [i])`.
pub fn write(
    engine: &mut Engine,
    prompts: &PromptBook,
    how: &Writer<'_>,
    population: &Population,
    seed: u64,
) -> Result<Vec<Box<str>>, PolicyError> {
    let Writer {
        cfg,
        template: template_name,
        model,
        cache_dir,
    } = *how;
    let template = prompts
        .source(template_name)
        .unwrap_or_default()
        .to_string();
    let path = cache_file(cache_dir, &template, model);
    let mut known = read_cache(&path);
    let keys = cache_keys(cfg, population, seed);
    let missing: Vec<usize> = (0..population.size)
        .filter(|&a| !known.contains_key(&keys[a]))
        .collect();
    if !missing.is_empty() {
        std::fs::create_dir_all(cache_dir).map_err(|source| PolicyError::Io {
            path: cache_dir.to_path_buf(),
            source,
        })?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| PolicyError::Io {
                path: path.clone(),
                source,
            })?;
        for chunk in missing.chunks(1024) {
            let requests = chunk
                .iter()
                .map(|&agent| {
                    let profile: Vec<serde_json::Value> = population
                        .profile(agent)
                        .map(|(n, v)| serde_json::json!({"name": n, "value": v.to_string()}))
                        .collect();
                    let text = prompts.render(
                        template_name,
                        &context! { profile => minijinja::Value::from(minijinja::value::Serde(&profile)) },
                    )?;
                    Ok(Request::chat(vec![Message::user(text)])
                        .with_max_tokens(cfg.max_tokens)
                        .with_sampling(SamplingParams {
                            temperature: cfg.temperature,
                            top_p: 0.95,
                            top_k: None,
                            seed: crate::seed::derive(seed, &[agent as u64]),
                        }))
                })
                .collect::<Result<Vec<_>, PolicyError>>()?;
            let mut lines = String::new();
            for (&agent, result) in chunk.iter().zip(engine.generate(requests)) {
                let persona = result?.text.trim().to_string();
                let line = serde_json::to_string(&Entry {
                    key: keys[agent].clone(),
                    persona: persona.clone(),
                })
                .expect("invariant: entries serialise");
                lines.push_str(&line);
                lines.push('\n');
                known.insert(keys[agent].clone(), persona);
            }
            append_entries(&mut file, &lines).map_err(|source| PolicyError::Io {
                path: path.clone(),
                source,
            })?;
        }
    }
    Ok(keys
        .iter()
        .map(|k| known[k].clone().into_boxed_str())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::{Entry, append_entries};

    /// Several writers (the ranks of a cluster run) adding personas to one cache at once leave
    /// only whole lines: every line reads back as an entry, none is lost or torn.
    #[test]
    fn concurrent_writers_leave_only_whole_lines() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("personas.jsonl");
        let (writers, chunks, per_chunk) = (4, 20, 25);
        std::thread::scope(|s| {
            for w in 0..writers {
                let path = &path;
                s.spawn(move || {
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .expect("the cache file opens");
                    for c in 0..chunks {
                        let mut lines = String::new();
                        for i in 0..per_chunk {
                            let entry = Entry {
                                key: format!("{w}-{c}-{i}"),
                                // Long enough that a torn write would show.
                                persona: "a persona of some length. ".repeat(200),
                            };
                            lines.push_str(&serde_json::to_string(&entry).expect("serialises"));
                            lines.push('\n');
                        }
                        append_entries(&mut file, &lines).expect("the append succeeds");
                    }
                });
            }
        });
        let text = std::fs::read_to_string(&path).expect("the cache reads back");
        let keys: std::collections::HashSet<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Entry>(l)
                    .expect("every line is a whole entry")
                    .key
            })
            .collect();
        assert_eq!(keys.len(), writers * chunks * per_chunk);
    }
}
