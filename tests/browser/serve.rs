//! `throng serve` in a real browser: headless Chromium (Debian's `chromium`) driven through
//! WebDriver (`chromedriver`, with the fantoccini client). The index loads, a running run's
//! page shows its step count rising without a reload, its pause button leaves a resumable
//! folder whose resume gives the records of an uninterrupted run, and a screenshot is saved.
//!
//! `scripts/test` installs Chromium and its driver when they are missing; without them this
//! test skips loudly, and fails under THRONG_REQUIRE_ASSETS=1 (as in CI).

// The shared helpers this test uses, from the throng package's tests.
#[path = "../common/cli.rs"]
#[allow(dead_code)]
mod cli;
#[path = "../common/skip.rs"]
mod skip;

use cli::{Ran, Watched, assert_same_records, output, throng};
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
            skip::loud_skip(
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

/// A read of the server's API, with its token.
fn get_json(url: &str, token: &str) -> Value {
    ureq::get(url)
        .set("X-Throng-Token", token)
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

/// A WebDriver session of headless Chromium (its driver and profile go when it is dropped).
struct Browser {
    _driver: Killed,
    _profile: tempfile::TempDir,
    client: Client,
}

async fn open_browser(driver: &Path, chromium: &Path) -> Browser {
    let port = free_port();
    let driver = Killed(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let profile = tempfile::tempdir().unwrap();
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
    let client = loop {
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
    Browser {
        _driver: driver,
        _profile: profile,
        client,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The id of the run in `folder` under the server's root.
fn id_of(base: &str, token: &str, folder: &str) -> String {
    let runs = get_json(&format!("{base}/api/runs"), token);
    runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"].as_str().unwrap().ends_with(folder))
        .unwrap_or_else(|| panic!("{folder} not in {runs}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn run_to_end(args: &[&str], out: &Path) {
    let Ran { ok, text, .. } = output(throng().arg("run").args(args).arg("--out").arg(out));
    assert!(ok, "{text}");
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
        let runs = get_json(&format!("{base}/api/runs"), &token);
        if let Some(r) = runs["runs"].as_array().unwrap().first() {
            break r["id"].as_str().unwrap().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    };

    runtime().block_on(async {
        let browser = open_browser(&driver, &chromium).await;
        let c = &browser.client;

        // The index, with the token in its address as the server printed it.
        c.goto(&format!("{base}/?token={token}")).await.unwrap();
        wait_for_element(c, &format!("#runs tr[data-id='{id}']"), Duration::from_secs(30)).await;

        // The run's page: its step count rises across two steps without a reload.
        c.goto(&format!("{base}/runs/{id}")).await.unwrap();
        wait_for_element(c, "#steps-done", Duration::from_secs(30)).await;
        let mut seen: Vec<u64> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(180);
        while seen.len() < 3 {
            assert!(Instant::now() < deadline, "the page's steps: {seen:?}");
            if let Some(n) = steps_done(c).await
                && seen.last() != Some(&n)
            {
                seen.push(n);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen.windows(2).all(|w| w[1] > w[0]), "{seen:?}");
        // The latest sampled decisions fill their table, and the replay shows a step's state.
        wait_for_element(c, "#decisions tbody tr.decision", Duration::from_secs(30)).await;

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
        wait_for_element(c, "#pause:not([disabled])", Duration::from_secs(30)).await;
        c.find(Locator::Css("#pause"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.clone().close().await.unwrap();
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

/// A script that deletes the run `victim` with the page's token, wherever it can find one.
fn attack(victim: &str) -> String {
    format!(
        "const t = sessionStorage.getItem('throng-token') || '';
         for (const name of ['resume-guess', 'victim']) {{
           fetch('/api/runs/{victim}/delete', {{method: 'POST',
             headers: {{'X-Throng-Token': t, 'Content-Type': 'application/json'}},
             body: JSON.stringify({{confirm: name}})}});
         }}"
    )
}

// A script in a run folder's SVG read the token from the page's session storage and deleted
// another run: files of a run folder are served under a policy that runs no script, an SVG
// only as an image, while the run's own report still shows its figures and its style.
#[test]
fn a_script_in_a_run_folders_svg_or_report_never_runs() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    let fixture = ["tests/fixtures/guess-resume.toml"];
    run_to_end(&fixture, &root.join("victim"));
    run_to_end(&fixture, &root.join("evil"));
    let (_server, base, token) = serve(&root);
    let victim = id_of(&base, &token, "victim");
    let evil = id_of(&base, &token, "evil");
    let script = attack(&victim);
    std::fs::write(
        root.join("evil/figures/fig_evil.svg"),
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"><script>{script}</script></svg>"
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("evil/report.html"),
        format!(
            "<!doctype html><html><body><img src=\"figures/fig_evil.svg\">\
             <iframe src=\"figures/fig_evil.svg\"></iframe><object data=\"figures/fig_evil.svg\"></object>\
             <img src=\"nowhere.png\" onerror=\"{}\"><script>{script}</script></body></html>",
            script.replace('"', "&quot;")
        ),
    )
    .unwrap();
    runtime().block_on(async {
        let browser = open_browser(&driver, &chromium).await;
        let c = &browser.client;
        // The user opens the server's address with its token, then the evil run's files.
        c.goto(&format!("{base}/?token={token}")).await.unwrap();
        wait_for_element(c, &format!("#runs tr[data-id='{victim}']"), Duration::from_secs(30)).await;
        for file in ["figures/fig_evil.svg", "report.html"] {
            // An attachment is no page to go to: the browser may say the navigation aborted.
            let _ = c.goto(&format!("{base}/runs/{evil}/files/{file}")).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        assert!(
            root.join("victim/manifest.json").is_file(),
            "a script of another run's files deleted the victim"
        );
        // The victim's own report shows its figures (images of the run folder) and its style.
        c.goto(&format!("{base}/runs/{victim}/files/report.html"))
            .await
            .unwrap();
        let shown = c
            .execute(
                "const imgs = [...document.images];
                 return Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = r; i.onerror = r; })))
                   .then(() => ({images: imgs.length, drawn: imgs.filter(i => i.naturalWidth > 0).length,
                                 font: getComputedStyle(document.body).fontFamily}));",
                vec![],
            )
            .await
            .unwrap();
        let images = shown["images"].as_u64().unwrap();
        assert!(images > 0, "{shown}");
        assert_eq!(shown["drawn"].as_u64().unwrap(), images, "{shown}");
        assert!(shown["font"].as_str().unwrap().contains("sans-serif"), "{shown}");
        c.clone().close().await.unwrap();
    });
}

// The headline chart put counts (hundreds of players) on the axis of means (about 30), the
// decisions table stopped at its first 200 rows, and neither the config nor the records could
// be had from the page. Each measure gets a panel with its own scale (arms side by side, a
// thin line per replicate), the table pages and filters by replicate, the config shows and the
// records download; the index names each run's folder and policy.
#[test]
fn the_run_page_gives_each_measure_its_own_scale_and_pages_its_decisions() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("runs");
    run_to_end(
        &["tests/fixtures/guess-resume.toml", "--no-report"],
        &root.join("study"),
    );
    let (_server, base, token) = serve(&root);
    let id = id_of(&base, &token, "study");
    runtime().block_on(async {
        let browser = open_browser(&driver, &chromium).await;
        let c = &browser.client;
        c.goto(&format!("{base}/?token={token}")).await.unwrap();
        let row = format!("#runs tr[data-id='{id}']");
        wait_for_element(c, &format!("{row} td.folder a"), Duration::from_secs(30)).await;
        let text = |css: String| async move {
            c.find(Locator::Css(&css))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        };
        assert_eq!(text(format!("{row} td.folder")).await.trim(), "study");
        assert_eq!(text(format!("{row} td.policy")).await.trim(), "scripted");

        c.goto(&format!("{base}/runs/{id}")).await.unwrap();
        wait_for_element(
            c,
            "#panels .chart[data-measure='players'][data-y-max]",
            Duration::from_secs(30),
        )
        .await;
        let panels = c
            .execute(
                "return [...document.querySelectorAll('#panels .chart')].map(d => ({
                   measure: d.dataset.measure, max: Number(d.dataset.yMax),
                   legend: d.querySelector('.u-legend') ? d.querySelector('.u-legend').textContent : ''}));",
                vec![],
            )
            .await
            .unwrap();
        let panel = |measure: &str| {
            panels
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["measure"] == measure)
                .unwrap_or_else(|| panic!("no panel of {measure}: {panels}"))
                .clone()
        };
        let (players, guess) = (panel("players"), panel("guess"));
        // Players are counted in hundreds, guesses are below 100: each has its own axis.
        assert!(players["max"].as_f64().unwrap() >= 200.0, "{panels}");
        assert!(guess["max"].as_f64().unwrap() <= 100.0, "{panels}");
        let legend = players["legend"].as_str().unwrap();
        for arm in ["two-thirds", "five-plus-half", "replicate 1"] {
            assert!(legend.contains(arm), "{arm} not in the legend: {legend}");
        }
        // Both arms are drawn, in their colours (the page's first two).
        let drawn = c
            .execute(
                "const cv = document.querySelector(\"#panels .chart[data-measure='guess'] canvas\");
                 const x = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
                 const near = (i, r, g, b) => Math.abs(x[i] - r) + Math.abs(x[i + 1] - g) + Math.abs(x[i + 2] - b) < 60;
                 let blue = 0, red = 0;
                 for (let i = 0; i < x.length; i += 4) {
                   if (x[i + 3] > 200 && near(i, 37, 99, 235)) blue++;
                   if (x[i + 3] > 200 && near(i, 220, 38, 38)) red++;
                 }
                 return [blue, red];",
                vec![],
            )
            .await
            .unwrap();
        let drawn: Vec<u64> = serde_json::from_value(drawn).unwrap();
        assert!(drawn.iter().all(|&n| n > 50), "each arm's pixels: {drawn:?}");
        c.execute(
            "document.getElementById('panels-section').scrollIntoView();",
            vec![],
        )
        .await
        .unwrap();
        let png = c.screenshot().await.unwrap();
        let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-measures.png");
        std::fs::write(&shot, &png).unwrap();
        eprintln!("screenshot: {}", shot.display());

        // The decisions table pages on past its first page, and filters by replicate.
        wait_for_element(c, "#decisions tbody tr.decision", Duration::from_secs(30)).await;
        let first_rows = |c: &Client| {
            let c = c.clone();
            async move {
                c.execute(
                    "return [...document.querySelectorAll('#decisions tbody tr.decision')].map(t => t.dataset.key).join(',');",
                    vec![],
                )
                .await
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
            }
        };
        let before = first_rows(c).await;
        c.find(Locator::Css("#dec-next")).await.unwrap().click().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = first_rows(c).await;
            if !now.is_empty() && now != before {
                break;
            }
            assert!(Instant::now() < deadline, "the next page never came: {before}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_for_element(c, "#f-replicate option[value='1']", Duration::from_secs(10)).await;

        // The config shows, and the records download.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let config = c
                .execute("return document.getElementById('config-text').textContent;", vec![])
                .await
                .unwrap();
            if config.as_str().unwrap().contains("name = \"resume-guess\"") {
                break;
            }
            assert!(Instant::now() < deadline, "no config shown: {config}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for record in ["aggregates.csv", "steps.csv", "state.parquet", "decisions.jsonl"] {
            wait_for_element(
                c,
                &format!("#downloads a[download][href$='/files/{record}']"),
                Duration::from_secs(10),
            )
            .await;
        }
        c.clone().close().await.unwrap();
    });
}
