use anyhow::Result;
use throng::model::{PresetSource, Presets, loader};

/// `throng models`: presets and whether each is cached.
pub fn list() -> Result<()> {
    for preset in Presets::builtin().iter() {
        let cached = match &preset.source {
            PresetSource::Asset { asset, .. } => throng::assets::is_cached(asset),
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
        throng::assets::cache_dir().display()
    )?;
    Ok(())
}

/// `throng fetch`: every packaged asset into the cache.
pub fn fetch() -> Result<()> {
    for name in throng::assets::catalogue().keys() {
        let dir = throng::assets::ensure(name)?;
        out!("{name}: {}", dir.display())?;
    }
    Ok(())
}
