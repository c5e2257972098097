//! `throng serve` over HTTP, through the built binary: the index in every status a run folder
//! can be in (damaged ones included, without bringing the server down), live events as a run
//! steps, the token that control actions need, paths that never reach the file system, the
//! binding rules, and pause, resume and delete end to end.

mod common;

use common::cli::{Ran, Watched, assert_same_records, output, throng};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
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

/// An answer: its status, its headers (names in lower case) and its body.
struct Answer {
    code: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// GET `path` with exactly the headers given (no token unless one of them carries it).
fn get_with(s: &Served, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = ureq::get(&format!("{}{path}", s.base)).timeout(Duration::from_secs(60));
    for (name, value) in headers {
        req = req.set(name, value);
    }
    let answer = |r: ureq::Response| Answer {
        code: r.status(),
        headers: r
            .headers_names()
            .into_iter()
            .map(|n| {
                let v = r.header(&n).unwrap_or_default().to_string();
                (n.to_lowercase(), v)
            })
            .collect(),
        body: r.into_string().unwrap_or_default(),
    };
    match req.call() {
        Ok(r) => answer(r),
        Err(ureq::Error::Status(_, r)) => answer(r),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// GET `path` with the server's token, as the pages send it.
fn get(s: &Served, path: &str) -> (u16, String) {
    let a = get_with(s, path, &[("X-Throng-Token", &s.token)]);
    (a.code, a.body)
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
    // scenario's aggregates, a panel each.
    let detail = get_json(
        &s,
        &format!("/api/runs/{}", finished["id"].as_str().unwrap()),
    );
    let panels = detail["panels"].as_array().unwrap();
    let guess = panels
        .iter()
        .find(|p| p["measure"] == "guess" && p["source"] == "state")
        .unwrap_or_else(|| panic!("{panels:?}"));
    let mean = guess["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["arm"] == "two-thirds" && l["replicate"].is_null())
        .unwrap();
    assert_eq!(
        mean["points"].as_array().unwrap().len(),
        detail["steps"].as_array().unwrap().len(),
        "a point per step"
    );
    assert!(
        panels.iter().any(|p| p["source"] == "aggregates"),
        "{panels:?}"
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
    assert!(
        decisions["next"].is_u64(),
        "the step has more: {}",
        decisions["next"]
    );
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
        .set("X-Throng-Token", &s.token)
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

// Guards against issue 30, item 17: `run --serve` on a busy port wrote the run's folder first,
// then failed, leaving an "interrupted" folder that refused the same command once the port was
// free.
#[test]
fn a_run_whose_live_page_port_is_busy_is_refused_before_its_folder_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = tmp.path().join("run");
    let args = [
        "run",
        "experiments/guess-1m-dummy.toml",
        "--agents",
        "10",
        "--steps",
        "1",
        "--no-report",
        "--out",
        out.to_str().unwrap(),
        "--serve",
    ];
    let Ran { ok, text, .. } = output(throng().args(args).arg(&addr));
    assert!(!ok, "{text}");
    assert!(text.contains("--serve") && text.contains(&addr), "{text}");
    assert!(!out.exists(), "a folder was written: {text}");
    // Once the port is free, the same command runs.
    drop(busy);
    let Ran { ok, text, .. } = output(throng().args(args).arg(&addr));
    assert!(ok, "{text}");
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
    // Confirmed by the folder's name: every run of a config shares the config's name.
    let name = d["summary"]["folder"].as_str().unwrap();
    assert_eq!(name, "steered");
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

/// A run started with `--serve` on a free port: its process, its server (with the token its
/// page address carries) and its run's id.
fn serve_own(cmd: &mut Command) -> (Child, Served, String) {
    let mut child = cmd
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
    (child, s, id.to_string())
}

// `throng run --serve` serves the page of the run it runs, from the same process.
#[test]
fn a_run_serves_its_own_page() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("self");
    // Long enough that the pause lands before the end.
    let (mut child, s, id) = serve_own(
        throng()
            .arg("run")
            .args(&LONG[..4])
            .args(["100", "--no-report"])
            .arg("--out")
            .arg(&out),
    );
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

// A step whose every one of many decisions was logged is filtered 20,000 lines at a time,
// and the answer says so and where to go on, rather than reading a million lines per page
// refresh.
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
    // A filter that matches none of them reads the step 20,000 lines at a time.
    let answer = get_json(
        &s,
        &format!("/api/runs/{id}/decisions?fallback=only&limit=5"),
    );
    assert_eq!(answer["truncated"], true, "{}", answer["scanned"]);
    assert_eq!(answer["scanned"], 20_000);
    assert!(answer["decisions"].as_array().unwrap().is_empty());
    let next = answer["next"].as_u64().expect("where to go on");
    let rest = get_json(
        &s,
        &format!("/api/runs/{id}/decisions?fallback=only&limit=5&from={next}"),
    );
    assert_eq!(rest["scanned"], 5_000);
    assert_eq!(rest["truncated"], false);
    assert!(rest["next"].is_null(), "{}", rest["next"]);
    // One that matches them all fills its page, and says where the next one starts.
    let answer = get_json(
        &s,
        &format!("/api/runs/{id}/decisions?fallback=none&limit=5"),
    );
    assert_eq!(answer["decisions"].as_array().unwrap().len(), 5);
    assert_eq!(answer["truncated"], false);
    assert!(answer["next"].is_u64());
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(made, 0, "mkfifo {}", path.display());
}

fn id_named(s: &Served, folder: &str) -> String {
    run_named(s, folder)["id"].as_str().unwrap().to_string()
}

// Pause signalled whatever process had the pid that a killed run's lock file kept: with pid
// reuse it killed an innocent process, and the run showed as running and refused resume and
// delete. A run is running only while its lock is held.
#[test]
fn a_killed_runs_lock_naming_a_live_process_neither_makes_it_running_nor_lets_pause_signal_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let small = ["tests/fixtures/guess-resume.toml"];
    run_to_end(&small, &root.join("finished"));
    run_to_end(
        &[&small[..], &["--stop-after", "1"]].concat(),
        &root.join("killed"),
    );
    set_status(&root.join("killed"), "running");
    // An innocent process of this machine, given the pid the killed writers had.
    let mut innocent = Command::new("sleep").arg("600").spawn().unwrap();
    let lock = format!("{}\n{}\n", innocent.id(), throng::record::host());
    for run in ["finished", "killed"] {
        std::fs::write(root.join(run).join(".throng.lock"), &lock).unwrap();
    }
    let s = serve(root, &[]);
    let killed = run_named(&s, "killed");
    assert_eq!(killed["status"], "interrupted", "{killed}");
    let id = id_named(&s, "killed");
    let controls = &get_json(&s, &format!("/api/runs/{id}"))["controls"];
    assert_eq!(controls["pause"], false, "{controls}");
    assert_eq!(controls["resume"], true, "{controls}");
    let (code, body) = post(&s, &format!("/api/runs/{id}/pause"), Some(&s.token), "");
    assert_eq!(code, 409, "{body}");
    let finished = id_named(&s, "finished");
    assert_eq!(run_named(&s, "finished")["status"], "finished");
    let controls = &get_json(&s, &format!("/api/runs/{finished}"))["controls"];
    assert_eq!(controls["delete"], true, "{controls}");
    std::thread::sleep(Duration::from_millis(300));
    let signalled = innocent.try_wait().unwrap();
    let _ = innocent.kill();
    let _ = innocent.wait();
    assert!(
        signalled.is_none(),
        "the innocent process was signalled: {signalled:?}"
    );
}

// A FIFO as `manifest.json` blocked `/api/runs` forever, and a thread with it at each call:
// the server opens only regular files of a run folder, and never waits on one.
#[test]
fn a_fifo_in_a_run_folder_never_blocks_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    run_to_end(
        &["tests/fixtures/guess-resume.toml"],
        &root.join("finished"),
    );
    std::fs::create_dir_all(root.join("pipe-manifest")).unwrap();
    mkfifo(&root.join("pipe-manifest/manifest.json"));
    copy_dir(&root.join("finished"), &root.join("pipes"));
    for f in [
        "steps.csv",
        "decisions.jsonl",
        "prompts.jsonl",
        "aggregates.csv",
        "config.toml",
        "summary.json",
        ".throng.lock",
    ] {
        let path = root.join("pipes").join(f);
        let _ = std::fs::remove_file(&path);
        mkfifo(&path);
    }
    let s = serve(root, &[]);
    let r = run_named(&s, "pipe-manifest");
    assert_eq!(r["status"], "damaged", "{r}");
    assert!(
        r["damage"].as_str().unwrap().contains("not a regular file"),
        "{r}"
    );
    let pipes = run_named(&s, "pipes");
    assert_eq!(pipes["status"], "damaged", "{pipes}");
    let id = id_named(&s, "pipes");
    for path in [
        format!("/api/runs/{id}"),
        format!("/api/runs/{id}/decisions"),
        format!("/api/runs/{id}/steps/1"),
        format!("/api/runs/{id}/prompts/0000000000000000"),
        format!("/api/runs/{id}/config"),
        format!("/runs/{id}/files/summary.json"),
        format!("/runs/{id}/files/steps.csv"),
    ] {
        let (code, body) = get(&s, &path);
        assert!((200..500).contains(&code), "{path}: {code} {body}");
    }
    events(
        &s,
        &format!("/api/runs/{id}/events"),
        Duration::from_secs(60),
        |event, _| event == "run",
    );
}

// A `figures` link in a run folder was followed out of it, and a file outside the served
// folder was served: nothing reached through a link is served.
#[test]
fn a_link_in_a_run_folder_is_never_followed_out_of_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    run_to_end(&["tests/fixtures/guess-resume.toml"], &root.join("done"));
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("fig_secret.svg"), "<svg>the secret</svg>").unwrap();
    std::fs::write(outside.join("report.html"), "the secret").unwrap();
    let done = root.join("done");
    std::fs::remove_dir_all(done.join("figures")).unwrap();
    std::os::unix::fs::symlink(&outside, done.join("figures")).unwrap();
    std::os::unix::fs::symlink(outside.join("fig_secret.svg"), done.join("fig_linked.svg"))
        .unwrap();
    std::fs::remove_file(done.join("summary.json")).unwrap();
    std::os::unix::fs::symlink(outside.join("report.html"), done.join("summary.json")).unwrap();
    let s = serve(&root, &[]);
    let id = id_named(&s, "done");
    let detail = get_json(&s, &format!("/api/runs/{id}"));
    let files = detail["files"].to_string();
    assert!(
        !files.contains("secret") && !files.contains("linked") && !files.contains("summary"),
        "{files}"
    );
    for file in ["figures/fig_secret.svg", "fig_linked.svg", "summary.json"] {
        let (code, body) = get(&s, &format!("/runs/{id}/files/{file}"));
        assert!((400..500).contains(&code), "{file}: {code} {body}");
        assert!(!body.contains("the secret"), "{file} leaked: {body}");
    }
}

// A script in a run folder's SVG ran same-origin with the page's token and deleted another
// run: files of a run folder are served under a Content-Security-Policy that allows no
// script, never sniffed, and an SVG as an image only (an attachment when opened).
#[test]
fn run_files_are_served_under_a_policy_that_runs_no_script() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    run_to_end(&["tests/fixtures/guess-resume.toml"], &root.join("done"));
    let s = serve(&root, &[]);
    let id = id_named(&s, "done");
    let detail = get_json(&s, &format!("/api/runs/{id}"));
    let svg = detail["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .find(|f| f.ends_with(".svg"))
        .expect("a figure");
    for file in ["report.html", &svg, "summary.json"] {
        let a = get_with(
            &s,
            &format!("/runs/{id}/files/{file}"),
            &[("X-Throng-Token", &s.token)],
        );
        assert_eq!(a.code, 200, "{file}: {}", a.body);
        let csp = a.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{file}: {csp:?}");
        assert!(!csp.contains("script-src"), "{file}: {csp:?}");
        assert_eq!(
            a.header("x-content-type-options"),
            Some("nosniff"),
            "{file}"
        );
    }
    let report = get_with(
        &s,
        &format!("/runs/{id}/files/report.html"),
        &[("X-Throng-Token", &s.token)],
    );
    let csp = report.header("content-security-policy").unwrap();
    assert!(csp.contains("img-src 'self'"), "{csp}");
    let figure = get_with(
        &s,
        &format!("/runs/{id}/files/{svg}"),
        &[("X-Throng-Token", &s.token)],
    );
    assert!(
        figure
            .header("content-disposition")
            .is_some_and(|d| d.starts_with("attachment")),
        "{:?}",
        figure.headers
    );
}

// `run --serve` served the parent of --out, so its token could delete the runs beside it: it
// serves the run alone.
#[test]
fn a_run_serves_its_own_folder_and_nothing_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    run_to_end(&["tests/fixtures/guess-resume.toml"], &root.join("sibling"));
    let (mut child, s, id) = serve_own(
        throng()
            .arg("run")
            .args(LONG)
            .arg("--out")
            .arg(root.join("self"))
            .env("THRONG_CRASH_AT", "3:hang"),
    );
    let listed: Vec<String> = runs(&s)
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_string())
        .collect();
    // The sibling's id, as a server of the parent folder gives it.
    let sibling: String = {
        use sha2::Digest;
        sha2::Sha256::digest(b"sibling")[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let (read, _) = get(&s, &format!("/api/runs/{sibling}"));
    let (deleted, body) = post(
        &s,
        &format!("/api/runs/{sibling}/delete"),
        Some(&s.token),
        r#"{"confirm": "sibling"}"#,
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].ends_with("self"), "{listed:?}");
    assert_eq!(read, 404);
    assert_eq!(deleted, 404, "{body}");
    assert!(root.join("sibling/manifest.json").is_file());
    assert!(!id.is_empty());
}

