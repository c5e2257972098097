//! Runs too large for the machine, through the built `throng` binary: refused before their
//! folder is written, saying how much they need, how much the machine has and what to
//! lower; sizes too large to count are refused too, never wrapped. And the estimate behind
//! it, held against the peak memory of real runs.

mod common;

use common::TinyLlama;
use common::cli::{Ran, output_within, repo, throng};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use throng::sim::experiment::Overrides;

/// How long a command may run: one still running after two minutes is a run that was not
/// refused and is growing (it is killed, and the test fails).
const LIMIT: Duration = Duration::from_secs(120);

/// A config of `scenario` with `top` (top-level keys) and `tail` (sections after
/// `[scenario]`, starting with its own keys).
fn config(dir: &Path, scenario: &str, top: &str, tail: &str) -> PathBuf {
    let path = dir.join("exp.toml");
    let templates = repo().join("templates").join(scenario);
    std::fs::write(
        &path,
        format!(
            "name = \"huge\"\ntemplates = {:?}\n{top}\n\n[scenario]\nname = \"{scenario}\"\n{tail}\n",
            templates.display().to_string()
        ),
    )
    .unwrap();
    path
}

const GUESS: &str = "guess";
const ENERGY: &str = "energy_market";

/// A refused run: its scenario, top-level keys, the scenario's keys and later sections, extra
/// arguments, what the refusal says, and the bytes it needs at least (0 for a size refused
/// whatever the machine: too large to count, or beyond a knob's bound), to skip it on a
/// machine that has them.
struct Case(
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
    f64,
);

