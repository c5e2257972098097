//! What the host machine offers, as its kernel reports it.

/// Memory that new allocations can take without swapping (`MemAvailable` in
/// `/proc/meminfo`); `None` where the kernel does not say (not Linux).
pub fn available_memory() -> Option<usize> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<usize>()
        .ok()
        .map(|kib| kib * 1024)
}
