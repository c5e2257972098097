//! The plan of a run whose agents all follow rules: no model to size, but the simulation's
//! memory, part by part.

use super::error::PlanError;
use super::writer::say;
use std::io::Write;

/// `throng plan` of a config whose agents all follow rules: no model to size, but the
/// simulation's memory, part by part, and whether this machine holds it (the check `throng
/// run` makes before it writes anything).
pub fn scripted(
    config: &std::path::Path,
    loaded: &dyn crate::scenarios::Loaded,
    out: &mut dyn Write,
) -> Result<(), PlanError> {
    let footprint = loaded.footprint()?;
    say!(
        out,
        "{}: every agent follows the scripted policy, so there is no model to size; the \
         simulation needs about {} at its largest population ({} agents in each of {} cell{}):",
        config.display(),
        crate::host::human_bytes(footprint.bytes()),
        footprint.population,
        footprint.cells,
        if footprint.cells == 1 { "" } else { "s" },
    )?;
    for part in &footprint.parts {
        say!(
            out,
            "  {:>10}  {} (lower {})",
            crate::host::human_bytes(part.bytes),
            part.what,
            part.lower
        )?;
    }
    match crate::host::HostMemory::here() {
        Some(host) => match footprint.check(&host, 1) {
            Ok(()) => say!(
                out,
                "fits this machine, which lets a run use {} of its {} available",
                crate::host::human_bytes(host.usable()),
                crate::host::human_bytes(host.available)
            )?,
            Err(e) => say!(out, "does not fit this machine: {e}")?,
        },
        None => say!(out, "this machine does not say how much memory it has")?,
    }
    Ok(())
}
