//! `aggregates.csv` is the same kind of file in every scenario: a CSV table with its header, or
//! no file at all for a scenario that keeps no aggregates.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_throng"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The header and the rows of `dir/aggregates.csv`, read as any CSV reader would.
fn table(dir: &Path) -> Option<(Vec<String>, usize)> {
    let path = dir.join("aggregates.csv");
    if !path.exists() {
        return None;
    }
    let mut reader = csv::Reader::from_path(&path).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader.records().collect::<Result<Vec<_>, _>>().unwrap();
    Some((header, rows.len()))
}

// Guards against issue 17, item 20: exp2's `aggregates.csv` was a 0-byte file, on which
// `pandas.read_csv` raises EmptyDataError.
#[test]
fn aggregates_csv_is_a_table_with_a_header_or_absent() {
    let tmp = tempfile::tempdir().unwrap();
    let experiments = repo().join("experiments");
    let energy = tmp.path().join("energy");
    run(&[
        "run",
        experiments.join("exp2-regulated.toml").to_str().unwrap(),
        "--policy",
        "scripted",
        "--steps",
        "2",
        "--replicates",
        "1",
        "--out",
        energy.to_str().unwrap(),
    ]);
    assert!(
        table(&energy).is_none(),
        "the energy market keeps no aggregates, so it writes no aggregates.csv"
    );
    let guess = experiments.join("guess-1m-dummy.toml");
    let guess = guess.to_str().unwrap();
    let common = ["--agents", "50", "--replicates", "2", "--no-report"];
    // Paused before any round: the header alone, a table of no rows.
    let paused = tmp.path().join("paused");
    let mut args = vec![
        "run",
        guess,
        "--out",
        paused.to_str().unwrap(),
        "--stop-after",
        "0",
    ];
    args.extend(common);
    run(&args);
    let (header, rows) = table(&paused).expect("the guessing game keeps aggregates");
    assert_eq!(rows, 0);
    for column in ["arm", "step", "mean", "target", "winning_number", "winners"] {
        assert!(header.iter().any(|h| h == column), "{header:?}");
    }
    // Resumed, it gains one row per cell and round under that header, as an uninterrupted
    // run has them.
    run(&["run", "--resume", paused.to_str().unwrap(), "--no-report"]);
    let whole = tmp.path().join("whole");
    let mut args = vec!["run", guess, "--out", whole.to_str().unwrap()];
    args.extend(common);
    run(&args);
    assert_eq!(table(&paused), Some((header, 2 * 3)));
    assert_eq!(
        std::fs::read(paused.join("aggregates.csv")).unwrap(),
        std::fs::read(whole.join("aggregates.csv")).unwrap()
    );
}
