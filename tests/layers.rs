//! Guards the layering the book's Architecture chapter (docs/src/architecture.md) promises, which
//! the compiler does not: the engine and the model know no simulation, no run folder and no
//! report, `record` imports nothing of the layers above it, `sim` nothing of the model, of any
//! scenario, of the reports, of the CLI or of the earlier runs' stores (it may use the engine's
//! request types, and looks replies up through the engine's `KnownReplies`), the reports
//! (`analysis`) read records and know no scenario, `serve` reads run folders through `record`
//! alone, `api` serves the engine knowing nothing of simulations, and `bench` measures the
//! engine and the model without the simulation. A path into a layer above, written in code
//! under one of those layers, fails here with its file and line.

mod common;

use common::sources::rust_files;
use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each layer must not name: top-level modules of the crate.
const RULES: &[(&str, &[&str])] = &[
    (
        "engine",
        &[
            "sim",
            "record",
            "reuse",
            "run",
            "plan",
            "scenarios",
            "cli",
            "analysis",
            "bench",
            "quality",
            "serve",
            "cluster",
            "api",
            "generate",
        ],
    ),
    (
        "model",
        &[
            "engine",
            "sim",
            "record",
            "reuse",
            "run",
            "plan",
            "scenarios",
            "cli",
            "analysis",
            "bench",
            "quality",
            "serve",
            "cluster",
            "api",
            "generate",
        ],
    ),
    (
        "analysis",
        &[
            "sim",
            "engine",
            "model",
            "reuse",
            "run",
            "plan",
            "scenarios",
            "cli",
            "bench",
            "quality",
            "serve",
            "cluster",
            "api",
        ],
    ),
    (
        "sim",
        &["model", "reuse", "scenarios", "cli", "analysis", "api"],
    ),
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
        "bench",
        &[
            "sim",
            "scenarios",
            "cli",
            "analysis",
            "quality",
            "serve",
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

/// How many `super::` lead from the file's module to the crate's root: `sim/footprint.rs` is
/// `sim::footprint` (2), `sim/mod.rs` is `sim` (1).
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

/// The modules of the crate's root that are one file (`src/seed.rs`, not a folder), by
/// name, with the top-level modules each names.
fn root_files() -> BTreeMap<String, Vec<String>> {
    std::fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_string();
            if name == "lib" || name == "main" {
                return None;
            }
            let text = std::fs::read_to_string(&p).ok()?;
            let names = named_roots(&text, 1).into_iter().map(|(_, n)| n).collect();
            Some((name, names))
        })
        .collect()
}

/// The forbidden module `name` leads to through the crate's one-file modules (itself, if it
/// is forbidden): `sim` naming `crate::reuse`, which names `crate::model`, reaches `model`.
fn reached<'a>(
    name: &'a str,
    forbidden: &[&str],
    roots: &'a BTreeMap<String, Vec<String>>,
    seen: &mut Vec<&'a str>,
) -> Option<Vec<&'a str>> {
    if seen.contains(&name) {
        return None;
    }
    seen.push(name);
    if forbidden.contains(&name) {
        return Some(vec![name]);
    }
    for next in roots.get(name)? {
        if let Some(mut path) = reached(next, forbidden, roots, seen) {
            path.insert(0, name);
            return Some(path);
        }
    }
    None
}

/// Every path from `layer`'s files into a module it must not name, directly or through the
/// crate's one-file modules, as `file:line: what`.
fn offences(layer: &str, forbidden: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src().join(layer), &mut files);
    files.sort();
    assert!(!files.is_empty(), "no Rust files under src/{layer}");
    let roots = root_files();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, name) in named_roots(&text, depth(&file)) {
            let Some(path) = reached(&name, forbidden, &roots, &mut Vec::new()) else {
                continue;
            };
            let through: String = path.iter().map(|n| format!(" -> crate::{n}")).collect();
            out.push(format!(
                "{}:{line}: {layer} imports{through}",
                file.strip_prefix(src().parent().unwrap())
                    .unwrap()
                    .display()
            ));
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
        "layers import upwards (see docs/src/architecture.md):\n{}",
        all.join("\n")
    );
}

