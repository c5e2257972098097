//! Holds the library to lengths a reader can take in. A function over 150 lines is a sequence
//! of phases that want names of their own, and more than ten over 100 lines means the exception
//! became the habit; a file over 800 lines of code (its `mod tests` aside) is a module that
//! wants parts. Each offence fails with its file, line and length, longest first.

mod common;

use common::sources::rust_files;
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use std::path::PathBuf;

/// No function of the library may be longer.
const LONGEST_FUNCTION: usize = 150;
/// Functions over `LONG_FUNCTION` lines: at most `LONG_FUNCTIONS` of them.
const LONG_FUNCTION: usize = 100;
const LONG_FUNCTIONS: usize = 10;
/// No file may have more lines of code, its tests module aside.
const LONGEST_FILE: usize = 800;

/// A function (or method) with a body: where it starts and how many lines, from the line of
/// `fn` to the body's closing brace (attributes and doc comments not counted).
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
}

/// What one file holds: its functions outside a `mod tests`, and its lines of code, which
/// end where a `mod tests` begins (with the `#[cfg(test)]` line above it).
#[derive(Debug, PartialEq)]
struct Measure {
    functions: Vec<Function>,
    code_lines: usize,
}

fn measure(text: &str) -> Measure {
    let stream: TokenStream = text.parse().unwrap_or_else(|e| panic!("{e}"));
    let mut measure = Measure {
        functions: Vec::new(),
        code_lines: text.lines().count(),
    };
    walk(stream, &mut measure);
    measure
}

fn is_brace(tree: Option<&TokenTree>) -> bool {
    matches!(tree, Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace)
}

fn walk(stream: TokenStream, measure: &mut Measure) {
    let trees: Vec<TokenTree> = stream.into_iter().collect();
    let mut at = 0;
    while at < trees.len() {
        match &trees[at] {
            TokenTree::Ident(word) if word == "mod" => {
                let tests = matches!(trees.get(at + 1), Some(TokenTree::Ident(n)) if n == "tests");
                if tests && is_brace(trees.get(at + 2)) {
                    // The line above `mod tests` holds its `#[cfg(test)]`.
                    let line = word.span().start().line;
                    measure.code_lines = measure.code_lines.min(line.saturating_sub(2));
                    at += 3;
                    continue;
                }
                at += 1;
            }
            TokenTree::Ident(word) if word == "fn" => {
                // `fn` before a name starts an item; before `(` it is a pointer type.
                let Some(TokenTree::Ident(name)) = trees.get(at + 1) else {
                    at += 1;
                    continue;
                };
                // The body is the first brace group of the signature's level; a `;` first
                // means a declaration without one (a trait's required method).
                let mut end = at + 2;
                while end < trees.len() {
                    match &trees[end] {
                        TokenTree::Punct(p) if p.as_char() == ';' => break,
                        TokenTree::Group(body) if body.delimiter() == Delimiter::Brace => {
                            let line = word.span().start().line;
                            measure.functions.push(Function {
                                name: name.to_string(),
                                line,
                                lines: body.span().end().line - line + 1,
                            });
                            walk(body.stream(), measure);
                            break;
                        }
                        _ => end += 1,
                    }
                }
                at = end + 1;
            }
            TokenTree::Group(group) => {
                walk(group.stream(), measure);
                at += 1;
            }
            _ => at += 1,
        }
    }
}

/// Every file of the library and of the Python package's extension module (an edge over
/// the library held to the same lengths), by its path under the crate, with its measure.
fn library() -> Vec<(String, Measure)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("python").join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path.strip_prefix(&root).unwrap().display().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let measure = std::panic::catch_unwind(|| measure(&text))
                .unwrap_or_else(|_| panic!("{name} does not lex as Rust"));
            (name, measure)
        })
        .collect()
}

/// `file:line fn name: N lines`, longest first, for the functions longer than `limit`.
fn longer_than(library: &[(String, Measure)], limit: usize) -> Vec<String> {
    let mut long: Vec<(usize, String)> = library
        .iter()
        .flat_map(|(file, m)| {
            m.functions
                .iter()
                .filter(|f| f.lines > limit)
                .map(move |f| {
                    (
                        f.lines,
                        format!("{file}:{} fn {}: {} lines", f.line, f.name, f.lines),
                    )
                })
        })
        .collect();
    long.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    long.into_iter().map(|(_, s)| s).collect()
}

#[test]
fn no_function_of_the_library_is_over_150_lines() {
    let long = longer_than(&library(), LONGEST_FUNCTION);
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines; split each along its phases into named \
         functions (or a struct that carries what the phases share):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn at_most_ten_functions_of_the_library_are_over_100_lines() {
    let long = longer_than(&library(), LONG_FUNCTION);
    assert!(
        long.len() <= LONG_FUNCTIONS,
        "{} functions over {LONG_FUNCTION} lines, at most {LONG_FUNCTIONS} may be; split the \
         longest along their phases:\n  {}",
        long.len(),
        long.join("\n  ")
    );
}

#[test]
fn no_file_of_the_library_is_over_800_lines_of_code() {
    let mut long: Vec<(usize, &str)> = Vec::new();
    let library = library();
    for (file, m) in &library {
        if m.code_lines > LONGEST_FILE {
            long.push((m.code_lines, file));
        }
    }
    long.sort_by(|a, b| b.cmp(a));
    let long: Vec<String> = long
        .iter()
        .map(|(n, f)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "files over {LONGEST_FILE} lines of code (tests aside); split each per noun into files \
         of its module, re-exporting what its users name:\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn the_measure_counts_bodies_from_fn_to_brace_and_leaves_tests_out() {
    let text = "\
/// A doc comment is not counted.
#[inline]
pub fn outer(x: fn(u8) -> u8) -> u8 {
    fn inner() {
        let s = \"{ a brace in a string }\"; // { and one in a comment
    }
    x(1)
}

trait Said {
    fn declared(&self) -> u8;
    fn given(&self) -> u8 {
        1
    }
}

#[cfg(test)]
mod tests {
    fn not_the_library() {}
}
";
    let m = measure(text);
    let f = |name: &str, line: usize, lines: usize| Function {
        name: name.to_string(),
        line,
        lines,
    };
    assert_eq!(
        m.functions,
        vec![f("outer", 3, 6), f("inner", 4, 3), f("given", 12, 3)]
    );
    assert_eq!(m.code_lines, 16);
}
