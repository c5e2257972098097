//! Open MPI's `mpirun`, for tests that start `throng` as several ranks.

use super::cli::repo;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `mpirun`, or `None` (after a loud skip message) where Open MPI is not installed.
pub fn mpirun() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("mpirun"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("THRONG_REQUIRE_ASSETS").is_ok_and(|v| v == "1") {
            panic!(
                "mpirun is required (THRONG_REQUIRE_ASSETS=1): apt-get install openmpi-bin libopenmpi-dev"
            );
        }
        eprintln!(
            "\n{0}\nSKIPPED: mpirun not found; install Open MPI (apt-get install openmpi-bin libopenmpi-dev)\n{0}\n",
            "!".repeat(78)
        );
    }
    found
}

/// `throng ARGS` under `mpirun -np N`.
pub fn mpi(mpirun: &Path, n: usize, args: &[&str]) -> Command {
    let mut cmd = Command::new(mpirun);
    cmd.current_dir(repo())
        .args([
            "-np",
            &n.to_string(),
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        // Open MPI refuses root unless told; containers and CI often run as root.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // No network interfaces to probe on a CI machine: shared memory and loopback only.
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .arg(env!("CARGO_BIN_EXE_throng"))
        .args(args);
    cmd
}
