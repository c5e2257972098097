//! `throng serve` over HTTP, through the built binary: the index in every status a run folder
//! can be in (damaged ones included, without bringing the server down), live events as a run
//! steps, the token that control actions need, paths that never reach the file system, the
//! binding rules, and pause, resume and delete end to end.

mod common;

use common::cli::{Ran, Watched, assert_same_records, output, throng};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The records an uninterrupted run and a paused-then-resumed one must share.
const RECORDS: [&str; 4] = [
    "state.parquet",
    "decisions.jsonl",
    "cells.jsonl",
    "aggregates.csv",
];

/// A guessing game big enough that each step takes a moment.
const LONG: [&str; 6] = [
    "experiments/guess-1m-dummy.toml",
    "--agents",
    "60000",
    "--steps",
    "12",
    "--no-report",
];

/// A running `throng serve`, killed when dropped.
struct Served {
    /// The server's process; none when the run itself serves (`run --serve`).
    child: Option<Child>,
    base: String,
    token: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn serve(root: &Path, extra: &[&str]) -> Served {
    let child = throng()
        .arg("serve")
        .arg(root)
        .args(if extra.contains(&"--addr") {
            &[][..]
        } else {
            &["--addr", "127.0.0.1:0"][..]
        })
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed when dropped, whatever happens next.
    let mut served = Served {
        child: Some(child),
        base: String::new(),
        token: String::new(),
    };
    let stdout = served.child.as_mut().and_then(|c| c.stdout.take()).unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "the server printed no address");
        let line = lines.next().expect("the server's output").unwrap();
        if let Some(at) = line.find("http://") {
            let url = line[at..].trim().to_string();
            let (base, token) = url.split_once("/?token=").unwrap();
            // Keep reading its output, so that it never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            served.base = base.to_string();
            served.token = token.to_string();
            return served;
        }
    }
}

fn get(s: &Served, path: &str) -> (u16, String) {
    match ureq::get(&format!("{}{path}", s.base)).call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{path}: {e}"),
    }
}