#[test]
// Guards against issue 17, item 8: `agents = 1000000000000` and `max_connections =
// 100000000000` aborted the process ("memory allocation of 12884901888 bytes failed", exit
// 134) and left a folder with status `running`. Every size-like knob, at absurd values, is
// now refused before the folder is written, naming the knob to lower; sizes too large to
// count are refused rather than wrapped.
fn absurd_sizes_of_every_knob_are_refused_before_the_folder_is_written() {
    let available = throng::host::available_memory().map_or(0.0, |a| a as f64);
    let cases = [
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 1000000000000",
            "",
            &[],
            "lower agents or replicates",
            1e14,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = [20, 1000000000000000]",
            "",
            &[],
            "(1000000000000000 agents in each of 1 cell)",
            1e17,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 9223372036854775807",
            "",
            &[],
            "lower agents or replicates",
            1e19,
        ),
        Case(
            GUESS,
            "steps = 3\npolicy = \"scripted\"\nagents = 9223372036854775807",
            "",
            &[],
            "the decisions of 9223372036854775807 agents x 1 cells x 3 steps is more than 2^64",
            0.0,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 20",
            "",
            &["--agents", "1000000000000"],
            "lower agents or replicates",
            1e14,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 20\nreplicates = 1000000000000",
            "",
            &[],
            "(20 agents in each of 1000000000000 cells)",
            1e15,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 20",
            "",
            &["--replicates", "9223372036854775807"],
            "too large to count",
            0.0,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 1000\nreplicates = 4611686018427387904",
            "\n[sweep]\nscenario = { ratio = [\"1/2\", \"2/3\", \"3/4\", \"4/5\"] }",
            &[],
            "4 arms x 4611686018427387904 replicates is more than 2^64",
            0.0,
        ),
        Case(
            GUESS,
            "steps = 1000000000000\npolicy = \"scripted\"\nagents = 20",
            "",
            &[],
            "lower steps, agents or replicates",
            1e14,
        ),
        Case(
            GUESS,
            "steps = 9223372036854775807\npolicy = \"scripted\"\nagents = [2, 3, 4]",
            "",
            &[],
            "3 population sizes x 9223372036854775807 steps is more than 2^64; lower steps",
            0.0,
        ),
        Case(
            ENERGY,
            "steps = 2\npolicy = \"scripted\"\nagents = 20",
            "max_connections = 100000000000",
            &[],
            "lower max_connections",
            8e11,
        ),
        Case(
            ENERGY,
            "steps = 2\npolicy = \"scripted\"\nagents = 20",
            "max_connections = 9223372036854775807",
            &[],
            "lower max_connections",
            1e19,
        ),
        Case(
            ENERGY,
            "steps = 2\npolicy = \"scripted\"\nagents = 1000000000000",
            "",
            &[],
            "lower agents or replicates",
            1e15,
        ),
        Case(
            ENERGY,
            "steps = 2\npolicy = \"scripted\"\nagents = 20\nreplicates = 100000000000000",
            "",
            &[],
            "(20 agents in each of 100000000000000 cells)",
            1e18,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"llm\"\nagents = 1000000000",
            "\n[population.attributes.education]\nshares = { school = 50, university = 50 }\n\n[population.personas]\nmax_tokens = 1000000",
            &[],
            "lower agents, replicates or population.personas.max_tokens",
            1e15,
        ),
        Case(
            GUESS,
            "steps = 1000\npolicy = \"llm\"\nhistory = 1000000\nagents = 10000000",
            "",
            &[],
            "lower history, agents or replicates",
            1e15,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"llm\"\nagents = 100000000\n[llm]\nwave = 1000000000000",
            "",
            &[],
            "lower llm.wave",
            1e12,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"llm\"\nagents = 20",
            "",
            &["--kv-memory", "1000000TiB"],
            "lower --kv-memory",
            1e18,
        ),
        // A bound on text the model writes that the decoder's schema could not hold.
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 20",
            "prompt = \"cot\"\nreasoning_chars = 1000000000000",
            &[],
            "field `reasoning_chars`: 1000000000000 characters is more than a reply can hold",
            0.0,
        ),
        Case(
            GUESS,
            "steps = 2\npolicy = \"scripted\"\nagents = 20",
            "reasoning_chars = 1000001",
            &[],
            "give at most 1000000",
            0.0,
        ),
    ];
    for Case(scenario, top, tail, extra, says, needs) in cases {
        // An overflow (needs 0) is refused anywhere; the others where they do not fit, on a
        // machine that says its memory.
        if needs != 0.0 && (available == 0.0 || needs <= available) {
            common::loud_skip(&format!(
                "{top} {tail}: this machine has {available} bytes available, enough for it"
            ));
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = config(tmp.path(), scenario, top, tail);
        let out = tmp.path().join("out");
        let Ran { code, text, .. } = output_within(
            throng()
                .arg("run")
                .arg(&path)
                .args(["--no-report", "--out"])
                .arg(&out)
                .args(extra),
            LIMIT,
        );
        let case = format!("{top} {tail} {extra:?}:\n{text}");
        assert_eq!(code, Some(1), "{case}");
        // Counts past their documented bounds (steps, replicates, arms; issue 17, item 19)
        // are refused by the bound before memory is estimated.
        let bounded = text.contains(" a run may have") || text.contains(" a run may take");
        assert!(text.contains(says) || bounded, "{case}");
        if needs != 0.0 && !bounded {
            assert!(
                text.contains("the run needs about")
                    && text.contains("this machine has available")
                    && text.contains("in all)"),
                "{case}"
            );
        }
        assert!(!out.exists(), "a refused run wrote its folder: {case}");
    }
}