// Reads needed no token and the Host header was not checked: a DNS-rebinding page could read
// every run's prompts and decisions. Every read needs the token (a header, or the cookie that
// the page's address with the token sets), and a request naming another host is refused.
#[test]
fn reads_need_the_token_and_another_host_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    run_to_end(&["tests/fixtures/guess-resume.toml"], &root.join("done"));
    let s = serve(&root, &[]);
    let id = id_named(&s, "done");
    let reads = [
        "/api/runs".to_string(),
        "/api/server".to_string(),
        "/api/events".to_string(),
        format!("/api/runs/{id}"),
        format!("/api/runs/{id}/events"),
        format!("/api/runs/{id}/decisions"),
        format!("/api/runs/{id}/steps/1"),
        format!("/runs/{id}/files/report.html"),
    ];
    for path in &reads {
        let a = get_with(&s, path, &[]);
        assert_eq!(a.code, 401, "{path}: {}", a.body);
        assert!(a.body.contains("token"), "{path}: {}", a.body);
        let a = get_with(&s, path, &[("X-Throng-Token", "not-the-token")]);
        assert_eq!(a.code, 403, "{path}: {}", a.body);
    }
    // The page's address with the token sets a cookie that no script can read and no other
    // site can send; the page's requests carry it.
    let page = get_with(&s, &format!("/?token={}", s.token), &[]);
    assert_eq!(page.code, 200);
    let cookie = page.header("set-cookie").expect("a cookie").to_string();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    let pair = cookie.split(';').next().unwrap();
    for path in &reads[..2] {
        assert_eq!(get_with(&s, path, &[("Cookie", pair)]).code, 200, "{path}");
    }
    let report = get_with(
        &s,
        &format!("/runs/{id}/files/report.html"),
        &[("Cookie", pair)],
    );
    assert_eq!(report.code, 200);
    assert!(
        get_with(&s, "/?token=not-the-token", &[])
            .header("set-cookie")
            .is_none()
    );
    // A name of this machine is fine; another host's name, as a rebinding page sends it, is
    // refused, token or not.
    let port = s.base.rsplit(':').next().unwrap();
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let a = get_with(
            &s,
            "/api/runs",
            &[("X-Throng-Token", &s.token), ("Host", &host)],
        );
        assert_eq!(a.code, 200, "{host}: {}", a.body);
    }
    for path in ["/", "/api/runs"] {
        for host in [format!("evil.example:{port}"), "127.0.0.1:1".to_string()] {
            let a = get_with(&s, path, &[("X-Throng-Token", &s.token), ("Host", &host)]);
            assert_eq!(a.code, 403, "{host} {path}: {}", a.body);
            assert!(a.body.contains(&host), "{host} {path}: {}", a.body);
        }
    }
}

