//! Checksums of a run's record files. When a run stops writing its folder in good order
//! (finished, or paused after a finished step), the size and SHA-256 of every record file go
//! into the manifest; every reader checks a file against them before it reads it, so that a
//! file damaged since (a flipped bit on disk, a bad copy, an edit) is refused by name instead
//! of read as data. Parquet files could carry page checksums, but the `parquet` crate writes
//! none, and CSV and JSON Lines files have nothing of the kind.

use super::{
    AGGREGATES, CELLS, DECISIONS, FileSum, MANIFEST, Manifest, RecordError, STATE_CSV, STEPS,
    names::STORE,
};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// The record files of the run in `dir`, as paths relative to it, in order: the appended
/// files, every joined Parquet table and every Parquet part (`state.parts/...`).
pub fn record_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = [DECISIONS, STEPS, AGGREGATES, CELLS, STATE_CSV, STORE]
        .iter()
        .filter(|name| dir.join(name).is_file())
        .map(|name| name.to_string())
        .collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_file() && name.ends_with(".parquet") {
            files.push(name);
        } else if path.is_dir() && name.ends_with(".parts") {
            let Ok(parts) = std::fs::read_dir(&path) else {
                continue;
            };
            for part in parts.flatten() {
                let part_name = part.file_name().to_string_lossy().into_owned();
                if part.path().is_file() && part_name.ends_with(".parquet") {
                    files.push(format!("{name}/{part_name}"));
                }
            }
        }
    }
    files.sort();
    files
}

/// The size and SHA-256 of every record file of the run in `dir`.
pub fn checksums(dir: &Path) -> Result<BTreeMap<String, FileSum>, RecordError> {
    record_files(dir)
        .into_par_iter()
        .map(|name| Ok((name.clone(), sum(&dir.join(&name))?)))
        .collect()
}

fn sum(path: &Path) -> Result<FileSum, RecordError> {
    let mut file = std::fs::File::open(path).map_err(|e| RecordError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| RecordError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    let sha256 = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(FileSum { bytes, sha256 })
}

/// Checks the record file `name` (a path relative to `dir`) against the checksum the
/// manifest of the run in `dir` keeps for it. A file the manifest keeps none for (a run still
/// writing, killed or failed, or a run of an older throng) passes unchecked.
pub fn verify(dir: &Path, name: &str) -> Result<(), RecordError> {
    Sealed::read(dir).verify(name)
}

/// What the manifest of a run says its record files were, read once for many checks.
pub(crate) struct Sealed<'a> {
    dir: &'a Path,
    manifest: Option<Manifest>,
}

impl<'a> Sealed<'a> {
    pub(crate) fn read(dir: &'a Path) -> Self {
        Self {
            dir,
            manifest: super::read_json::<Manifest>(&dir.join(MANIFEST))
                .ok()
                .filter(|m| m.checksums.is_some()),
        }
    }

    /// See [`verify`].
    pub(crate) fn verify(&self, name: &str) -> Result<(), RecordError> {
        let Some(manifest) = &self.manifest else {
            return Ok(());
        };
        let Some(expected) = manifest.checksums.as_ref().and_then(|c| c.get(name)) else {
            return Ok(());
        };
        let path = self.dir.join(name);
        if !path.exists() {
            return Err(self.damaged(
                name,
                format!(
                    "missing: the run left it when it {} ({MANIFEST} lists it), and it has been \
                     deleted or moved since",
                    manifest.status
                ),
            ));
        }
        let found = sum(&path)?;
        let detail = if found.bytes != expected.bytes {
            format!(
                "it has {} bytes where the run left {}",
                found.bytes, expected.bytes
            )
        } else if found.sha256 != expected.sha256 {
            format!(
                "its SHA-256 is not the one {MANIFEST} recorded when the run {} (the same size, other bytes)",
                manifest.status
            )
        } else {
            return Ok(());
        };
        Err(self.damaged(
            name,
            format!(
                "damaged (truncated or corrupt): {detail}, so its values cannot be trusted and it is \
                 not read"
            ),
        ))
    }

    /// Whether the run left table `name` (joined, or in parts), by its checksums.
    pub(crate) fn lists_table(&self, name: &str) -> bool {
        let Some(sums) = self.manifest.as_ref().and_then(|m| m.checksums.as_ref()) else {
            return false;
        };
        let (joined, parts) = (format!("{name}.parquet"), format!("{name}.parts/"));
        sums.keys()
            .any(|listed| *listed == joined || listed.starts_with(&parts))
    }

    /// Checks that no file of table `name` the run left (joined, or in parts) is missing: a
    /// lost part would otherwise leave its steps out of a report without a word.
    pub(crate) fn verify_table(&self, name: &str) -> Result<(), RecordError> {
        let Some(sums) = self.manifest.as_ref().and_then(|m| m.checksums.as_ref()) else {
            return Ok(());
        };
        let joined = format!("{name}.parquet");
        let parts = format!("{name}.parts/");
        for listed in sums.keys() {
            if (*listed == joined || listed.starts_with(&parts)) && !self.dir.join(listed).exists()
            {
                self.verify(listed)?;
            }
        }
        Ok(())
    }

    fn damaged(&self, name: &str, problem: String) -> RecordError {
        RecordError::format(
            &self.dir.join(name),
            format!(
                "{problem}. Restore it from a copy of the folder, or run the experiment again into \
                 a new folder (`throng run {} --out NEW_DIR`): the same config and seed give the \
                 same records on the same kind of device",
                self.dir.join(super::CONFIG).display()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_files_are_the_appended_files_tables_and_parts_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for name in [
            "decisions.jsonl",
            "steps.csv",
            "state.parquet",
            "trades.parquet",
            "report.html",
            "summary.json",
            "manifest.json",
            "config.toml",
            "checkpoint.bin",
            "fig2_network.png",
        ] {
            std::fs::write(dir.join(name), name).unwrap();
        }
        std::fs::create_dir(dir.join("personas.parts")).unwrap();
        std::fs::write(dir.join("personas.parts/g000-s000000.parquet"), "x").unwrap();
        assert_eq!(
            record_files(dir),
            [
                "decisions.jsonl",
                "personas.parts/g000-s000000.parquet",
                "state.parquet",
                "steps.csv",
                "trades.parquet",
            ]
        );
        let sums = checksums(dir).unwrap();
        assert_eq!(sums["steps.csv"].bytes, 9);
        assert_eq!(
            sums["steps.csv"].sha256,
            // sha256 of the 9 bytes `steps.csv`.
            "75d9f62dd78a55236d08ebb0f58ff1b4e3fcbe92a08cbfb6586ef924e9732ae3"
        );
    }
}