#[test]
// Guards against issue 17, item 8, under the memory limit the issue ran with (`ulimit -v`),
// as a batch job's or a container's limit would be: a run that fits the machine but not the
// limit is refused naming the limit, instead of aborting at it ("memory allocation of ...
// failed", exit 134) with a folder left `running`.
fn a_memory_limit_on_the_process_is_the_limit_checked() {
    let Some(available) = throng::host::available_memory() else {
        common::loud_skip("the machine does not say its memory");
        return;
    };
    if available < 8 << 30 {
        common::loud_skip("the machine has less than 8 GiB available: the run does not fit it");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = config(
        tmp.path(),
        GUESS,
        "steps = 3\npolicy = \"scripted\"\nagents = 20000000",
        "",
    );
    let out = tmp.path().join("out");
    // About 5 GB, under a limit of 3 GB.
    let Ran { code, text, .. } = output_within(
        Command::new("sh")
            .current_dir(repo())
            .args(["-c", "ulimit -v 3000000 && exec \"$0\" \"$@\""])
            .arg(env!("CARGO_BIN_EXE_throng"))
            .arg("run")
            .arg(&path)
            .args(["--no-report", "--out"])
            .arg(&out),
        LIMIT,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("the run needs about")
            && text.contains("this process may use (ulimit -v; the machine has"),
        "{text}"
    );
    assert!(!out.exists(), "{text}");
}

#[test]
// Guards against issue 17, item 8, for the other commands that build a run's agents or a
// model's cache: `plan` (it builds the first step as the run would), `bench --agents` and
// `generate --kv-memory` are refused too, instead of aborting.
fn plan_bench_and_generate_refuse_sizes_the_machine_cannot_hold() {
    if throng::host::available_memory().is_none() {
        common::loud_skip("the machine does not say its memory");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = config(
        tmp.path(),
        GUESS,
        "steps = 2\npolicy = \"llm\"\nagents = 1000000000000",
        "",
    );
    let Ran { code, text, .. } = output_within(throng().arg("plan").arg(&path), LIMIT);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("the plan builds the first step here") && text.contains("lower agents"),
        "{text}"
    );
    let Ran { code, text, .. } = output_within(
        throng().args([
            "bench",
            "--agents",
            "1000000000000",
            "--json",
            tmp.path().join("bench.json").to_str().unwrap(),
        ]),
        LIMIT,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("lower --agents"), "{text}");
    let model = common::tiny_model(&TinyLlama::default());
    let Ran { code, text, .. } = output_within(
        throng()
            .args([
                "generate",
                "--prompt",
                "hi",
                "--kv-memory",
                "1000000TiB",
                "--model",
            ])
            .arg(model.path()),
        LIMIT,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("--kv-memory") && text.contains("this machine has available"),
        "{text}"
    );
}

#[test]
// Guards against issue 17, item 8, on `--resume`: a run resumed where it cannot fit (here
// with a KV cache larger than the machine) is refused before anything is written, and stays
// paused.
fn a_resume_that_cannot_fit_is_refused_and_the_run_stays_paused() {
    if throng::host::available_memory().is_none() {
        common::loud_skip("the machine does not say its memory");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&TinyLlama::default());
    let path = config(
        tmp.path(),
        GUESS,
        "steps = 3\npolicy = \"llm\"\nagents = 4\n[llm]\nmax_tokens = 6",
        "",
    );
    let out = tmp.path().join("out");
    let Ran { code, text, .. } = output_within(
        throng()
            .arg("run")
            .arg(&path)
            .args(["--no-report", "--stop-after", "1", "--model"])
            .arg(model.path())
            .arg("--out")
            .arg(&out),
        LIMIT,
    );
    assert_eq!(code, Some(0), "{text}");
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    let Ran { code, text, .. } = output_within(
        throng()
            .args([
                "run",
                "--no-report",
                "--kv-memory",
                "1000000TiB",
                "--resume",
            ])
            .arg(&out),
        LIMIT,
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("cannot resume") && text.contains("lower --kv-memory"),
        "{text}"
    );
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
    let Ran { code, text, .. } = output_within(
        throng().args(["run", "--no-report", "--resume"]).arg(&out),
        LIMIT,
    );
    assert_eq!(code, Some(0), "{text}");
}

#[test]
// Guards against a size that wrapped: a request's `max_tokens` as large as a usize holds cut
// the reply at `prompt + max_tokens`, which overflowed to less than the prompt. It now runs to
// the end of the model's context, and the reply is what was generated.
fn a_max_tokens_as_large_as_a_usize_runs_to_the_end_of_the_context() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&TinyLlama {
        max_position_embeddings: 64,
        ..TinyLlama::default()
    });
    let requests = tmp.path().join("requests.jsonl");
    std::fs::write(
        &requests,
        format!("{{\"prompt\": \"abcd\", \"max_tokens\": {}}}\n", u64::MAX),
    )
    .unwrap();
    let Ran { code, text, .. } = output_within(
        throng()
            .args(["generate", "--model"])
            .arg(model.path())
            .arg("--requests")
            .arg(&requests),
        LIMIT,
    );
    assert_eq!(code, Some(0), "{text}");
    let line = text.lines().find(|l| l.starts_with('{')).unwrap();
    let response: serde_json::Value = serde_json::from_str(line).unwrap();
    let (prompt, generated) = (
        response["prompt_tokens"].as_u64().unwrap(),
        response["generated_tokens"].as_u64().unwrap(),
    );
    assert_eq!(response["finish_reason"], "length", "{line}");
    assert_eq!(prompt + generated, 64, "{line}");
}