fn get_json(s: &Served, path: &str) -> Value {
    let (code, body) = get(s, path);
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn post(s: &Served, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut req = ureq::post(&format!("{}{path}", s.base));
    if let Some(t) = token {
        req = req.set("X-Throng-Token", t);
    }
    match req.send_string(body) {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{path}: {e}"),
    }
}

fn runs(s: &Served) -> Vec<Value> {
    get_json(s, "/api/runs")["runs"].as_array().unwrap().clone()
}

fn run_named(s: &Served, folder: &str) -> Value {
    runs(s)
        .into_iter()
        .find(|r| r["path"].as_str().unwrap().ends_with(folder))
        .unwrap_or_else(|| panic!("{folder} not in the index: {:?}", runs(s)))
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_to_end(args: &[&str], out: &Path) {
    let Ran { ok, text, .. } = output(throng().arg("run").args(args).arg("--out").arg(out));
    assert!(ok, "{text}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

fn set_status(dir: &Path, status: &str) {
    let path = dir.join("manifest.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["status"] = Value::String(status.into());
    std::fs::write(&path, m.to_string()).unwrap();
}

/// A run stuck in its step 3 (it never finishes by itself), into `dir`.
fn start_stuck(dir: &Path) -> Watched {
    let mut stuck = Watched::spawn(
        throng()
            .arg("run")
            .args(LONG)
            .arg("--out")
            .arg(dir)
            .env("THRONG_CRASH_AT", "3:hang"),
    );
    stuck.wait_for("this step never finishes", 1, Duration::from_secs(120));
    stuck
}

// The index shows every status a folder can be in (running, paused, interrupted, finished,
// failed, damaged), and a folder that is half-written or holds garbage shows as damaged
// without bringing the server down.
#[test]
fn the_index_lists_runs_in_every_status_and_survives_damaged_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let small = ["tests/fixtures/guess-resume.toml"];
    run_to_end(&small, &root.join("finished"));
    run_to_end(
        &[&small[..], &["--stop-after", "1"]].concat(),
        &root.join("paused"),
    );
    copy_dir(&root.join("paused"), &root.join("interrupted"));
    set_status(&root.join("interrupted"), "running");
    copy_dir(&root.join("finished"), &root.join("failed"));
    set_status(&root.join("failed"), "failed");
    // Half-written: what a start on a full disk leaves.
    std::fs::create_dir_all(root.join("half")).unwrap();
    std::fs::write(root.join("half/.throng.lock"), "999999\n").unwrap();
    std::fs::write(root.join("half/manifest.json.tmp"), "").unwrap();
    // Garbage where the manifest and the step log should be.
    copy_dir(&root.join("finished"), &root.join("garbage"));
    std::fs::write(root.join("garbage/manifest.json"), [0xff, 0x00, b'{', 0x13]).unwrap();
    copy_dir(&root.join("finished"), &root.join("bad-steps"));
    std::fs::write(
        root.join("bad-steps/steps.csv"),
        "population,step\nx,y,z\n\u{1}\n",
    )
    .unwrap();
    // A writer on another machine of a shared file system: running while its folder changes.
    copy_dir(&root.join("paused"), &root.join("elsewhere"));
    set_status(&root.join("elsewhere"), "running");
    std::fs::write(
        root.join("elsewhere/.throng.lock"),
        "4242\nsome-other-host\n",
    )
    .unwrap();
    let stuck = start_stuck(&root.join("running"));

    let s = serve(root, &[]);
    let status = |folder: &str| {
        run_named(&s, folder)["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(status("finished"), "finished");
    assert_eq!(status("paused"), "paused");
    assert_eq!(status("interrupted"), "interrupted");
    assert_eq!(status("failed"), "failed");
    assert_eq!(status("running"), "running");
    assert_eq!(status("elsewhere"), "running");
    let elsewhere = run_named(&s, "elsewhere")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let controls = &get_json(&s, &format!("/api/runs/{elsewhere}"))["controls"];
    assert_eq!(
        controls["pause"], false,
        "another machine's writer cannot be signalled"
    );
    for damaged in ["half", "garbage", "bad-steps"] {
        let r = run_named(&s, damaged);
        assert_eq!(r["status"], "damaged", "{r}");
        assert!(!r["damage"].as_str().unwrap().is_empty(), "{r}");
        // Its page answers too, and says so.
        let id = r["id"].as_str().unwrap();
        let detail = get_json(&s, &format!("/api/runs/{id}"));
        assert_eq!(detail["summary"]["status"], "damaged");
        // What can still be read is served; nothing is a server error.
        for path in ["steps/1", "decisions"] {
            let (code, body) = get(&s, &format!("/api/runs/{id}/{path}"));
            assert!(
                code == 200 || code == 404,
                "{damaged} {path}: {code} {body}"
            );
        }
    }
    let finished = run_named(&s, "finished");
    assert_eq!(finished["steps_done"], finished["planned_steps"]);
    assert!(finished["report"].as_bool().unwrap());
    assert!(finished["disk_bytes"].as_u64().unwrap() > 0);
    let running = run_named(&s, "running");
    assert_eq!(running["steps_done"], 2);
    assert!(running["eta_seconds"].as_f64().is_some(), "{running}");
    // The pages and their assets come from the binary.
    let (code, page) = get(&s, "/");
    assert!(code == 200 && page.contains("<html"), "{page}");
    let id = finished["id"].as_str().unwrap();
    let (code, _) = get(&s, &format!("/runs/{id}"));
    assert_eq!(code, 200);
    let (code, js) = get(&s, "/assets/vendor/uplot/uPlot.iife.min.js");
    assert!(code == 200 && js.len() > 10_000);
    // Its page plots the mean of every numeric state column per arm, step by step, and the
    // scenario's aggregates.
    let detail = get_json(
        &s,
        &format!("/api/runs/{}", finished["id"].as_str().unwrap()),
    );
    let names: Vec<&str> = detail["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"mean guess (two-thirds)"), "{names:?}");
    let guess = detail["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "mean guess (two-thirds)")
        .unwrap();
    assert_eq!(
        guess["points"].as_array().unwrap().len(),
        detail["steps"].as_array().unwrap().len(),
        "a point per step"
    );
    // A finished run steps through its steps: state summaries, aggregates, decisions.
    let step = get_json(&s, &format!("/api/runs/{id}/steps/2"));
    assert_eq!(step["step"], 2);
    let guess = step["state"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["column"] == "guess")
        .expect("the guess column");
    assert!(guess["agents"].as_u64().unwrap() > 0);
    assert!(!step["aggregates"].as_array().unwrap().is_empty());
    let decisions = get_json(&s, &format!("/api/runs/{id}/decisions?step=2&limit=5"));
    assert_eq!(decisions["step"], 2);
    assert_eq!(decisions["decisions"].as_array().unwrap().len(), 5);
    assert!(decisions["total"].as_u64().unwrap() >= 5);
    let mut stuck = stuck;
    let _ = stuck.child.kill();
    let _ = stuck.child.wait();
    assert!(
        s.child.as_ref().unwrap().try_wait_alive(),
        "the server is still up"
    );
}

trait Alive {
    fn try_wait_alive(&self) -> bool;
}

impl Alive for Child {
    fn try_wait_alive(&self) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(self.id() as i32, 0) == 0 }
    }
}

/// Reads server-sent events from `path` until `done` says so, or the limit.
fn events(s: &Served, path: &str, limit: Duration, mut done: impl FnMut(&str, &Value) -> bool) {
    let response = ureq::get(&format!("{}{path}", s.base))
        .timeout(limit)
        .call()
        .unwrap();
    let reader = BufReader::new(response.into_reader());
    let mut event = String::new();
    let deadline = Instant::now() + limit;
    for line in reader.lines() {
        assert!(
            Instant::now() < deadline,
            "timed out reading events of {path}"
        );
        let line = line.expect("the event stream");
        if let Some(name) = line.strip_prefix("event: ") {
            event = name.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            let value: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            if done(&event, &value) {
                return;
            }
        }
    }
    panic!("the event stream of {path} ended");
}

// A running scripted run's page gets an event for each step, without being asked again.
#[test]
fn each_step_of_a_running_run_produces_an_event() {
    let tmp = tempfile::tempdir().unwrap();
    let s = serve(tmp.path(), &["--read-only"]);
    let out = tmp.path().join("live");
    // Each step waits longer than the server's look (250 ms), so no two steps fall between
    // two looks however fast the machine; the last step hangs, so the run cannot end before
    // the watcher has seen its steps however slow the machine.
    let mut run = throng()
        .args(["run", "experiments/guess-1m-dummy.toml", "--agents", "2000"])
        .args(["--steps", "40", "--no-report", "--out"])
        .arg(&out)
        .env("THRONG_STEP_DELAY_MS", "600")
        .env("THRONG_CRASH_AT", "40:hang")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the run in the index", Duration::from_secs(60), || {
        runs(&s)
            .iter()
            .any(|r| r["path"].as_str().unwrap().ends_with("live"))
    });
    let id = run_named(&s, "live")["id"].as_str().unwrap().to_string();
    let mut seen = Vec::new();
    events(
        &s,
        &format!("/api/runs/{id}/events"),
        Duration::from_secs(300),
        |event, v| {
            if event == "run" {
                let done = v["summary"]["steps_done"].as_u64().unwrap();
                if seen.last() != Some(&done) {
                    seen.push(done);
                }
                // Each step row carries the page's rates.
                if let Some(last) = v["steps"].as_array().unwrap().last() {
                    assert!(last["decisions_per_second"].as_f64().unwrap() > 0.0);
                    assert!(last["rank_seconds"].as_array().is_some());
                }
            }
            seen.len() >= 4 || seen.last() == Some(&39)
        },
    );
    assert!(
        seen.len() >= 4,
        "a step every 600 ms shows as its own event: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[1] > w[0]),
        "steps done only rise: {seen:?}"
    );
    let _ = run.kill();
    let _ = run.wait();
}

// Control actions need the token the server printed; a read-only server has none to give.
#[test]
fn control_actions_without_the_token_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    run_to_end(
        &["tests/fixtures/guess-resume.toml"],
        &tmp.path().join("done"),
    );
    let s = serve(tmp.path(), &[]);
    let id = run_named(&s, "done")["id"].as_str().unwrap().to_string();
    for action in ["pause", "resume", "delete"] {
        let path = format!("/api/runs/{id}/{action}");
        let body = r#"{"confirm": "resume-guess"}"#;
        assert_eq!(post(&s, &path, None, body).0, 401, "{action}");
        assert_eq!(
            post(&s, &path, Some("not-the-token"), body).0,
            403,
            "{action}"
        );
    }
    assert!(
        tmp.path().join("done/manifest.json").is_file(),
        "nothing was deleted"
    );
    let ro = serve(tmp.path(), &["--read-only"]);
    let (code, body) = post(
        &ro,
        &format!("/api/runs/{id}/delete"),
        Some(&ro.token),
        r#"{"confirm": "resume-guess"}"#,
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("read-only"), "{body}");
    let detail = get_json(&ro, &format!("/api/runs/{id}"));
    assert_eq!(detail["controls"]["delete"], false);
    assert!(tmp.path().join("done/manifest.json").is_file());
}

// No path a client sends reaches the file system: `..`, absolute paths and their encoded
// forms are refused, and nothing outside the run's report files is served.
#[test]
fn traversal_in_any_form_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    run_to_end(&["tests/fixtures/guess-resume.toml"], &root.join("done"));
    std::fs::write(tmp.path().join("secret.txt"), "the secret").unwrap();
    let s = serve(&root, &[]);
    let id = run_named(&s, "done")["id"].as_str().unwrap().to_string();
    let (code, _) = get(&s, &format!("/runs/{id}/files/report.html"));
    assert_eq!(code, 200, "a report file is served");
    for path in [
        format!("/runs/{id}/files/../../secret.txt"),
        format!("/runs/{id}/files/..%2F..%2Fsecret.txt"),
        format!("/runs/{id}/files/%2E%2E/%2E%2E/secret.txt"),
        format!("/runs/{id}/files//etc/passwd"),
        format!("/runs/{id}/files/%2Fetc%2Fpasswd"),
        format!("/runs/{id}/files/manifest.json"),
        format!("/runs/{id}/files/config.toml"),
        "/runs/..%2F..%2Fsecret.txt/files/report.html".to_string(),
        "/api/runs/..%2F/steps/1".to_string(),
        "/api/runs/%2Fetc/decisions".to_string(),
        "/assets/../Cargo.toml".to_string(),
        "/assets/..%2F..%2FCargo.toml".to_string(),
        "/assets/%2Fetc%2Fpasswd".to_string(),
    ] {
        let (code, body) = get(&s, &path);
        assert!((400..500).contains(&code), "{path}: {code} {body}");
        assert!(
            !body.contains("the secret") && !body.contains("root:") && !body.contains("[package]"),
            "{path} leaked: {body}"
        );
    }
}

// The server binds loopback unless told otherwise, knowingly.
#[test]
fn a_non_loopback_bind_needs_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let Ran { ok, text, .. } = output(
        throng()
            .arg("serve")
            .arg(tmp.path())
            .args(["--addr", "0.0.0.0:0"]),
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("--public") && text.contains("0.0.0.0"),
        "{text}"
    );
    let s = serve(tmp.path(), &["--addr", "0.0.0.0:0", "--public"]);
    assert!(s.base.contains("0.0.0.0"), "{}", s.base);
    let Ran { ok, text, .. } = output(throng().arg("serve").arg(tmp.path().join("nowhere")));
    assert!(!ok && text.contains("not a folder"), "{text}");
}

// Pause takes the SIGTERM path and leaves a resumable folder; resume starts `throng run
// --resume` and its records equal an uninterrupted run's; delete needs the run's name.
#[test]
fn pause_resume_and_delete_through_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    std::fs::create_dir_all(&root).unwrap();
    // Long enough that the pause lands before the end, whatever the machine's speed.
    let long = [&LONG[..4], &["100", "--no-report"]].concat();
    let whole = tmp.path().join("whole");
    run_to_end(&long, &whole);
    let s = serve(&root, &[]);
    let out = root.join("steered");
    let run = Watched::spawn(throng().arg("run").args(&long).arg("--out").arg(&out));
    let mut id = String::new();
    wait_for("a step done", Duration::from_secs(120), || {
        runs(&s).iter().any(|r| {
            let found = r["path"].as_str().unwrap().ends_with("steered")
                && r["status"] == "running"
                && r["steps_done"].as_u64().unwrap() >= 1;
            if found {
                id = r["id"].as_str().unwrap().to_string();
            }
            found
        })
    });
    let detail = get_json(&s, &format!("/api/runs/{id}"));
    assert_eq!(detail["controls"]["pause"], true, "{}", detail["controls"]);
    let (code, body) = post(&s, &format!("/api/runs/{id}/pause"), Some(&s.token), "");
    assert_eq!(code, 202, "{body}");
    let Ran { ok, text, .. } = run.wait_at_most(Duration::from_secs(120));
    assert!(ok, "the paused run exits 0:\n{text}");
    assert_eq!(run_named(&s, "steered")["status"], "paused");
    // A finished or running run cannot be resumed; a paused one is, once.
    let (code, body) = post(&s, &format!("/api/runs/{id}/resume"), Some(&s.token), "");
    assert_eq!(code, 202, "{body}");
    wait_for("the resume to finish", Duration::from_secs(300), || {
        let d = get_json(&s, &format!("/api/runs/{id}"));
        d["child"]["running"] == false && d["child"]["exit"].is_number()
    });
    let d = get_json(&s, &format!("/api/runs/{id}"));
    assert_eq!(d["child"]["exit"], 0, "{}", d["child"]);
    assert_eq!(d["summary"]["status"], "finished");
    assert_same_records(
        &whole,
        &out,
        &RECORDS,
        "paused and resumed through the server",
    );
    // Delete: the name must be confirmed.
    let (code, body) = post(
        &s,
        &format!("/api/runs/{id}/delete"),
        Some(&s.token),
        r#"{"confirm": "not-its-name"}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(out.is_dir());
    let name = d["summary"]["name"].as_str().unwrap();
    let (code, body) = post(
        &s,
        &format!("/api/runs/{id}/delete"),
        Some(&s.token),
        &format!(r#"{{"confirm": "{name}"}}"#),
    );
    assert_eq!(code, 200, "{body}");
    assert!(!out.exists());
    assert!(runs(&s).iter().all(|r| r["id"] != id.as_str()));
}

// `throng run --serve` serves the page of the run it runs, from the same process.
#[test]
fn a_run_serves_its_own_page() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("self");
    // Long enough that the pause lands before the end.
    let mut child = throng()
        .arg("run")
        .args(&LONG[..4])
        .args(["100", "--no-report"])
        .arg("--out")
        .arg(&out)
        .args(["--serve", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut url = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while url.is_empty() {
        assert!(Instant::now() < deadline, "no page address");
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "stderr ended");
        if let Some(at) = line.find("http://") {
            url = line[at..].trim().to_string();
        }
    }
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = err.read_to_end(&mut sink);
    });
    let (page, token) = url.split_once("?token=").unwrap();
    let (base, id) = page.split_once("/runs/").unwrap();
    let s = Served {
        child: None,
        base: base.to_string(),
        token: token.to_string(),
    };
    wait_for("a step on the page", Duration::from_secs(120), || {
        let d = get_json(&s, &format!("/api/runs/{id}"));
        d["summary"]["steps_done"].as_u64().unwrap() >= 1 && d["summary"]["status"] == "running"
    });
    let (code, body) = post(&s, &format!("/api/runs/{id}/pause"), Some(&s.token), "");
    assert_eq!(code, 202, "{body}");
    let status = child.wait().unwrap();
    assert!(status.success());
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["status"], "paused");
}

