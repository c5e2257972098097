//! Guards against issue 42, item 6: `pip install ./python` after the README's `cargo build
//! --release` compiled throng and most of its dependencies a second time (29 minutes on 2
//! cores), because the Python package's build turned on features (arrow's `ffi`, getrandom's
//! `std`, hashbrown's defaults) that throng's own build left off, and cargo builds a crate
//! anew for every set of features. Every crate the `throng` build compiles must be compiled
//! with the same features in the Python package's build, so that the second build reuses the
//! first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// Each crate of `package`'s build (`name version`) with the features cargo compiles it with.
fn features(package: &str) -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            package,
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "-f",
            "{p}|{f}",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut crates = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let line = line.trim_end_matches(" (*)");
        let Some((name, features)) = line.split_once('|') else {
            continue;
        };
        // A path crate's `{p}` ends in its folder; the name and version name it.
        let name: String = name.split(" (").next().unwrap().trim().to_string();
        let features = features
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(String::from)
            .collect();
        crates.insert(name, features);
    }
    crates
}

#[test]
fn the_python_packages_build_compiles_throngs_crates_with_the_same_features() {
    let throng = features("throng");
    let python = features("throng-python");
    let differ: Vec<String> = throng
        .iter()
        .filter(|(name, _)| !name.starts_with("throng "))
        .filter_map(|(name, ours)| {
            let theirs = python.get(name)?;
            (ours != theirs).then(|| {
                format!(
                    "{name}: throng {:?}, the Python package {:?}",
                    ours.iter().collect::<Vec<_>>(),
                    theirs.iter().collect::<Vec<_>>()
                )
            })
        })
        .collect();
    assert!(
        throng.len() > 100,
        "cargo tree listed {} crates",
        throng.len()
    );
    assert!(
        differ.is_empty(),
        "crates the Python package's build compiles with other features than throng's own \
         (turn the same features on in throng's Cargo.toml):\n{}",
        differ.join("\n")
    );
}
