//! LLM-written personas are part of the run folder (`personas.parquet`), not only of the
//! cache under `$THRONG_CACHE/personas/`: a colleague given the folder sees who the agents were
//! told they are. Written as each population size starts, they obey the records' rules: the
//! same bytes whether the run went uninterrupted, was killed and resumed, or ran on several
//! ranks. Through the built binary, on a tiny random model.

mod common;

use common::TinyLlama;
use common::cli::{self, DECISIONS, Ran, output, repo, throng_with_cache};
use std::path::{Path, PathBuf};

struct Fixture {
    tmp: tempfile::TempDir,
    model: tempfile::TempDir,
    config: PathBuf,
}

/// Two population sizes (6 and 8 agents) of two replicates, two rounds each: four steps,
/// the second population's personas written at step 3.
fn fixture() -> Fixture {
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 2048,
        ..TinyLlama::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let templates = repo().join("templates/guess");
    let config = tmp.path().join("exp.toml");
    std::fs::write(
        &config,
        format!(
            r#"templates = {:?}
name = "persona-records"
seed = 5
steps = 2
replicates = 2
policy = "llm"
agents = [6, 8]

[llm]
max_tokens = 12

[scenario]
name = "guess"

[population.attributes.education]
shares = {{ school = 50, university = 50 }}

[population.personas]
max_tokens = 10
"#,
            templates.display().to_string()
        ),
    )
    .unwrap();
    Fixture { tmp, model, config }
}

impl Fixture {
    fn run(&self, cache: &Path, out: &Path, crash: Option<&str>) -> Ran {
        let mut cmd = throng_with_cache(cache);
        cmd.arg("run")
            .arg(&self.config)
            .args(["--no-report", "--model"])
            .arg(self.model.path())
            .arg("--out")
            .arg(out);
        if let Some(at) = crash {
            cmd.env("THRONG_CRASH_AT", at);
        }
        output(&mut cmd)
    }

    fn resume(&self, cache: &Path, out: &Path, crash: Option<&str>) -> Ran {
        // The model is the run's own (its config.toml names it).
        let mut cmd = throng_with_cache(cache);
        cmd.args(["run", "--no-report", "--resume"]).arg(out);
        if let Some(at) = crash {
            cmd.env("THRONG_CRASH_AT", at);
        }
        output(&mut cmd)
    }
}

/// `(population, replicate, agent, persona)` for every row of the folder's personas table.
fn persona_rows(dir: &Path) -> Vec<(u64, u64, u64, String)> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    let batches = throng::record::read_table(dir, throng::record::PERSONAS).unwrap();
    let mut rows = Vec::new();
    for b in &batches {
        let int = |name: &str| b.column_by_name(name).unwrap().as_primitive::<UInt64Type>();
        let persona = b.column_by_name("persona").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            rows.push((
                int("population").value(i),
                int("replicate").value(i),
                int("agent").value(i),
                persona.value(i).to_string(),
            ));
        }
    }
    rows
}

