//! What the host machine offers, as its kernel reports it: a module of its own, below every
//! layer, since the engine (its KV budget), the simulation (a run's memory check) and the
//! CLI all ask it.

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

/// A limit on the memory this process may take, below the machine's: its size in bytes and
/// where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: usize,
    /// `ulimit -v`, or the control group's limit (a batch job's `--mem`, a container's).
    pub source: &'static str,
}

/// The lowest limit set on this process's memory (Linux): its address space (`ulimit -v`,
/// from `/proc/self/limits`) and its control group's memory (cgroup v2 `memory.max` of it
/// and its ancestors, v1 `memory.limit_in_bytes`). `None` where none is set or the kernel
/// does not say.
pub fn memory_limit() -> Option<MemoryLimit> {
    let address_space = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("Max address space"))?;
            let soft = line["Max address space".len()..]
                .split_whitespace()
                .next()?;
            soft.parse::<usize>().ok()
        })
        .map(|bytes| MemoryLimit {
            bytes,
            source: "ulimit -v",
        });
    let group = cgroup_limit().map(|bytes| MemoryLimit {
        bytes,
        source: "its control group's memory limit",
    });
    [address_space, group]
        .into_iter()
        .flatten()
        .min_by_key(|l| l.bytes)
}

/// The lowest memory limit of this process's control group and its ancestors.
fn cgroup_limit() -> Option<usize> {
    // Values this large mean "no limit" (cgroup v1 writes 2^63 rounded to a page).
    const UNLIMITED: usize = 1 << 62;
    let read = |path: String| -> Option<usize> {
        let text = std::fs::read_to_string(path).ok()?;
        text.trim().parse::<usize>().ok().filter(|&b| b < UNLIMITED)
    };
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut limits = Vec::new();
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let path = path.trim_end_matches('/');
        if controllers.is_empty() {
            // v2: the group and each of its ancestors may set memory.max.
            let mut at = path.to_string();
            loop {
                limits.extend(read(format!("/sys/fs/cgroup{at}/memory.max")));
                match at.rfind('/') {
                    Some(i) => at.truncate(i),
                    None => break,
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            limits.extend(read(format!(
                "/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
            )));
            limits.extend(read(
                "/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string(),
            ));
        }
    }
    limits.into_iter().min()
}
