//! Keeps the docs honest: the README and the book under `docs/src/` (an mdBook) link only to
//! files that exist and, where a link names `#anchor`, to a heading of that file; the book's
//! `SUMMARY.md` lists every chapter file and names none that is missing; and the README's
//! table of contents links every chapter. The book need not be built to be checked.
//!
//! Anchors follow the rules GitHub and mdBook share: a heading's text lowercased, spaces to
//! `-`, every character but letters, digits, `-` and `_` dropped (backticks and colons too),
//! and a second heading of the same text `-1`, a third `-2`.

mod common;

use common::book::{blocks, book, chapter_files, documents, root};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of `text` outside fenced code blocks (``` or ~~~), with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => out.push((i + 1, line)),
        }
    }
    out
}

/// `line` without its inline code spans (a link inside backticks is text, not a link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                // An unclosed backtick is a literal one.
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The inline links and images of `text` (`[text](target)`, `![alt](target)`), outside code,
/// with their line numbers. A link's text may hold code or brackets of its own.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose(text) {
        let line = without_code(line);
        let bytes = line.as_bytes();
        let mut i = 0;
        while let Some(close) = line[i..].find("](").map(|k| k + i) {
            // The target runs to the matching `)`, allowing parentheses inside it.
            let start = close + 2;
            let mut depth = 1;
            let mut end = start;
            while end < bytes.len() {
                match bytes[end] {
                    b'(' => depth += 1,
                    b')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                end += 1;
            }
            if depth == 0 {
                let target = line[start..end].split_whitespace().next().unwrap_or("");
                let target = target.trim_start_matches('<').trim_end_matches('>');
                out.push((number, target.to_string()));
            }
            i = end.min(bytes.len());
            if i <= close {
                i = close + 2;
            }
        }
    }
    out
}

/// A heading's anchor, as GitHub and mdBook make it from its text.
fn anchor(heading: &str) -> String {
    // A link in a heading renders as its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").and_then(|c| {
            let c = open + c;
            rest[c..].find(')').map(|e| (c, c + e))
        }) {
            Some((close, end)) => {
                text.push_str(&rest[..open]);
                text.push_str(&rest[open + 1..close]);
                rest = &rest[end + 1..];
            }
            None => break,
        }
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// Every anchor the headings of `text` (ATX headings, `#` to `######`, outside code) define.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(line[hashes..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(match *n {
            0 => base.clone(),
            k => format!("{base}-{k}"),
        });
        *n += 1;
    }
    out
}

