//! The first CUDA device for tests that compare the CUDA path with the CPU. Shared by the
//! integration tests (`tests/cuda.rs`) and the library's own unit tests of FlashAttention,
//! which include this file by path, so it names nothing but candle.

use candle_core::Device;

/// The first CUDA device, for tests that compare the CUDA path with the CPU. Without one the
/// test is skipped with a banner written straight to stderr (libtest captures only `eprintln!`,
/// so the skip shows even when the test passes), unless `THRONG_REQUIRE_CUDA=1` (as
/// scripts/gpu-check sets), where a missing device is a failure.
pub fn cuda_device_or_skip() -> Option<Device> {
    use std::io::Write;
    // libtest runs each test on a thread named after it.
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a CUDA test");
    match Device::new_cuda(0) {
        Ok(device) => Some(device),
        Err(e) if std::env::var("THRONG_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("{test}: a CUDA device is required (THRONG_REQUIRE_CUDA=1): {e}")
        }
        Err(e) => {
            let line = "!".repeat(78);
            let reason = e.to_string();
            let reason = reason.lines().next().unwrap_or_default();
            let _ = writeln!(
                std::io::stderr(),
                "{line}\nSKIPPED {test}: no CUDA device ({reason})\n{line}"
            );
            None
        }
    }
}
