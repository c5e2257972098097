//! `throng serve` in a real browser: headless Chromium (Debian's `chromium`) driven through
//! WebDriver (`chromedriver`, with the fantoccini client). The index loads, a running run's
//! page shows its step count rising without a reload, its pause button leaves a resumable
//! folder whose resume gives the records of an uninterrupted run, and a screenshot is saved.
//!
//! `scripts/test` installs Chromium and its driver when they are missing; without them this
//! test skips loudly, and fails under THRONG_REQUIRE_ASSETS=1 (as in CI).

mod common;

use common::cli::{Ran, Watched, assert_same_records, output, throng};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: [&str; 4] = [
    "state.parquet",
    "decisions.jsonl",
    "cells.jsonl",
    "aggregates.csv",
];

/// Steps long enough to watch one by one.
const LONG: [&str; 6] = [
    "experiments/guess-1m-dummy.toml",
    "--agents",
    "500000",
    "--steps",
    "30",
    "--no-report",
];

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn find(program: &str, debian: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .chain([PathBuf::from(debian)])
        .find(|p| p.is_file())
}

/// Chromium and its driver, or a loud skip (a failure where CI requires them).
fn browser() -> Option<(PathBuf, PathBuf)> {
    match (
        find("chromedriver", "/usr/bin/chromedriver"),
        find("chromium", "/usr/bin/chromium"),
    ) {
        (Some(driver), Some(chromium)) => Some((driver, chromium)),
        _ if std::env::var("THRONG_REQUIRE_ASSETS").is_ok_and(|v| v == "1") => {
            panic!(
                "chromium and chromedriver are required (THRONG_REQUIRE_ASSETS=1): scripts/test installs them"
            )
        }
        _ => {
            common::loud_skip(
                "no chromium or chromedriver: the browser test needs Debian's chromium and chromium-driver (scripts/test installs them)",
            );
            None
        }
    }
}

fn serve(root: &Path) -> (Killed, String, String) {
    let mut child = Killed(
        throng()
            .arg("serve")
            .arg(root)
            .args(["--addr", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("the server's address").unwrap();
        if let Some(at) = line.find("http://") {
            let url = line[at..].trim().to_string();
            let (base, token) = url.split_once("/?token=").unwrap();
            std::thread::spawn(move || for _ in lines {});
            return (child, base.to_string(), token.to_string());
        }
    }
}

fn get_json(url: &str) -> Value {
    ureq::get(url).call().unwrap().into_json().unwrap()
}

async fn wait_for_element(c: &Client, css: &str, limit: Duration) {
    c.wait()
        .at_most(limit)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} within {limit:?}: {e}"));
}

async fn steps_done(c: &Client) -> Option<u64> {
    let e = c.find(Locator::Css("#steps-done")).await.ok()?;
    e.text().await.ok()?.trim().parse().ok()
}

#[test]
fn the_pages_load_follow_a_run_and_pause_it_resumably() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    let Ran { ok, text, .. } = output(throng().arg("run").args(LONG).arg("--out").arg(&whole));
    assert!(ok, "{text}");
    let root = tmp.path().join("runs");
    std::fs::create_dir_all(&root).unwrap();
    let (_server, base, token) = serve(&root);
    let out = root.join("watched");
    let run = Watched::spawn(throng().arg("run").args(LONG).arg("--out").arg(&out));
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        assert!(Instant::now() < deadline, "the run never reached the index");
        let runs = get_json(&format!("{base}/api/runs"));
        if let Some(r) = runs["runs"].as_array().unwrap().first() {
            break r["id"].as_str().unwrap().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    };

    let port = free_port();
    let _driver = Killed(
        Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let profile = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let started = Instant::now();
        let c = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(c) => break c,
                Err(e) if started.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("chromedriver did not start: {e}"),
            }
        };

        // The index, with the token in its address as the server printed it.
        c.goto(&format!("{base}/?token={token}")).await.unwrap();
        wait_for_element(&c, &format!("#runs tr[data-id='{id}']"), Duration::from_secs(30)).await;

        // The run's page: its step count rises across two steps without a reload.
        c.goto(&format!("{base}/runs/{id}")).await.unwrap();
        wait_for_element(&c, "#steps-done", Duration::from_secs(30)).await;
        let mut seen: Vec<u64> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(180);
        while seen.len() < 3 {
            assert!(Instant::now() < deadline, "the page's steps: {seen:?}");
            if let Some(n) = steps_done(&c).await
                && seen.last() != Some(&n)
            {
                seen.push(n);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
        // The latest sampled decisions fill their table, and the replay shows a step's state.
        wait_for_element(&c, "#decisions tbody tr.decision", Duration::from_secs(30)).await;

        // What the page weighs and how soon it drew, as the browser measured it.
        let timing = c
            .execute(
                "const nav = performance.getEntriesByType('navigation')[0];
                 const res = performance.getEntriesByType('resource');
                 const paint = performance.getEntriesByName('first-contentful-paint')[0];
                 const bytes = res.filter(r => !r.name.includes('/events'))
                     .reduce((s, r) => s + (r.transferSize || r.encodedBodySize || 0), nav.transferSize || 0);
                 return {bytes, first_paint_ms: paint ? paint.startTime : null,
                         dom_ms: nav.domContentLoadedEventEnd};",
                vec![],
            )
            .await
            .unwrap();
        eprintln!("run page: {timing}");
        assert!(timing["bytes"].as_f64().unwrap() > 0.0);

        let png = c.screenshot().await.unwrap();
        let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-run-page.png");
        std::fs::write(&shot, &png).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        eprintln!("screenshot: {}", shot.display());

        // Pause from the page: the run finishes its step, writes a checkpoint and exits.
        wait_for_element(&c, "#pause:not([disabled])", Duration::from_secs(30)).await;
        c.find(Locator::Css("#pause"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.close().await.unwrap();
    });
    let Ran { ok, text, .. } = run.wait_at_most(Duration::from_secs(120));
    assert!(ok, "the paused run exits 0:\n{text}");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["status"], "paused", "{manifest}");
    let Ran { ok, text, .. } = output(throng().args(["run", "--no-report", "--resume"]).arg(&out));
    assert!(ok, "{text}");
    assert_same_records(
        &whole,
        &out,
        &RECORDS,
        "paused from the browser, then resumed",
    );
}
