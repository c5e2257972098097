//! Records pinned to the bytes: a fixture run with the built binary, its record files hashed.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Runs `config` (a file under tests/fixtures) with the built binary and checks the SHA-256
/// of each record file against `expected` (file, hash).
pub fn check(config: &str, expected: &[(&str, &str)]) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let status = Command::new(env!("CARGO_BIN_EXE_throng"))
        .current_dir(repo())
        .args(["run", &format!("tests/fixtures/{config}"), "--out"])
        .arg(&out)
        .arg("--no-report")
        .status()
        .unwrap();
    assert!(status.success(), "throng run {config} failed");
    for (file, want) in expected {
        assert_eq!(sha256(&out.join(file)), *want, "{config}: {file} changed");
    }
}
