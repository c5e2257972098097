//! What the host machine offers, as its kernel reports it.

/// Memory that new allocations can take without swapping (`MemAvailable` in
/// `/proc/meminfo`); `None` where the kernel does not say (not Linux).
pub fn available_memory() -> Option<usize> {
    meminfo("MemAvailable:")
}

/// The machine's memory (`MemTotal` in `/proc/meminfo`); `None` where the kernel does not say.
pub fn total_memory() -> Option<usize> {
    meminfo("MemTotal:")
}

/// One `/proc/meminfo` field, in bytes (the file states kibibytes).
fn meminfo(field: &str) -> Option<usize> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse::<usize>()
        .ok()
        .map(|kib| kib * 1024)
}
