//! The README and the book under `docs/src/` (an mdBook), as the tests that check them read
//! them: which files there are, and the fenced code blocks of one.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The book's source folder.
pub fn book() -> PathBuf {
    root().join("docs").join("src")
}

/// The chapter files of the book: every `.md` under `docs/src/` but `SUMMARY.md`, by name.
pub fn chapter_files() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in fs::read_dir(book()).expect("docs/src/ is the book's source") {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            out.insert(name);
        }
    }
    out
}

/// The README and every Markdown file of the book, `SUMMARY.md` included.
pub fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md"), book().join("SUMMARY.md")];
    out.extend(chapter_files().into_iter().map(|name| book().join(name)));
    out
}

/// A fenced code block (```): the line of its opening fence, its info string (what follows
/// the fence: `sh`, `rust,no_run`, or nothing) and its lines.
#[derive(Debug, PartialEq)]
pub struct Block {
    pub line: usize,
    pub info: String,
    pub lines: Vec<String>,
}

/// The fenced code blocks of `text`, in order (an opening fence without its close runs to the
/// end of the text).
pub fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (open.take(), fence) {
            (Some(block), Some(_)) => out.push(block),
            (Some(mut block), None) => {
                block.lines.push(line.to_string());
                open = Some(block);
            }
            (None, Some(info)) => {
                open = Some(Block {
                    line: i + 1,
                    info: info.trim().to_string(),
                    lines: Vec::new(),
                })
            }
            (None, None) => {}
        }
    }
    out.extend(open);
    out
}
