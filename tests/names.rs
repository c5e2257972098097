//! Guards against issue 39, item 18: `RunError` and `RunOptions` meant one thing in `run/` and
//! another in `sim/runner/`, three types were called `Plan`, and `reuse`, `sizing` and
//! `counterfactual` were each two modules. A reader who meets such a name in a signature, an
//! error message or the book cannot tell which is meant. The types a layer hands to the one
//! above it (its errors, its options, its plans, what a caller gave) are named once in the
//! crate; so is every module, but for those that name a role every layer has.

mod common;

use common::sources::rust_files;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Ends of type names that make a layer's contract.
const CONTRACTS: &[&str] = &["Error", "Options", "Plan", "Settings", "Given", "Job"];

/// Module names every layer may have of its own: a role, not an idea. (`cli/<command>.rs`
/// adapts the library module of the same name, so it is not counted either.)
const ROLES: &[&str] = &[
    "mod",
    "error",
    "options",
    "config",
    "tests",
    "http",
    "files",
    "folder",
    "report",
    "render",
    "figures",
    "summary",
    "settings",
    "writer",
    "rules",
    "world",
    "decision",
    "state",
    "store",
    "schema",
    "inputs",
    "limits",
    "rows",
    "cells",
    "arms",
    "scripted",
    "population",
    "chat",
    "batch",
    "workload",
    "assets",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    rust_files(root, &mut out);
    out
}

/// `(name, file:line)` of every type a module of `src/` declares (any visibility).
fn declared_types() -> Vec<(String, String)> {
    let root = src();
    let mut out = Vec::new();
    for file in files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            // Items of the module itself: an associated `type Error` of an impl, or a type
            // local to a test module, is indented.
            if line.starts_with(char::is_whitespace) {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words
                .iter()
                .position(|w| matches!(*w, "struct" | "enum" | "trait" | "type"));
            let Some(at) = at else { continue };
            // A declaration: only visibility words before the keyword.
            if !words[..at].iter().all(|w| w.starts_with("pub")) {
                continue;
            }
            let Some(name) = words.get(at + 1) else {
                continue;
            };
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with(|c: char| c.is_uppercase()) {
                let place = format!("{}:{}", file.strip_prefix(&root).unwrap().display(), i + 1);
                out.push((name, place));
            }
        }
    }
    out
}

fn twice(named: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, place) in named {
        by_name.entry(name).or_default().push(place);
    }
    by_name
        .into_iter()
        .filter(|(_, places)| places.len() > 1)
        .map(|(name, places)| format!("{name}: {}", places.join(", ")))
        .collect()
}

#[test]
fn a_layers_errors_options_and_plans_are_named_once_in_the_crate() {
    let contracts = declared_types()
        .into_iter()
        .filter(|(name, _)| CONTRACTS.iter().any(|end| name.ends_with(end)));
    let twice = twice(contracts);
    assert!(
        twice.is_empty(),
        "names given to two types (rename one for what it is):\n{}",
        twice.join("\n")
    );
}

#[test]
fn a_module_is_named_once_in_the_crate_unless_its_name_is_a_role() {
    let root = src();
    let modules = files(&root).into_iter().filter_map(|file| {
        let stem = file.file_stem()?.to_str()?.to_string();
        // `x/mod.rs` is module `x`.
        let name = if stem == "mod" {
            file.parent()?.file_name()?.to_str()?.to_string()
        } else {
            stem
        };
        let place = file.strip_prefix(&root).ok()?.display().to_string();
        // `cli/run.rs` is the command line of `run`: the same idea, by design.
        let adapter = place.starts_with("cli/");
        (!adapter && !ROLES.contains(&name.as_str())).then_some((name, place))
    });
    let twice = twice(modules);
    assert!(
        twice.is_empty(),
        "module names used twice (name each for what it holds):\n{}",
        twice.join("\n")
    );
}

// Guards against issue 39, item 20: 33 signatures returned `Result<_, String>`, so that a
// caller could neither match a failure nor find its cause. The library's and the Python
// package's functions return typed errors; the command line (`src/cli/`), the edge where
// anyhow and clap's value parsers take text, may return text.
#[test]
fn the_library_returns_typed_errors_not_text() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut offences = Vec::new();
    for dir in ["src", "python/src"] {
        for file in files(&root.join(dir)) {
            let shown = file.strip_prefix(root).unwrap().display().to_string();
            if shown.starts_with("src/cli/") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (i, line) in text.lines().enumerate() {
                let returns = line.split("-> Result<").nth(1);
                if let Some(rest) = returns
                    && rest
                        .trim_end()
                        .trim_end_matches('{')
                        .trim_end()
                        .ends_with(", String>")
                {
                    offences.push(format!("{shown}:{}: {}", i + 1, line.trim()));
                }
                if line.contains("type Error = String;") {
                    offences.push(format!("{shown}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "functions that fail with text (give each layer its error type):\n{}",
        offences.join("\n")
    );
}
