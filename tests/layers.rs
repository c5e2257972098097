//! Guards the layering the README's Architecture section promises, which the compiler does
//! not: `record` imports nothing of the layers above it, `sim` nothing of the model, of any
//! scenario, of the reports or of the CLI (it may use the engine's request types), `serve` reads run
//! folders through `record` alone, and `api` serves the engine knowing nothing of
//! simulations. A path into a layer above, written in code under `src/sim/`, `src/record/`,
//! `src/serve/` or `src/api/`, fails here with its file and line.

use std::path::{Path, PathBuf};

/// What each layer must not name: top-level modules of the crate.
const RULES: &[(&str, &[&str])] = &[
    ("sim", &["model", "scenarios", "cli", "analysis", "api"]),
    (
        "record",
        &[
            "sim",
            "engine",
            "model",
            "scenarios",
            "cli",
            "analysis",
            "bench",
            "quality",
            "serve",
        ],
    ),
    (
        "serve",
        &[
            "sim",
            "engine",
            "model",
            "scenarios",
            "cli",
            "analysis",
            "bench",
            "quality",
            "cluster",
            "api",
        ],
    ),
    (
        "api",
        &[
            "sim",
            "model",
            "scenarios",
            "cli",
            "analysis",
            "bench",
            "quality",
            "cluster",
        ],
    ),
];

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// How many `super::` lead from the file's module to the crate's root: `sim/plan.rs` is
/// `sim::plan` (2), `sim/mod.rs` is `sim` (1).
fn depth(file: &Path) -> usize {
    let relative = file.strip_prefix(src()).unwrap();
    let dirs = relative.components().count() - 1;
    match file.file_name().and_then(|n| n.to_str()) {
        Some("mod.rs") => dirs,
        _ => dirs + 1,
    }
}

/// The text with `//` comments blanked (doc links and prose may name any layer), line
/// breaks kept so that offsets still give lines.
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level modules `text` names through `crate::` (alone or in a `crate::{...}`
/// group) or through enough `super::` to reach the root, with the line of each.
fn named_roots(text: &str, depth: usize) -> Vec<(usize, String)> {
    let text = code(text);
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut take = |at: usize, rest: &str| {
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let name = identifier(item.trim());
                if !name.is_empty() {
                    found.push((line_of(at), name.to_string()));
                }
            }
        } else {
            found.push((line_of(at), identifier(rest).to_string()));
        }
    };
    for (at, _) in text.match_indices("crate::") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        take(at, &text[at + "crate::".len()..]);
    }
    let mut at = 0;
    while let Some(found_at) = text[at..].find("super::") {
        let start = at + found_at;
        let mut end = start;
        let mut supers = 0;
        while text[end..].starts_with("super::") {
            end += "super::".len();
            supers += 1;
        }
        if supers >= depth {
            take(start, &text[end..]);
        }
        at = end;
    }
    found
}

/// Every path from `layer`'s files into a module it must not name, as `file:line: what`.
fn offences(layer: &str, forbidden: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src().join(layer), &mut files);
    files.sort();
    assert!(!files.is_empty(), "no Rust files under src/{layer}");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, name) in named_roots(&text, depth(&file)) {
            if forbidden.contains(&name.as_str()) {
                out.push(format!(
                    "{}:{line}: {layer} imports crate::{name}",
                    file.strip_prefix(src().parent().unwrap())
                        .unwrap()
                        .display()
                ));
            }
        }
    }
    out
}

#[test]
fn lower_layers_import_nothing_above_them() {
    let mut all = Vec::new();
    for (layer, forbidden) in RULES {
        all.extend(offences(layer, forbidden));
    }
    assert!(
        all.is_empty(),
        "layers import upwards (see the README's Architecture):\n{}",
        all.join("\n")
    );
}

#[test]
// Guards the guard: a scanner that missed grouped imports or `super::` paths would let the
// test above pass whatever the code imports.
fn the_scan_sees_every_way_of_naming_a_module() {
    let text = "use crate::engine::Request;\n\
                use crate::{model::ModelConfig, sim};\n\
                // crate::cli in a comment is no import\n\
                let x = super::super::scenarios::Registry::builtin();\n\
                let y = super::policy::Llm::new();\n\
                let z = my_crate::model::X;\n";
    let names = named_roots(text, 2);
    assert_eq!(
        names,
        [
            (1, "engine".to_string()),
            (2, "model".to_string()),
            (2, "sim".to_string()),
            (4, "scenarios".to_string()),
        ]
    );
}

/// Where the Python package's Rust code names the command line (`throng::cli`), as
/// `file:line: what`: it calls the library with typed arguments, and only the `throng`
/// console script runs the command line itself (`throng::cli::main_with_args`).
fn python_cli_imports(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = code(&std::fs::read_to_string(&file).unwrap());
        for (at, _) in text.match_indices("throng::") {
            let rest = &text[at + "throng::".len()..];
            let names_cli = identifier(rest) == "cli"
                || rest.strip_prefix('{').is_some_and(|group| {
                    group
                        .split([',', '}'])
                        .any(|i| identifier(i.trim()) == "cli")
                });
            if names_cli && !rest.starts_with("cli::main_with_args") {
                out.push(format!(
                    "{}:{}: {}",
                    file.display(),
                    text[..at].matches('\n').count() + 1,
                    text[at..].lines().next().unwrap_or_default().trim()
                ));
            }
        }
    }
    out
}

#[test]
// Guards against the Python package going through the command line (clap, `--flag` strings)
// instead of the library: the CLI and the Python package are both thin adapters over it.
fn the_python_package_calls_the_library_not_the_command_line() {
    let python = src().parent().unwrap().join("python").join("src");
    let found = python_cli_imports(&python);
    assert!(
        found.is_empty(),
        "the Python package names throng::cli (only `main_with_args`, the `throng` console \
         script, may):\n{}",
        found.join("\n")
    );
}

#[test]
// Guards the guard above: it sees a path, a `use` of the module and a group naming it, and
// lets the console script's one call through.
fn the_python_scan_sees_the_command_line_however_it_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("lib.rs"),
        "use throng::cli::run::RunArgs;\n\
         use throng::{cli, engine};\n\
         // throng::cli::parse_run in a comment is no import\n\
         let code = throng::cli::main_with_args(&registry, argv);\n\
         let x = throng::cli::parse_run(args);\n",
    )
    .unwrap();
    let found = python_cli_imports(dir.path());
    let lines: Vec<&str> = found
        .iter()
        .map(|f| f.rsplit_once(".rs:").unwrap().1)
        .collect();
    assert_eq!(
        lines,
        [
            "1: throng::cli::run::RunArgs;",
            "2: throng::{cli, engine};",
            "5: throng::cli::parse_run(args);"
        ]
    );
}