/// Copies a finished run of the resume fixture (no report) into `dir`, for a decision log of
/// its own.
fn finished_run(dir: &Path) {
    run_to_end(&["tests/fixtures/guess-resume.toml", "--no-report"], dir);
}

/// A figure of the server process from /proc: `VmHWM` (peak resident memory) in bytes from
/// `status`, or `rchar` (bytes read) from `io`.
fn proc_figure(pid: u32, file: &str, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/{file}"));
    let n: u64 = line[key.len()..]
        .trim_start_matches(':')
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    if line.ends_with("kB") { n * 1024 } else { n }
}

// A 150,000-agent run's 3.2 GB decision log took 44 s and 4.3 GB of server memory to open,
// kept after the page closed: the log is read through a bounded index, and a page answers
// without the whole file being read.
#[test]
fn a_multi_gigabyte_decision_log_opens_in_bounded_memory_without_being_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    let dir = root.join("big");
    finished_run(&dir);
    let steps = throng::record::read_steps(&dir).unwrap();
    // Over 2 GiB of log, written in the order a run writes it: step after step.
    let padding = "x".repeat(2000);
    let per_step: usize = 190_000;
    {
        use std::io::Write;
        let mut out =
            std::io::BufWriter::new(std::fs::File::create(dir.join("decisions.jsonl")).unwrap());
        for step in &steps {
            for i in 0..per_step {
                let (arm, replicate, agent) =
                    (["two-thirds", "five-plus-half"][i % 2], (i / 2) % 2, i / 4);
                writeln!(
                    out,
                    r#"{{"arm":"{arm}","population":{},"replicate":{replicate},"step":{},"agent":{agent},"role":"player","prompt_hash":null,"text":"{padding}","value":null,"clamps":[],"fallback":null,"prompt_tokens":0,"cached_tokens":0,"generated_tokens":0,"latency_ms":null,"decision":{{"guess":1}}}}"#,
                    step.population, step.step
                )
                .unwrap();
            }
        }
        out.flush().unwrap();
    }
    let size = std::fs::metadata(dir.join("decisions.jsonl"))
        .unwrap()
        .len();
    assert!(size > 2 << 30, "{size}");
    let s = serve(&root, &["--read-only"]);
    let pid = s.child.as_ref().unwrap().id();
    let id = id_named(&s, "big");
    let _ = get_json(&s, &format!("/api/runs/{id}"));
    let (peak, read) = (
        proc_figure(pid, "status", "VmHWM"),
        proc_figure(pid, "io", "rchar"),
    );
    let latest = get_json(&s, &format!("/api/runs/{id}/decisions?limit=200"));
    let bounded = |what: &str| {
        let grew = proc_figure(pid, "status", "VmHWM").saturating_sub(peak);
        let read = proc_figure(pid, "io", "rchar") - read;
        assert!(
            grew < 256 << 20,
            "{what}: the server's peak memory grew by {grew} bytes"
        );
        assert!(
            read < size / 8,
            "{what}: the server read {read} bytes of a {size}-byte log"
        );
    };
    bounded("the latest page");
    assert_eq!(latest["step"], steps.len(), "{}", latest["steps"]);
    let last = steps.last().unwrap();
    let decisions = latest["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 200);
    assert!(
        decisions
            .iter()
            .all(|d| d["step"] == last.step && d["population"] == last.population)
    );
    let first = get_json(&s, &format!("/api/runs/{id}/decisions?step=1&limit=200"));
    assert_eq!(
        first["decisions"][0]["agent"], 0,
        "{}",
        first["decisions"][0]
    );
    assert_eq!(first["steps"].as_array().unwrap().len(), steps.len());
    let next = first["next"].as_u64().expect("a next page");
    let second = get_json(
        &s,
        &format!("/api/runs/{id}/decisions?step=1&limit=200&from={next}"),
    );
    assert_eq!(
        second["decisions"][0]["agent"], 50,
        "{}",
        second["decisions"][0]
    );
    bounded("three pages");
}