// Guards against issue 39, item 21: `sim` reached `model` through `src/reuse.rs`, a file at
// the crate's root, which the per-layer scan did not follow.
#[test]
fn a_layer_reaches_what_the_crates_one_file_modules_it_names_import() {
    let roots: BTreeMap<String, Vec<String>> = [
        (
            "reuse".to_string(),
            vec!["engine".to_string(), "model".to_string()],
        ),
        ("seed".to_string(), vec![]),
        ("host".to_string(), vec!["reuse".to_string()]),
    ]
    .into();
    let forbidden = ["model", "cli"];
    assert_eq!(
        reached("host", &forbidden, &roots, &mut Vec::new()),
        Some(vec!["host", "reuse", "model"])
    );
    assert_eq!(reached("seed", &forbidden, &roots, &mut Vec::new()), None);
    assert_eq!(reached("engine", &forbidden, &roots, &mut Vec::new()), None);
    assert_eq!(
        reached("cli", &forbidden, &roots, &mut Vec::new()),
        Some(vec!["cli"])
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

// Import circles between the files of one module. A module's files form a graph: a file
// names a sibling (`super::footprint::Footprint`, `crate::sim::footprint`, `use super::{footprint, ...}`, a
// bare `footprint::` in `mod.rs`), and the module's own file (`mod.rs`, `lib.rs` or `x.rs` beside
// `x/`) is a node too: a sibling naming `super::Thing` that the module's file defines names
// that file, and one naming a `Thing` the module's file re-exports (`pub use plan::Thing`)
// names where it comes from. A sub-folder is one node of its parent's graph. A circle means
// neither side can be read, tested or moved without the other: the types both need belong
// in a file of their own below both.

/// A module path below the crate's root: `["sim", "footprint"]` for `crate::sim::footprint`.
type ModPath = Vec<String>;

/// The module a file of `src/` holds; `None` for `main.rs`, the binary's own crate.
fn module_of(file: &Path) -> Option<ModPath> {
    let relative = file.strip_prefix(src()).unwrap();
    let mut parts: ModPath = relative
        .iter()
        .map(|c| c.to_str().unwrap().to_string())
        .collect();
    let name = parts.pop().unwrap();
    match name.as_str() {
        "main.rs" if parts.is_empty() => None,
        "lib.rs" if parts.is_empty() => Some(parts),
        "mod.rs" => Some(parts),
        _ => {
            parts.push(name.trim_end_matches(".rs").to_string());
            Some(parts)
        }
    }
}

/// One path a file names, resolved to the crate's root, with its line.
struct Named {
    line: usize,
    path: ModPath,
}

/// What a file names, and the names its own `use` declarations bring into its module (what
/// a child's `super::Thing` may mean).
#[derive(Default)]
struct Scan {
    named: Vec<Named>,
    imports: BTreeMap<String, ModPath>,
}

/// The crate's modules, each with its file's name (from the crate's folder) and text.
struct Crate {
    files: BTreeMap<ModPath, (String, String)>,
    children: BTreeMap<ModPath, BTreeSet<String>>,
}

impl Crate {
    fn read() -> Self {
        let mut paths = Vec::new();
        rust_files(&src(), &mut paths);
        Self::new(paths.into_iter().filter_map(|file| {
            let module = module_of(&file)?;
            let name = file.strip_prefix(src().parent().unwrap()).unwrap();
            let text = std::fs::read_to_string(&file).unwrap();
            Some((module, name.display().to_string(), text))
        }))
    }

    fn new(files: impl IntoIterator<Item = (ModPath, String, String)>) -> Self {
        let mut by_module = BTreeMap::new();
        let mut children: BTreeMap<ModPath, BTreeSet<String>> = BTreeMap::new();
        for (module, name, text) in files {
            if let Some((last, parent)) = module.split_last() {
                children
                    .entry(parent.to_vec())
                    .or_default()
                    .insert(last.clone());
            }
            by_module.insert(module, (name, text));
        }
        Self {
            files: by_module,
            children,
        }
    }

    /// The folder of `module`'s files: `src/sim/runner/`, `src/model/attention/`.
    fn folder(&self, module: &[String]) -> String {
        let name = &self.files[module].0;
        match name.rsplit_once('/') {
            Some((dir, "mod.rs" | "lib.rs")) => format!("{dir}/"),
            _ => format!("{}/", name.trim_end_matches(".rs")),
        }
    }

    /// How a report names a node of `module`'s graph: a file, or a sub-module's folder.
    fn node_name(&self, module: &[String], node: &Node) -> String {
        let mut path = module.to_vec();
        path.extend(node.iter().cloned());
        let name = &self.files[&path].0;
        match (node, name.strip_suffix("mod.rs")) {
            (Some(_), Some(folder)) => folder.to_string(),
            _ => name.clone(),
        }
    }

    fn is_child(&self, module: &[String], name: &str) -> bool {
        self.children.get(module).is_some_and(|c| c.contains(name))
    }

    /// `segments` (as written, `super::super::plan::X`) from `here` (the file's module and any
    /// inline modules around the path) to the crate's root; `None` for another crate's paths
    /// and names a `use` brought in.
    fn resolve(&self, here: &[String], segments: &[String]) -> Option<ModPath> {
        let (first, rest) = segments.split_first()?;
        let mut base = here.to_vec();
        let rest = match first.as_str() {
            "crate" | "$crate" => {
                base.clear();
                rest
            }
            "self" => rest,
            "super" => {
                base.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                rest
            }
            name if self.is_child(here, name) => segments,
            _ => return None,
        };
        base.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(base)
    }
}

fn is_punct(tree: Option<&TokenTree>, ch: char) -> bool {
    matches!(tree, Some(TokenTree::Punct(p)) if p.as_char() == ch)
}

/// Whether `trees[at..]` starts with `::`.
fn is_path_sep(trees: &[TokenTree], at: usize) -> bool {
    matches!(trees.get(at), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
        && is_punct(trees.get(at + 1), ':')
}

/// The leaves of a `use` tree: each full path as written and the name it binds (`None` for
/// a glob).
fn use_leaves(trees: &[TokenTree], prefix: &[String], out: &mut Vec<(ModPath, Option<String>)>) {
    let mut path = prefix.to_vec();
    let mut at = 0;
    if is_path_sep(trees, at) {
        at += 2;
    }
    loop {
        match trees.get(at) {
            Some(TokenTree::Ident(ident)) => {
                let name = ident.to_string();
                path.push(name);
                at += 1;
            }
            Some(TokenTree::Punct(p)) if p.as_char() == '$' => {
                at += 1;
                continue;
            }
            Some(TokenTree::Punct(p)) if p.as_char() == '*' => {
                out.push((path, None));
                return;
            }
            Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                for item in inner.split(|t| is_punct(Some(t), ',')) {
                    if !item.is_empty() {
                        use_leaves(item, &path, out);
                    }
                }
                return;
            }
            _ => return,
        }
        if is_path_sep(trees, at) {
            at += 2;
            continue;
        }
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        let alias = match (trees.get(at), trees.get(at + 1)) {
            (Some(TokenTree::Ident(kw)), Some(TokenTree::Ident(alias))) if kw == "as" => {
                alias.to_string()
            }
            _ => path.last().cloned().unwrap_or_default(),
        };
        out.push((path, Some(alias)));
        return;
    }
}

/// Walks `trees` in module `here` (the file's module, then any inline `mod x { }`), adding
/// every path into the crate to `scan`; `top` is whether `here` is the file's module.
fn scan_trees(krate: &Crate, trees: &[TokenTree], here: &[String], top: bool, scan: &mut Scan) {
    let mut at = 0;
    while at < trees.len() {
        let tree = &trees[at];
        let after_sep = at >= 2 && is_path_sep(trees, at - 2);
        match tree {
            TokenTree::Ident(ident) if ident == "use" => {
                let end = trees[at..]
                    .iter()
                    .position(|t| is_punct(Some(t), ';'))
                    .map_or(trees.len(), |p| at + p);
                let mut leaves = Vec::new();
                use_leaves(&trees[at + 1..end], &[], &mut leaves);
                let line = ident.span().start().line;
                for (written, alias) in leaves {
                    let Some(path) = krate.resolve(here, &written) else {
                        continue;
                    };
                    if top && let Some(alias) = alias {
                        scan.imports.insert(alias, path.clone());
                    }
                    scan.named.push(Named { line, path });
                }
                at = end + 1;
            }
            TokenTree::Ident(ident)
                if ident == "mod"
                    && matches!(trees.get(at + 2), Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace) =>
            {
                let (Some(TokenTree::Ident(name)), Some(TokenTree::Group(body))) =
                    (trees.get(at + 1), trees.get(at + 2))
                else {
                    unreachable!()
                };
                let mut inner = here.to_vec();
                inner.push(name.to_string());
                let body: Vec<TokenTree> = body.stream().into_iter().collect();
                scan_trees(krate, &body, &inner, false, scan);
                at += 3;
            }
            TokenTree::Ident(ident) if !after_sep && is_path_sep(trees, at + 1) => {
                let dollar = at > 0 && is_punct(trees.get(at - 1), '$');
                let mut written = vec![if dollar {
                    format!("${ident}")
                } else {
                    ident.to_string()
                }];
                let mut end = at + 1;
                while is_path_sep(trees, end) {
                    match trees.get(end + 2) {
                        Some(TokenTree::Ident(next)) => {
                            written.push(next.to_string());
                            end += 3;
                        }
                        _ => break,
                    }
                }
                if let Some(path) = krate.resolve(here, &written) {
                    let line = ident.span().start().line;
                    scan.named.push(Named { line, path });
                }
                at = end;
            }
            TokenTree::Group(group) => {
                let inner: Vec<TokenTree> = group.stream().into_iter().collect();
                scan_trees(krate, &inner, here, top, scan);
                at += 1;
            }
            _ => at += 1,
        }
    }
}

fn scan_file(krate: &Crate, module: &[String]) -> Scan {
    let (name, text) = &krate.files[module];
    let stream: TokenStream = text.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
    let trees: Vec<TokenTree> = stream.into_iter().collect();
    let mut scan = Scan::default();
    scan_trees(krate, &trees, module, true, &mut scan);
    scan
}

/// A node of a module's graph: `None` for the module's own file, else a child's name.
type Node = Option<String>;

/// Where one file names another of its module, in words: `file:line names path`.
type Site = String;

/// Every module's graph: for module `m`, its edges (from, to) and where each is written.
type Graphs = BTreeMap<ModPath, BTreeMap<(Node, Node), Vec<Site>>>;

fn graphs(krate: &Crate) -> Graphs {
    let scans: BTreeMap<ModPath, Scan> = krate
        .files
        .keys()
        .map(|module| (module.clone(), scan_file(krate, module)))
        .collect();
    let mut graphs = Graphs::new();
    for (module, scan) in &scans {
        let file = &krate.files[module].0;
        for named in &scan.named {
            let mut path = named.path.clone();
            // A name the target module's file re-exports leads on to where it comes from.
            for _ in 0..8 {
                let common = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
                let Some(target) = path.get(common) else {
                    break;
                };
                let parent = &path[..common];
                let to = if krate.is_child(parent, target) {
                    Some(target.clone())
                } else if let Some(origin) = scans.get(parent).and_then(|s| s.imports.get(target))
                    && origin != &path[..=common]
                {
                    let mut next = origin.clone();
                    next.extend_from_slice(&path[common + 1..]);
                    path = next;
                    continue;
                } else {
                    None
                };
                let from = module.get(common).cloned();
                if from != to {
                    graphs
                        .entry(parent.to_vec())
                        .or_default()
                        .entry((from, to))
                        .or_default()
                        .push(format!(
                            "{file}:{} names {}",
                            named.line,
                            named.path.join("::")
                        ));
                }
                break;
            }
        }
    }
    graphs
}

/// The strongly connected parts of a graph with more than one node: each a circle, or
/// circles sharing nodes (Tarjan's algorithm).
fn circles(edges: &BTreeMap<(Node, Node), Vec<Site>>) -> Vec<Vec<Node>> {
    struct Walk<'a> {
        next: BTreeMap<&'a Node, Vec<&'a Node>>,
        index: BTreeMap<&'a Node, usize>,
        low: BTreeMap<&'a Node, usize>,
        stack: Vec<&'a Node>,
        on_stack: BTreeSet<&'a Node>,
        found: Vec<Vec<Node>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a Node) {
            let index = self.index.len();
            self.index.insert(node, index);
            self.low.insert(node, index);
            self.stack.push(node);
            self.on_stack.insert(node);
            for to in self.next.get(node).cloned().unwrap_or_default() {
                if !self.index.contains_key(to) {
                    self.visit(to);
                    let low = self.low[node].min(self.low[to]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(to) {
                    let low = self.low[node].min(self.index[to]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut part = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    part.push(top.clone());
                    if top == node {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for (from, to) in edges.keys() {
        walk.next.entry(from).or_default().push(to);
    }
    let nodes: Vec<&Node> = walk.next.keys().copied().collect();
    for node in nodes {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found.sort();
    walk.found
}

/// Every circle of every module, in words: its files, then one line per edge between them
/// with the first place it is written; with the module's folder.
fn circle_report(krate: &Crate) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (module, edges) in graphs(krate) {
        for part in circles(&edges) {
            let names: Vec<String> = part.iter().map(|n| krate.node_name(&module, n)).collect();
            let mut text = format!("circle: {}", names.join(", "));
            for ((from, to), sites) in &edges {
                if part.contains(from) && part.contains(to) {
                    text.push_str(&format!(
                        "\n  {} -> {}: {}{}",
                        krate.node_name(&module, from),
                        krate.node_name(&module, to),
                        sites[0],
                        match sites.len() {
                            1 => String::new(),
                            n => format!(" (and {} more)", n - 1),
                        }
                    ));
                }
            }
            out.push((krate.folder(&module), text));
        }
    }
    out
}

/// Modules whose circles are known and not yet broken, by folder: each must still have one
/// (so that a broken circle leaves this list), and no other module may.
const KNOWN_CIRCLES: &[&str] = &[
    // cli's files share the run's helpers through cli/mod.rs; the run API (issue 32) takes
    // them out of the CLI.
    "src/cli/",
    // Not broken yet. model/mod.rs defines CausalLm, KvCache's users and the loader's
    // types that llama.rs, batch.rs and the weight sources share while re-exporting them;
    // config.rs, error.rs and files.rs lend each other ModelError and ConfigProblem.
    "src/model/",
    // kernels.rs reads paged.rs's PagedKv while paged.rs calls the kernels, and flash.rs's
    // tests compare against attention.rs's gathered path.
    "src/model/attention/",
];

#[test]
fn the_files_of_a_module_import_each_other_in_no_circle() {
    let found = circle_report(&Crate::read());
    let new: Vec<&str> = found
        .iter()
        .filter(|(folder, _)| !KNOWN_CIRCLES.contains(&folder.as_str()))
        .map(|(_, circle)| circle.as_str())
        .collect();
    assert!(
        new.is_empty(),
        "files of one module import each other in a circle; move what both sides need into a \
         file of its own below both:\n{}",
        new.join("\n")
    );
    for known in KNOWN_CIRCLES {
        assert!(
            found.iter().any(|(folder, _)| folder == known),
            "{known} imports in no circle any more: take it out of KNOWN_CIRCLES"
        );
    }
}

#[test]
// Guards the guard: each way of naming a sibling makes an edge, and comments, strings and
// a test module's `use super::*` make none.
fn the_circle_scan_sees_every_way_of_naming_a_sibling() {
    let file = |module: &[&str], name: &str, text: &str| {
        (
            module.iter().map(|s| s.to_string()).collect::<ModPath>(),
            name.to_string(),
            text.to_string(),
        )
    };
    let krate = Crate::new([
        file(&[], "src/lib.rs", "pub mod m;"),
        file(
            &["m"],
            "src/m/mod.rs",
            "pub mod a; pub mod b; pub mod c; pub use b::Thing; pub struct Root;\n\
             fn g() { a::h() }",
        ),
        file(
            &["m", "a"],
            "src/m/a.rs",
            "use super::{b, Thing};\n\
             pub fn h() {}\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::c::X;\n}",
        ),
        file(
            &["m", "b"],
            "src/m/b.rs",
            "pub struct Thing;\nfn f() -> crate::m::Root { todo!() }",
        ),
        file(
            &["m", "c"],
            "src/m/c.rs",
            "// crate::m::b in a comment\n\
             const S: &str = \"super::b\";\n\
             pub struct X;\n\
             fn f() { println!(\"{:?}\", super::a::h()) }",
        ),
    ]);
    let graphs = graphs(&krate);
    let node = |n: &str| (n != "mod").then(|| n.to_string());
    let edges: BTreeMap<(Node, Node), Vec<Site>> = graphs[&vec!["m".to_string()]].clone();
    let expected: BTreeSet<(Node, Node)> = [
        ("a", "b"),
        ("a", "c"),
        ("b", "mod"),
        ("c", "a"),
        ("mod", "a"),
        ("mod", "b"),
    ]
    .into_iter()
    .map(|(from, to)| (node(from), node(to)))
    .collect();
    assert_eq!(edges.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(
        edges[&(node("a"), node("b"))],
        ["src/m/a.rs:1 names m::b", "src/m/a.rs:1 names m::Thing"]
    );
    assert_eq!(
        edges[&(node("a"), node("c"))],
        ["src/m/a.rs:6 names m::c::X"]
    );
    assert_eq!(krate.folder(&["m".to_string()]), "src/m/");
    assert_eq!(
        circle_report(&krate)
            .into_iter()
            .map(|(_, circle)| circle)
            .collect::<Vec<_>>(),
        [
            "circle: src/m/mod.rs, src/m/a.rs, src/m/b.rs, src/m/c.rs\n  \
          src/m/mod.rs -> src/m/a.rs: src/m/mod.rs:2 names m::a::h\n  \
          src/m/mod.rs -> src/m/b.rs: src/m/mod.rs:1 names m::b::Thing\n  \
          src/m/a.rs -> src/m/b.rs: src/m/a.rs:1 names m::b (and 1 more)\n  \
          src/m/a.rs -> src/m/c.rs: src/m/a.rs:6 names m::c::X\n  \
          src/m/b.rs -> src/m/mod.rs: src/m/b.rs:2 names m::Root\n  \
          src/m/c.rs -> src/m/a.rs: src/m/c.rs:4 names m::a::h"
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