// A model's decisions keep their whole prompt for the page (`prompts.jsonl`), each distinct
// prompt once; a step whose log is too long to read whole says so.
#[test]
fn a_logged_decision_opens_to_its_whole_prompt() {
    let model = common::tiny_model(&common::TinyLlama::default());
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    let out = root.join("llm");
    let Ran { ok, text, .. } = output(
        throng()
            .args(["run", "tests/fixtures/guess-resume.toml", "--no-report"])
            .args([
                "--policy",
                "llm",
                "--agents",
                "6",
                "--replicates",
                "1",
                "--steps",
                "2",
            ])
            .arg("--model")
            .arg(model.path())
            .arg("--out")
            .arg(&out),
    );
    assert!(ok, "{text}");
    // Its steps say where the time went and the KV memory it held.
    for step in throng::record::read_steps(&out).unwrap() {
        assert!(
            step.forward_seconds > 0.0 && step.forward_seconds <= step.seconds,
            "{step:?}"
        );
        assert!(step.mask_seconds > 0.0, "{step:?}");
        assert!(step.kv_bytes > 0, "{step:?}");
    }
    let s = serve(&root, &["--read-only"]);
    let id = run_named(&s, "llm")["id"].as_str().unwrap().to_string();
    let answer = get_json(&s, &format!("/api/runs/{id}/decisions?step=2"));
    let decisions = answer["decisions"].as_array().unwrap();
    assert!(!decisions.is_empty(), "{answer}");
    for d in decisions {
        let hash = d["prompt_hash"].as_str().expect("a model decision's hash");
        let prompt = get_json(&s, &format!("/api/runs/{id}/prompts/{hash}"));
        let text = prompt["text"].as_str().unwrap();
        assert!(
            text.starts_with("[system]\n") && text.contains("\n[user]\n"),
            "{text}"
        );
        assert_eq!(d["role"], "player");
    }
    let kept = std::fs::read_to_string(out.join("prompts.jsonl")).unwrap();
    assert!(kept.lines().count() > 0);
    let mut seen = std::collections::HashSet::new();
    for l in kept.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        assert!(
            seen.insert(v["hash"].as_str().unwrap().to_string()),
            "kept twice: {l}"
        );
    }
    // A scripted decision has no prompt.
    let (code, _) = get(&s, &format!("/api/runs/{id}/prompts/0000000000000000"));
    assert_eq!(code, 404);
}

// A step whose every one of many decisions was logged is filtered over its first 20,000
// lines, and the answer says so, rather than reading a million lines per page refresh.
#[test]
fn a_huge_step_log_is_read_in_part_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    let config = tmp.path().join("all.toml");
    std::fs::write(
        &config,
        format!(
            "name = \"all\"\nseed = 1\nsteps = 1\npolicy = \"scripted\"\nagents = 25000\n\
             templates = {:?}\n[scenario]\nname = \"guess\"\n",
            common::cli::repo()
                .join("templates/guess")
                .display()
                .to_string()
        ),
    )
    .unwrap();
    run_to_end(
        &[config.to_str().unwrap(), "--no-report"],
        &root.join("all"),
    );
    let s = serve(&root, &["--read-only"]);
    let id = run_named(&s, "all")["id"].as_str().unwrap().to_string();
    let answer = get_json(
        &s,
        &format!("/api/runs/{id}/decisions?fallback=none&limit=5"),
    );
    assert_eq!(answer["truncated"], true, "{}", answer["total"]);
    assert_eq!(answer["total"], 20_000);
    assert_eq!(answer["decisions"].as_array().unwrap().len(), 5);
}
