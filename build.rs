//! With the `cuda` feature, compiles throng's own CUDA kernels (kernels/*.cu) to PTX with nvcc;
//! the engine loads them through candle's CUDA device at first use. Without it, does nothing.
//!
//! nvcc is found as `$CUDA_HOME/bin/nvcc`, `$CUDA_PATH/bin/nvcc` or on `PATH` (scripts/build-cuda.sh
//! sets all three); the PTX targets `compute_$CUDA_COMPUTE_CAP` (default 80), which the driver
//! compiles for the GPU it finds (any of compute capability 8.0 or newer).

use std::path::PathBuf;
use std::process::Command;

const KERNELS: [&str; 1] = ["sampling"];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    for kernel in KERNELS {
        println!("cargo::rerun-if-changed=kernels/{kernel}.cu");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|dir| PathBuf::from(dir).join("bin").join("nvcc"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let cap = std::env::var("CUDA_COMPUTE_CAP")
        .ok()
        .map(|c| c.trim().trim_end_matches('a').to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "80".to_string());
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for kernel in KERNELS {
        let ptx = out_dir.join(format!("{kernel}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17"])
            .arg(format!("--gpu-architecture=compute_{cap}"))
            .arg(format!("kernels/{kernel}.cu"))
            .arg("-o")
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run nvcc ({}): {e}. The `cuda` feature needs the CUDA toolkit; \
                     build with scripts/build-cuda.sh --features cuda",
                    nvcc.display()
                )
            });
        assert!(
            status.success(),
            "nvcc failed on kernels/{kernel}.cu ({status})"
        );
    }
}