/// The personas the run wrote into the cache, in the order it asked for them.
fn cached_personas(cache: &Path) -> Vec<String> {
    let dir = cache.join("personas");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one cache file for (template, model)");
    std::fs::read_to_string(&files[0])
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["persona"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Records whose bytes depend on the run alone. (`decisions.jsonl` also holds what measures
/// the process: each decision's latency, and the prompt tokens its prefix cache held.)
const RECORDS: &[&str] = &[
    "personas.parquet",
    "state.parquet",
    "aggregates.csv",
    "cells.jsonl",
];

/// `cli::assert_same_records` over `RECORDS`, which the uninterrupted run `whole` must have
/// written, each of them and `decisions.jsonl`.
fn assert_same_records(whole: &Path, other: &Path, what: &str) {
    for name in RECORDS.iter().chain([&DECISIONS]) {
        assert!(
            whole.join(name).is_file(),
            "{what}: {name} missing from the uninterrupted run"
        );
    }
    cli::assert_same_records(whole, other, RECORDS, what);
}

// Guards against issue 17, item 21: LLM-written personas existed only in
// `$THRONG_CACHE/personas/`, so a run folder did not say who its agents were told they are.
#[test]
fn every_agents_persona_is_in_the_run_folder_and_survives_kills_and_resumes() {
    let f = fixture();
    let cache = f.tmp.path().join("cache-whole");
    let whole = f.tmp.path().join("whole");
    let Ran { ok, text, .. } = f.run(&cache, &whole, None);
    assert!(ok, "{text}");
    assert!(
        !whole.join("personas.parts").exists(),
        "the parts are joined at the end"
    );
    let rows = persona_rows(&whole);
    let mut expected = Vec::new();
    for population in [6u64, 8] {
        for replicate in 0..2u64 {
            for agent in 0..population {
                expected.push((population, replicate, agent));
            }
        }
    }
    let keys: Vec<(u64, u64, u64)> = rows.iter().map(|r| (r.0, r.1, r.2)).collect();
    assert_eq!(
        keys, expected,
        "one row per agent of each replicate, in order"
    );
    // The very personas the model wrote, asked for population by population, replicate by
    // replicate, agent by agent.
    let written: Vec<String> = rows.iter().map(|r| r.3.clone()).collect();
    assert_eq!(written, cached_personas(&cache));
    // The folder is self-contained: the report's run folder lists it, and its checksum is
    // kept like every record's.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(whole.join("manifest.json")).unwrap())
            .unwrap();
    assert!(
        manifest["checksums"]["personas.parquet"]["sha256"].is_string(),
        "{manifest}"
    );

    // Killed in the first step (before any checkpoint), then in the second population's first
    // step (its personas written, the step's state too, no checkpoint of it), each time with a
    // cache of its own, so that the personas are asked of the model again: the same bytes.
    let cache = f.tmp.path().join("cache-pieces");
    let pieces = f.tmp.path().join("pieces");
    let Ran { ok, text, .. } = f.run(&cache, &pieces, Some("1:decided"));
    assert!(!ok && text.contains("aborting here"), "{text}");
    std::fs::remove_dir_all(&cache).unwrap();
    let Ran { ok, text, .. } = f.resume(&cache, &pieces, Some("3:state"));
    assert!(!ok && text.contains("aborting here"), "{text}");
    assert!(
        pieces.join("personas.parts/g001-s000000.parquet").is_file(),
        "the second population's personas were written when it started"
    );
    std::fs::remove_dir_all(&cache).unwrap();
    let Ran { ok, text, .. } = f.resume(&cache, &pieces, None);
    assert!(ok, "{text}");
    assert_same_records(&whole, &pieces, "killed twice and resumed");
}

// The same records under two MPI ranks as in one process (personas are written by rank 0,
// which holds them all).
#[cfg(feature = "mpi")]
#[test]
fn personas_on_two_ranks_equal_one_process() {
    let Some(mpirun) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("mpirun"))
            .find(|p| p.is_file())
    }) else {
        common::loud_skip("mpirun not found; install Open MPI");
        return;
    };
    let f = fixture();
    let whole = f.tmp.path().join("whole");
    let Ran { ok, text, .. } = f.run(&f.tmp.path().join("cache-whole"), &whole, None);
    assert!(ok, "{text}");
    for split in ["cells", "agents"] {
        let ranked = f.tmp.path().join(format!("ranked-{split}"));
        let mut cmd = std::process::Command::new(&mpirun);
        cmd.current_dir(repo())
            .args(["-np", "2", "--oversubscribe", "--bind-to", "none"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_btl", "self,vader,tcp")
            .env("OMPI_MCA_btl_tcp_if_include", "lo")
            .env("OMPI_MCA_oob_tcp_if_include", "lo")
            .env("THRONG_CACHE", f.tmp.path().join(format!("cache-{split}")))
            .arg(env!("CARGO_BIN_EXE_throng"))
            .arg("run")
            .arg(&f.config)
            .args(["--no-report", "--split", split, "--model"])
            .arg(f.model.path())
            .arg("--out")
            .arg(&ranked);
        let Ran { ok, text, .. } = output(&mut cmd);
        assert!(ok, "{split}: {text}");
        assert_same_records(&whole, &ranked, &format!("two ranks, split {split}"));
    }
}