// The decisions table stayed empty while a run went: the decisions of the step being written
// show before the step ends.
#[test]
fn the_decisions_of_a_step_still_being_written_are_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    let dir = root.join("going");
    finished_run(&dir);
    // The last step's decisions are written, its line of steps.csv not yet.
    let steps = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
    let kept: Vec<&str> = steps.lines().collect();
    std::fs::write(
        dir.join("steps.csv"),
        kept[..kept.len() - 1].join("\n") + "\n",
    )
    .unwrap();
    set_status(&dir, "running");
    let s = serve(&root, &["--read-only"]);
    let id = id_named(&s, "going");
    let answer = get_json(&s, &format!("/api/runs/{id}/decisions"));
    let done = kept.len() - 2;
    assert_eq!(answer["step"], done + 1, "{}", answer["steps"]);
    assert_eq!(answer["in_progress"], true);
    let decisions = answer["decisions"].as_array().unwrap();
    assert!(!decisions.is_empty());
    assert!(
        decisions
            .iter()
            .all(|d| d["step"] == 3 && d["population"] == 300)
    );
}

// Researchers could not page past the first 200 decisions, filter by replicate, read the
// run's config or download its records; the headline chart mixed every measure on one axis;
// and Delete's confirmation asked for a name every run of a config shares.
#[test]
fn a_run_page_pages_decisions_and_offers_its_config_records_and_panels() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    finished_run(&root.join("first"));
    copy_dir(&root.join("first"), &root.join("second"));
    let s = serve(&root, &[]);
    let first = run_named(&s, "first");
    assert_eq!(first["folder"], "first", "{first}");
    assert_eq!(first["name"], "resume-guess");
    assert_eq!(first["policy"], "scripted");
    let id = id_named(&s, "first");
    let page = |query: &str| get_json(&s, &format!("/api/runs/{id}/decisions?step=1&{query}"));
    let one = page("limit=50");
    let key = |d: &Value| format!("{}/{}/{}", d["arm"], d["replicate"], d["agent"]);
    let keys =
        |a: &Value| -> Vec<String> { a["decisions"].as_array().unwrap().iter().map(key).collect() };
    assert_eq!(keys(&one).len(), 50);
    let next = one["next"].as_u64().expect("a next page");
    let two = page(&format!("limit=50&from={next}"));
    assert_eq!(keys(&two).len(), 50);
    assert!(keys(&two).iter().all(|k| !keys(&one).contains(k)));
    assert_eq!(
        one["replicates"],
        serde_json::json!([0, 1]),
        "{}",
        one["replicates"]
    );
    let replicate = page("limit=1000&replicate=1");
    let found = replicate["decisions"].as_array().unwrap();
    assert!(!found.is_empty());
    assert!(found.iter().all(|d| d["replicate"] == 1));
    let arm = page("limit=1000&arm=five-plus-half");
    let found = arm["decisions"].as_array().unwrap();
    assert!(!found.is_empty());
    assert!(found.iter().all(|d| d["arm"] == "five-plus-half"));
    // The config, and the records as downloads under the policy.
    let config = get_json(&s, &format!("/api/runs/{id}/config"));
    assert!(
        config["text"]
            .as_str()
            .unwrap()
            .contains("name = \"resume-guess\""),
        "{config}"
    );
    let detail = get_json(&s, &format!("/api/runs/{id}"));
    for record in [
        "aggregates.csv",
        "steps.csv",
        "state.parquet",
        "decisions.jsonl",
    ] {
        assert!(
            detail["downloads"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d == record),
            "{record}: {}",
            detail["downloads"]
        );
        let a = get_with(
            &s,
            &format!("/runs/{id}/files/{record}"),
            &[("X-Throng-Token", &s.token)],
        );
        assert_eq!(a.code, 200, "{record}");
        assert!(
            a.header("content-disposition")
                .is_some_and(|d| d.starts_with("attachment")),
            "{record}: {:?}",
            a.headers
        );
        assert!(
            a.header("content-security-policy")
                .is_some_and(|c| c.contains("default-src 'none'")),
            "{record}"
        );
        assert_eq!(
            a.header("content-length")
                .and_then(|l| l.parse::<u64>().ok()),
            Some(
                std::fs::metadata(root.join("first").join(record))
                    .unwrap()
                    .len()
            ),
            "{record}"
        );
    }
    // A panel per measure: each arm's mean over replicates and a line per replicate.
    let panels = detail["panels"].as_array().unwrap();
    let players = panels
        .iter()
        .find(|p| p["measure"] == "players")
        .unwrap_or_else(|| panic!("{panels:?}"));
    let lines = players["lines"].as_array().unwrap();
    for arm in ["two-thirds", "five-plus-half"] {
        for replicate in [Value::Null, 0.into(), 1.into()] {
            assert!(
                lines
                    .iter()
                    .any(|l| l["arm"] == arm && l["replicate"] == replicate),
                "{arm} {replicate}: {lines:?}"
            );
        }
    }
    assert!(panels.iter().any(|p| p["measure"] == "guess"), "{panels:?}");
    // Delete is confirmed by the folder's name, which no other run shares.
    let second = id_named(&s, "second");
    let (code, body) = post(
        &s,
        &format!("/api/runs/{second}/delete"),
        Some(&s.token),
        r#"{"confirm": "resume-guess"}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("second"), "{body}");
    assert!(root.join("second").is_dir());
    let (code, body) = post(
        &s,
        &format!("/api/runs/{second}/delete"),
        Some(&s.token),
        r#"{"confirm": "second"}"#,
    );
    assert_eq!(code, 200, "{body}");
    assert!(!root.join("second").exists());
    assert!(root.join("first").is_dir());
}
