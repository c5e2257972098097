use crate::model::{PresetSource, Presets, loader};
use anyhow::Result;

/// `throng models`: presets and whether each is cached.
pub fn list() -> Result<()> {
    for preset in Presets::builtin().iter() {
        let cached = match &preset.source {
            PresetSource::Asset { asset, .. } => crate::assets::is_cached(asset),
            PresetSource::Hub { hub, revision } => loader::hub_snapshot_cached(hub, revision),
        };
        out!(
            "{:<24} {:<10} {}",
            preset.name,
            if cached { "cached" } else { "not cached" },
            preset.description
        )?;
    }
    out!(
        "\ncache: {} (Hub models: the Hugging Face cache, $HF_HOME)",
        crate::assets::cache_dir().display()
    )?;
    Ok(())
}

/// `throng fetch`: every packaged asset into the cache.
pub fn fetch() -> Result<()> {
    for name in crate::assets::catalogue().keys() {
        let dir = crate::assets::ensure(name)?;
        out!("{name}: {}", dir.display())?;
    }
    Ok(())
}
