//! scripts/gpu-check without a GPU: `--prepare` on a CPU-only build packs the throng binary and
//! the GPU checks' test executable into a bundle under the 64 MiB limit with a manifest of what
//! it holds, and `--run` checks that bundle and runs its CPU parts, writing the results folder.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check")
}

/// target/release, where this test's own executable and the throng binary were built.
fn release_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_throng"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn a_cpu_only_bundle_fits_the_limit_lists_its_files_and_runs_its_cpu_checks() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(script())
        .args(["--prepare", "--cpu-only", "--fast", "--prebuilt"])
        .arg(release_dir())
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--prepare failed: {stderr}");
    let bundle = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        bundle.is_file(),
        "no bundle at {}: {stderr}",
        bundle.display()
    );
    let size = std::fs::metadata(&bundle).unwrap().len();
    assert!(size <= 64 << 20, "the bundle is {size} bytes");

    // The manifest beside the bundle says what is in it, and how large it is.
    let side = format!(
        "{}.manifest.json",
        bundle.file_name().unwrap().to_string_lossy()
    );
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(side)).unwrap()).unwrap();
    assert_eq!(manifest["bundle_bytes"], size);
    assert_eq!(manifest["features"], serde_json::json!([]));
    let paths: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for needed in ["bin/throng", "tests/cuda", "gpu-check"] {
        assert!(paths.contains(&needed), "{needed} missing from {paths:?}");
    }
    for f in manifest["files"].as_array().unwrap() {
        assert_eq!(f["sha256"].as_str().unwrap().len(), 64, "{f}");
        assert!(f["bytes"].as_u64().unwrap() > 0, "{f}");
    }
    // A CPU build loads no CUDA library.
    assert_eq!(manifest["cuda_libraries"], serde_json::json!([]));

    // --run checks every file and runs what needs no GPU.
    let results = dir.path().join("results");
    let out = Command::new("python3")
        .arg(script())
        .arg("--run")
        .arg(&bundle)
        .arg("--results")
        .arg(&results)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--run failed: {stderr}");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("results.json")).unwrap())
            .unwrap();
    assert_eq!(record["passed"], true);
    let steps = record["steps"].as_array().unwrap();
    let status = |s: &str| -> Vec<&str> {
        steps
            .iter()
            .filter(|x| x["step"] == s)
            .map(|x| x["status"].as_str().unwrap())
            .collect()
    };
    for gpu_step in ["a", "b", "c", "d"] {
        assert_eq!(status(gpu_step), vec!["skipped"], "step {gpu_step}");
    }
    assert_eq!(status("e"), vec!["passed"]);
    let bench = &record["benches"]["tiny-cpu-8"];
    assert_eq!(bench["steps"].as_array().unwrap().len(), 3);
    let summary = std::fs::read_to_string(results.join("summary.txt")).unwrap();
    assert!(summary.contains("tiny-cpu-8"), "{summary}");
}