/// Runs `config` with `args` into a fresh folder; returns its peak memory, from the manifest.
fn peak_of(config: &Path, args: &[&str]) -> f64 {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let Ran { code, text, .. } = output_within(
        throng()
            .arg("run")
            .arg(config)
            .args(args)
            .args(["--no-report", "--out"])
            .arg(&out),
        LIMIT,
    );
    assert_eq!(code, Some(0), "{text}");
    let manifest: throng::record::Manifest =
        throng::record::read_json(&out.join("manifest.json")).unwrap();
    manifest.peak_rss_bytes.expect("the peak is recorded") as f64
}

#[test]
// Guards the estimate the refusal rests on (issue 17, item 8): for runs large enough that
// the agents dominate, of both scenarios and with many links, it is at least the peak memory
// measured (so a run it lets through fits), and at most three times it (so a run that fits
// is not refused).
fn the_estimate_holds_the_peak_memory_of_real_runs() {
    if throng::host::available_memory().is_none() {
        common::loud_skip("the machine does not say its memory");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dummy = repo().join("experiments/guess-1m-dummy.toml");
    let plain = |name: &str, scenario: &str, tail: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        config(
            &dir,
            scenario,
            "steps = 3\npolicy = \"scripted\"\nagents = 20",
            tail,
        )
    };
    let guess = plain("guess", GUESS, "[records]\ndecisions = \"none\"");
    let energy = plain("energy", ENERGY, "");
    let linked = plain(
        "linked",
        ENERGY,
        "min_connections = 300\nmax_connections = 400",
    );
    // Few large cells, and (issue 30, item 12: 100,000 cells of 3 agents peaked at 2.2 GB
    // against an estimate of 175 MB) many small ones, whose cost is the cells'.
    for (config, agents, steps, replicates) in [
        (&dummy, 1_000_000, 3, 1),
        (&guess, 1_500_000, 8, 1),
        (&energy, 100_000, 3, 1),
        (&linked, 15_000, 2, 1),
        (&dummy, 3, 2, 40_000),
        (&energy, 20, 3, 3_000),
    ] {
        let (agents_flag, steps_flag) = (agents.to_string(), steps.to_string());
        let replicates_flag = replicates.to_string();
        let args = [
            "--agents",
            &agents_flag,
            "--steps",
            &steps_flag,
            "--replicates",
            &replicates_flag,
        ];
        let peak = peak_of(config, &args);
        let overrides = Overrides {
            agents: Some(vec![agents]),
            steps: Some(steps),
            replicates: Some(replicates),
            ..Overrides::default()
        };
        let estimate = throng::scenarios::Registry::builtin()
            .load(config, &overrides)
            .unwrap()
            .footprint()
            .unwrap()
            .bytes();
        let case = format!(
            "{} at {agents} agents x {replicates} replicates: estimate {estimate:.3e} bytes, \
             peak {peak:.3e}",
            config.display()
        );
        assert!(estimate >= peak, "{case}");
        assert!(estimate <= 3.0 * peak, "{case}");
        eprintln!("{case}");
    }
}
