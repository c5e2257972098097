//! `cells.jsonl`: each cell's fixed data, as its scenario describes it before it runs.

use super::error::RecordError;
use super::names::CELLS;
use super::seal::verify;
use serde::Serialize;
use std::path::Path;

/// One line of `cells.jsonl`: a cell and what its scenario says about it before it runs.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct CellRecord {
    pub arm: String,
    pub population: usize,
    pub replicate: usize,
    pub world: serde_json::Value,
}

/// The first `limit` cells of a run's `cells.jsonl` (at 100,000 replicates the file holds
/// gigabytes), once the whole file has passed its checksum (see [`verify`]).
pub fn read_cells(dir: &Path, limit: usize) -> Result<Vec<CellRecord>, RecordError> {
    use std::io::BufRead;
    verify(dir, CELLS)?;
    let path = dir.join(CELLS);
    let file = std::fs::File::open(&path).map_err(|e| RecordError::io(&path, e))?;
    std::io::BufReader::new(file)
        .lines()
        .take(limit)
        .enumerate()
        .map(|(i, line)| {
            let line = line.map_err(|e| RecordError::io(&path, e))?;
            serde_json::from_str(&line)
                .map_err(|e| RecordError::format(&path, format!("line {}: {e}", i + 1)))
        })
        .collect()
}
