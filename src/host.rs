//! What the host machine offers, as its kernel reports it, and what a run asks of it in
//! memory: a module of its own, below every layer, since the engine (its KV budget), the
//! bench, the simulation (a run's memory check), the scenarios (their parts of it) and the
//! CLI all ask it.

/// Memory that new allocations can take without swapping (`MemAvailable` in
/// `/proc/meminfo`); `None` where the kernel does not say (not Linux).
pub fn available_memory() -> Option<usize> {
    meminfo("MemAvailable:")
}

/// The machine's memory (`MemTotal` in `/proc/meminfo`); `None` where the kernel does not say.
pub(crate) fn total_memory() -> Option<usize> {
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
pub(crate) struct MemoryLimit {
    pub bytes: usize,
    /// `ulimit -v`, or the control group's limit (a batch job's `--mem`, a container's).
    pub source: &'static str,
}

/// The lowest limit set on this process's memory (Linux): its address space (`ulimit -v`,
/// from `/proc/self/limits`) and its control group's memory (cgroup v2 `memory.max` of it
/// and its ancestors, v1 `memory.limit_in_bytes`). `None` where none is set or the kernel
/// does not say.
pub(crate) fn memory_limit() -> Option<MemoryLimit> {
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

/// How the program running throng is invoked, for messages that tell the user what to run
/// next (`... run --resume DIR`): `throng`, a study's own binary over `cli::main_with`, or
/// Python. A message that named `throng` to a study's user would send them to a program that
/// does not know their scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// A command line program, as it was invoked (`throng`, `target/release/my-study`).
    Command(String),
    /// The Python package (`throng.run(...)`).
    Python,
}

impl Program {
    /// The command as it was invoked (`argv[0]`): its file name when it was found on the
    /// `PATH`, its path as given otherwise; `throng` when there is none.
    pub fn invoked_as(argv0: &std::ffi::OsStr) -> Self {
        let invoked = argv0.to_string_lossy().into_owned();
        Program::Command(match invoked.contains('/') || invoked.is_empty() {
            // A test harness or `cargo run` runs a binary by its path: `throng` itself is
            // named plainly when that is its name, a study's binary by the path that reaches
            // it.
            true => match std::path::Path::new(&invoked).file_name() {
                Some(name) if name == "throng" => "throng".into(),
                Some(_) => invoked,
                None => "throng".into(),
            },
            false => invoked,
        })
    }

    /// This process's command, as [`Program::invoked_as`] names it.
    pub fn this_process() -> Self {
        Self::invoked_as(&std::env::args_os().next().unwrap_or_default())
    }

    /// What to run to continue the run in `dir`.
    pub fn resume_command(&self, dir: &std::path::Path) -> String {
        match self {
            Program::Command(p) => format!("{p} run --resume {}", dir.display()),
            Program::Python => format!("throng.run(resume={:?})", dir.display().to_string()),
        }
    }

    /// What to run to write the report of the run in `dir`.
    pub fn report_command(&self, dir: &std::path::Path) -> String {
        match self {
            Program::Command(p) => format!("{p} report {}", dir.display()),
            Program::Python => {
                format!("throng.open_run({:?}).report()", dir.display().to_string())
            }
        }
    }
}

/// The memory a run may take here: what the machine has available, and a lower limit set on
/// this process, if any (`ulimit -v`, a control group's).
#[derive(Debug, Clone, PartialEq)]
pub struct HostMemory {
    pub available: f64,
    pub total: f64,
    pub limit: Option<(f64, String)>,
}

impl HostMemory {
    /// This machine and process, where the kernel says (Linux).
    pub fn here() -> Option<Self> {
        let available = available_memory()?;
        Some(Self {
            available: available as f64,
            total: total_memory().unwrap_or(available) as f64,
            limit: memory_limit().map(|l| (l.bytes as f64, l.source.into())),
        })
    }

    /// What the run may take: the available memory, or the limit below it.
    pub fn usable(&self) -> f64 {
        self.limit
            .as_ref()
            .map_or(self.available, |(limit, _)| limit.min(self.available))
    }
}

/// One part of what a run holds in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPart {
    /// What it is, in words (`every round's guesses`).
    pub what: String,
    /// What to lower to shrink it (`steps, agents or replicates`).
    pub lower: String,
    pub bytes: f64,
    /// Whether every cell holds it at once (a world), rather than one cell at a time (what
    /// building a world needs for a moment); only for a scenario's parts of one cell.
    pub per_cell: bool,
}

impl MemoryPart {
    pub fn new(what: impl Into<String>, lower: impl Into<String>, bytes: f64) -> Self {
        Self {
            what: what.into(),
            lower: lower.into(),
            bytes,
            per_cell: true,
        }
    }

    /// A part that one cell at a time holds.
    pub fn once(what: impl Into<String>, lower: impl Into<String>, bytes: f64) -> Self {
        Self {
            per_cell: false,
            ..Self::new(what, lower, bytes)
        }
    }
}

/// `bytes` for people: `1.2 GB`, `400.0 TB`, and beyond a yottabyte, `1.0e30 bytes`.
pub(crate) fn human_bytes(bytes: f64) -> String {
    if !bytes.is_finite() || bytes >= 1e24 {
        return format!("{bytes:.1e} bytes");
    }
    bytesize::ByteSize(bytes.max(0.0) as u64)
        .display()
        .si()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::Program;
    use std::ffi::OsStr;
    use std::path::Path;

    // Messages sent a study's user to `throng`, which does not know their scenario; or named
    // a test harness's long path for `throng` itself.
    #[test]
    fn the_program_is_named_as_it_was_invoked() {
        let named = |argv0: &str| match Program::invoked_as(OsStr::new(argv0)) {
            Program::Command(c) => c,
            Program::Python => unreachable!(),
        };
        assert_eq!(named("throng"), "throng");
        assert_eq!(named("/usr/local/bin/throng"), "throng");
        assert_eq!(named("target/release/my-study"), "target/release/my-study");
        assert_eq!(named("my-study"), "my-study");
        assert_eq!(named(""), "throng");
    }

    #[test]
    fn each_program_says_how_to_resume_and_report_in_its_own_words() {
        let dir = Path::new("runs/x");
        let study = Program::Command("./my-study".into());
        assert_eq!(study.resume_command(dir), "./my-study run --resume runs/x");
        assert_eq!(study.report_command(dir), "./my-study report runs/x");
        assert_eq!(
            Program::Python.resume_command(dir),
            "throng.run(resume=\"runs/x\")"
        );
        assert_eq!(
            Program::Python.report_command(dir),
            "throng.open_run(\"runs/x\").report()"
        );
    }
}