/// `path` with its `.` and `..` taken out without asking the file system; `None` when a `..`
/// climbs above where it started.
fn lexical(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// What is wrong with the relative links of the document at `path`, a file under `top` (the
/// repository), one line per link.
fn broken_links(top: &Path, path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().unwrap().strip_prefix(top).unwrap();
    let shown = path.strip_prefix(top).unwrap().display().to_string();
    let mut out = Vec::new();
    for (line, target) in links(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (target.as_str(), None),
        };
        let at = format!("{shown}:{line}: `{target}`");
        if file.is_empty() && fragment.is_none() {
            out.push(format!("{at}: an empty link"));
            continue;
        }
        if Path::new(file).is_absolute() {
            out.push(format!(
                "{at}: an absolute path (links are relative to the file)"
            ));
            continue;
        }
        let within = match file.is_empty() {
            true => lexical(path.strip_prefix(top).unwrap()),
            false => lexical(&dir.join(file)),
        };
        let Some(relative) = within else {
            out.push(format!("{at}: leaves the repository"));
            continue;
        };
        let resolved = top.join(&relative);
        if !resolved.exists() {
            out.push(format!("{at}: no such file ({})", relative.display()));
            continue;
        }
        if let Some(fragment) = fragment {
            if resolved.extension().is_none_or(|e| e != "md") {
                out.push(format!("{at}: an anchor into a file that is not Markdown"));
                continue;
            }
            let known = anchors(&read(&resolved));
            if !known.contains(fragment) {
                out.push(format!(
                    "{at}: no heading of {} has the anchor `{fragment}` (it has: {})",
                    relative.display(),
                    known.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    out
}

/// The chapter files `SUMMARY.md` names, in order, with their line numbers.
fn summary_entries() -> Vec<(usize, String)> {
    links(&read(&book().join("SUMMARY.md")))
}

#[test]
fn every_relative_link_of_the_readme_and_the_book_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for path in documents() {
        let text = read(&path);
        checked += links(&text).len();
        problems.extend(broken_links(&root(), &path, &text));
    }
    assert!(
        checked > 40,
        "only {checked} links found: is the scan blind?"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_summary_lists_every_chapter_and_only_files_that_exist() {
    let chapters = chapter_files();
    assert!(
        chapters.len() >= 10,
        "the book has {} chapters",
        chapters.len()
    );
    let mut listed = BTreeSet::new();
    let mut problems = Vec::new();
    for (line, target) in summary_entries() {
        let at = format!("docs/src/SUMMARY.md:{line}: `{target}`");
        if target.contains('#') || target.contains('/') || !target.ends_with(".md") {
            problems.push(format!(
                "{at}: an entry is a chapter file of docs/src/, no anchor"
            ));
        } else if !chapters.contains(&target) {
            problems.push(format!("{at}: no such chapter in docs/src/"));
        } else if !listed.insert(target.clone()) {
            problems.push(format!("{at}: listed twice"));
        }
    }
    for chapter in chapters.difference(&listed) {
        problems.push(format!("docs/src/{chapter}: not listed in SUMMARY.md"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_chapter_begins_with_its_title_and_the_summary_names_it_so() {
    let mut problems = Vec::new();
    let summary = read(&book().join("SUMMARY.md"));
    for (_, line) in prose(&summary) {
        let Some((title, file)) = line
            .trim_start()
            .trim_start_matches("- ")
            .strip_prefix('[')
            .and_then(|rest| rest.rsplit_once("]("))
        else {
            continue;
        };
        let file = file.trim_end_matches(')');
        let Ok(text) = fs::read_to_string(book().join(file)) else {
            continue; // named by the test above
        };
        let first = text.lines().next().unwrap_or("");
        if first != format!("# {title}") {
            problems.push(format!(
                "docs/src/{file}: begins `{first}`, while SUMMARY.md names it `{title}`"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_links_every_chapter_of_the_book() {
    let linked: BTreeSet<String> = links(&read(&root().join("README.md")))
        .into_iter()
        .filter_map(|(_, target)| {
            let file = target.split('#').next().unwrap();
            file.strip_prefix("docs/src/").map(str::to_string)
        })
        .collect();
    let missing: Vec<_> = chapter_files().difference(&linked).cloned().collect();
    assert!(
        missing.is_empty(),
        "the README's table of contents lacks: {}",
        missing.join(", ")
    );
}

// Guards the guard: a scanner that missed links, or anchors made otherwise than GitHub and
// mdBook make them, would let the tests above pass whatever the docs say.
#[test]
fn the_scan_sees_links_and_makes_anchors_as_github_and_mdbook_do() {
    assert_eq!(
        anchor("Reusing decisions: `--reuse` and extending a run"),
        "reusing-decisions---reuse-and-extending-a-run"
    );
    assert_eq!(
        anchor("The energy market's report"),
        "the-energy-markets-report"
    );
    assert_eq!(
        anchor("Use throng from AgentScope, Concordia, mesa-llm and OASIS: `throng api`"),
        "use-throng-from-agentscope-concordia-mesa-llm-and-oasis-throng-api"
    );
    assert_eq!(anchor("See [Run folder](run-folder.md)"), "see-run-folder");
    let text = "# A\n\n## A\n\n```sh\n# not a heading\n```\n#nor this\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from(["a".to_string(), "a-1".to_string()])
    );
    let text = "See [x](a.md#b), ![img](p.png) and [`y`](c.md (title)).\n\
                `[not](a link)` and\n```\n[nor](this)\n```\n[last](https://x.org/(y))";
    let found: Vec<_> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["a.md#b", "p.png", "c.md", "https://x.org/(y)"]);

    let top = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("docs-test");
    fs::create_dir_all(top.join("book")).unwrap();
    fs::write(top.join("book/other.md"), "# Other\n\n## Its part\n").unwrap();
    let text = "# Doc\n[ok](other.md#its-part) [ok](#doc) [ok](../book/other.md) \
                [bad](other.md#nope) [gone](missing.md) [self](#nope) [out](../../x.md)\n";
    let doc = top.join("book/doc.md");
    fs::write(&doc, text).unwrap();
    let problems = broken_links(&top, &doc, text);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems[0].contains("`other.md#nope`: no heading"),
        "{problems:#?}"
    );
    assert!(
        problems[1].contains("`missing.md`: no such file"),
        "{problems:#?}"
    );
    assert!(problems[2].contains("`#nope`: no heading"), "{problems:#?}");
    assert!(
        problems[3].contains("`../../x.md`: leaves the repository"),
        "{problems:#?}"
    );
}

#[test]
fn every_code_block_names_its_language_so_that_rustdoc_tests_only_the_rust_ones() {
    // `cargo test --doc` runs the book's blocks (src/lib.rs, `mod book`): a block without a
    // language would be compiled as Rust.
    let mut unnamed = Vec::new();
    for path in documents() {
        for block in blocks(&read(&path)) {
            if block.info.is_empty() {
                unnamed.push(format!("{}:{}", path.display(), block.line));
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "code blocks without a language (give one: `text`, `sh`, `toml`, `rust`...):\n{}",
        unnamed.join("\n")
    );
}

#[test]
fn every_chapter_and_the_readme_are_doctested() {
    let lib = read(&root().join("src").join("lib.rs"));
    let mut missing: Vec<String> = chapter_files()
        .into_iter()
        .filter(|name| !lib.contains(&format!("include_str!(\"../docs/src/{name}\")")))
        .collect();
    if !lib.contains("include_str!(\"../README.md\")") {
        missing.push("README.md".into());
    }
    assert!(
        missing.is_empty(),
        "not under `cargo test --doc` (add each to `mod book` in src/lib.rs): {missing:?}"
    );
}

#[test]
fn the_fence_scan_reads_info_strings_and_the_lines_inside() {
    let text = "a\n```rust,no_run\nlet x = 1;\n```\n```\nplain\n```\n```sh\n```\n";
    let scanned = blocks(text);
    let found: Vec<(usize, &str, usize)> = scanned
        .iter()
        .map(|b| (b.line, b.info.as_str(), b.lines.len()))
        .collect();
    assert_eq!(found, [(2, "rust,no_run", 1), (5, "", 1), (8, "sh", 0)]);
    assert_eq!(scanned[0].lines, ["let x = 1;"]);
}
