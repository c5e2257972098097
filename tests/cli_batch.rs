//! `throng generate` as a batch tool, and the command line's manners with pipes and full
//! disks, through the built binary on a tiny random model.

mod common;

use common::TinyLlama;
use common::cli::throng;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

fn tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama::default().write(dir.path()).unwrap();
    dir
}

fn requests(dir: &Path, lines: &[&str]) -> PathBuf {
    let path = dir.join("requests.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

// One malformed line refused the whole file; a `wizard` message was accepted silently.
#[test]
fn bad_lines_become_error_lines_in_place_and_the_rest_are_answered() {
    let model = tiny();
    let path = requests(
        model.path(),
        &[
            r#"{"prompt": "one", "max_tokens": 3, "tag": "a"}"#,
            r#"{"prompt": "two", "max_tokens": 3, "tag": "b""#,
            r#"{"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 3, "tag": "c"}"#,
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "tag": "d"}"#,
            r#"{"prompt": "x", "unknown_field": 1, "tag": "e"}"#,
            r#"{"prompt": "five", "max_tokens": 3}"#,
        ],
    );
    let out = throng()
        .args(["generate", "--model"])
        .arg(model.path())
        .arg("--requests")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "some requests failed: {stderr}");
    assert!(stderr.contains("3 of 6 requests failed"), "{stderr}");
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 6, "one line per request, in order");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i, "{line}");
    }
    let ok = |i: usize| lines[i].get("error").is_none();
    assert!(ok(0) && ok(3) && ok(5), "{lines:?}");
    assert_eq!(lines[0]["tag"], "a");
    let err = |i: usize| lines[i]["error"].as_str().unwrap_or_default().to_string();
    assert!(err(1).contains("line 2"), "{}", err(1));
    assert_eq!(
        lines[1]["tag"],
        serde_json::Value::Null,
        "an unparsable line has no tag"
    );
    assert!(err(2).contains("wizard"), "{}", err(2));
    assert!(
        err(2).contains("system") && err(2).contains("assistant"),
        "the known roles are named: {}",
        err(2)
    );
    assert_eq!(lines[2]["tag"], "c");
    assert!(err(4).contains("unknown_field"), "{}", err(4));
    assert_eq!(lines[4]["tag"], "e");
}

// Guards against issue 30, item 21: a request the engine refused (an unknown chat role) was
// reported without the line it came from, unlike one that did not parse.
#[test]
fn a_request_the_engine_refuses_names_its_line() {
    let model = tiny();
    let path = requests(
        model.path(),
        &[
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#,
            "",
            r#"{"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}"#,
        ],
    );
    let out = throng()
        .args(["generate", "--model"])
        .arg(model.path())
        .arg("--requests")
        .arg(&path)
        .output()
        .unwrap();
    let lines = json_lines(&out.stdout);
    let error = lines[1]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&format!("{} line 3: ", path.display())) && error.contains("wizard"),
        "{error}"
    );
}

// 100,000 requests showed nothing for an hour and a kill lost all of it: the first lines must
// come out (and be flushed) while later ones are still being generated.
#[test]
fn responses_are_written_as_they_finish_not_at_the_end() {
    let model = tiny();
    let mut child = throng()
        .args(["generate", "--model"])
        .arg(model.path())
        .args(["--prompt", "count", "--n", "100000", "--max-tokens", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    let line: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(line["index"], 0);
    // Still running: the first line did not wait for the batch.
    assert!(
        child.try_wait().unwrap().is_none(),
        "all 100,000 finished first"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

// `--unordered` writes in completion order, each line naming its request.
#[test]
fn unordered_output_carries_every_index_once() {
    let model = tiny();
    let lines: Vec<String> = (0..40)
        .map(|i| {
            format!(
                r#"{{"prompt": "p{i}", "max_tokens": {}, "tag": "t{i}"}}"#,
                1 + i % 7
            )
        })
        .collect();
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let path = requests(model.path(), &refs);
    let out = throng()
        .args(["generate", "--unordered", "--model"])
        .arg(model.path())
        .arg("--requests")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen: Vec<(u64, String)> = json_lines(&out.stdout)
        .iter()
        .map(|l| {
            (
                l["index"].as_u64().unwrap(),
                l["tag"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let want: Vec<(u64, String)> = (0..40).map(|i| (i, format!("t{i}"))).collect();
    assert_eq!(seen, want);
}

// `throng models | head -1` panicked (exit 101) when `head` closed the pipe.
#[test]
fn a_closed_pipe_ends_quietly_with_success() {
    for args in [&["models"][..], &["--help"]] {
        let mut child = throng()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before a byte is read.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
    }
    // And a generate whose reader stops after one line.
    let model = tiny();
    let mut child = throng()
        .args(["generate", "--model"])
        .arg(model.path())
        .args(["--prompt", "x", "--n", "2000", "--max-tokens", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?} {stderr}", out.status);
}

// Output to a full disk panicked; it must be a clear error, and a run's records stay whole.
#[test]
fn a_full_disk_for_stdout_is_a_clear_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("no /dev/full here; nothing to test");
        return;
    };
    let out = throng().arg("models").stdout(full).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");

    // A run whose final lines cannot be printed still finishes its records.
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = throng()
        .args(["run", "tests/fixtures/energy-resume.toml", "--out"])
        .arg(&run)
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"finished\""), "{manifest}");
    assert!(run.join("state.parquet").exists() && run.join("report.html").exists());
    let _ = std::io::stdout().flush();
}

// Guards against issue 17, item 16: one line of invalid UTF-8 in a `--requests` file aborted
// the whole batch (exit 1, no line number, no responses), where a bad line must become an
// error line in its place while the others are answered.
#[test]
fn lines_that_are_not_utf8_become_error_lines_and_the_rest_are_answered() {
    let model = tiny();
    let lines: Vec<&[u8]> = vec![
        br#"{"prompt": "one", "max_tokens": 3, "tag": "a"}"#,
        // Latin-1 text: valid JSON around one byte that is not UTF-8; its tag still reads.
        b"{\"prompt\": \"caf\xe9\", \"max_tokens\": 3, \"tag\": \"latin\"}",
        br#"{"prompt": "three", "max_tokens": 3}"#,
        // Bytes that are nothing at all.
        b"\xff\xfe\x00\x01garbage",
        // A line ending in CRLF, as Windows editors write.
        b"{\"prompt\": \"five\", \"max_tokens\": 3, \"tag\": \"crlf\"}\r",
        b"",
        // A UTF-8 sequence cut short.
        b"{\"prompt\": \"\xe2\x82\", \"max_tokens\": 3}",
        br#"{"prompt": "seven", "max_tokens": 3, "tag": "g"}"#,
        // The last line, without a newline after it.
        b"{\"prompt\": \"\xc0\xafend\"}",
    ];
    let path = model.path().join("requests.jsonl");
    std::fs::write(&path, lines.join(&b"\n"[..])).unwrap();
    for unordered in [false, true] {
        let mut cmd = throng();
        cmd.args(["generate", "--model"])
            .arg(model.path())
            .arg("--requests")
            .arg(&path);
        if unordered {
            cmd.arg("--unordered");
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!out.status.success(), "some requests failed: {stderr}");
        assert!(stderr.contains("4 of 8 requests failed"), "{stderr}");
        let mut lines = json_lines(&out.stdout);
        assert_eq!(
            lines.len(),
            8,
            "one line per request (the blank line is none)"
        );
        lines.sort_by_key(|l| l["index"].as_u64());
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(line["index"], i, "{line}");
        }
        let err = |i: usize| lines[i]["error"].as_str().unwrap_or_default().to_string();
        // Requests 1, 3, 5 and 7 are lines 2, 4, 7 and 9 of the file.
        for (i, line, byte) in [
            (1, 2, "0xe9"),
            (3, 4, "0xff"),
            (5, 7, "0xe2"),
            (7, 9, "0xc0"),
        ] {
            let e = err(i);
            assert!(
                e.contains(&format!("{} line {line}:", path.display())),
                "request {i} names its line {line}: {e}"
            );
            assert!(
                e.contains("not valid UTF-8") && e.contains(byte),
                "request {i}: {e}"
            );
        }
        assert_eq!(lines[1]["tag"], "latin", "the bad line's tag is kept");
        for i in [0, 2, 4, 6] {
            assert!(
                lines[i].get("error").is_none(),
                "request {i} answered: {}",
                lines[i]
            );
        }
        assert_eq!(lines[4]["tag"], "crlf");
        assert_eq!(lines[6]["tag"], "g");
    }
}

/// A response line from `lines` within a minute, or the test fails (a coprocess that waits
/// for more input before answering would otherwise hang it).
fn next_line(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> serde_json::Value {
    let line = lines
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("no response line for {what}: {e}"));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// `throng generate --requests -` on `model`, its three streams piped.
fn generate_from_stdin(model: &std::path::Path) -> std::process::Child {
    throng()
        .args(["generate", "--model"])
        .arg(model)
        .args(["--requests", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

// A multi-step conversation needs one process (its prefix cache) across steps: `--requests -`
// answers each request as it arrives while stdin stays open, and an error line comes out
// without waiting for the next request either.
#[test]
fn stdin_requests_are_answered_as_they_arrive_as_a_coprocess() {
    let model = tiny();
    let mut child = generate_from_stdin(model.path());
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in stdout.lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
        text
    });
    let mut stdin = child.stdin.take().unwrap();
    // Long enough for whole KV blocks (the byte tokenizer makes a token of each byte).
    let rules = "You are an agent in a simulated market; answer briefly. ".repeat(2);
    let requests = [
        format!(r#"{{"prompt": "{rules} Step 1.", "max_tokens": 4, "tag": "a"}}"#),
        r#"{"prompt": "broken", "#.to_string(),
        format!(r#"{{"prompt": "{rules} Step 2.", "max_tokens": 4, "tag": "c"}}"#),
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tag": "d"}"#
            .to_string(),
    ];
    let mut answered = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        writeln!(stdin, "{request}").unwrap();
        stdin.flush().unwrap();
        let line = next_line(&lines, &format!("request {i}, stdin still open"));
        assert_eq!(line["index"], i, "{line}");
        answered.push(line);
    }
    assert!(answered[0].get("error").is_none(), "{}", answered[0]);
    assert_eq!(answered[0]["tag"], "a");
    let error = answered[1]["error"].as_str().unwrap_or_default();
    assert!(error.contains("stdin line 2"), "{error}");
    assert_eq!(answered[2]["tag"], "c");
    assert!(
        answered[2]["cached_tokens"].as_u64().unwrap() > 0,
        "the second step finds the first one's prefix in the cache: {}",
        answered[2]
    );
    assert_eq!(answered[3]["tag"], "d");
    drop(stdin);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert!(lines.try_recv().is_err(), "one line per request");
    let stderr = errors.join().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!status.success(), "a request failed: {stderr}");
    assert!(stderr.contains("1 of 4 requests failed"), "{stderr}");
}

// The end of stdin ends the run once every request read is answered, each line written; an
// empty stdin is a run of nothing, not an error.
#[test]
fn stdin_eof_ends_the_run_with_every_response_written() {
    let model = tiny();
    let mut child = generate_from_stdin(model.path());
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..6 {
        writeln!(
            stdin,
            r#"{{"prompt": "p{i}", "max_tokens": {}, "tag": "t{i}"}}"#,
            1 + 3 * (i % 3)
        )
        .unwrap();
    }
    stdin.write_all(b"{\"prompt\": \"caf\xe9\"}\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("1 of 7 requests failed"), "{stderr}");
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len(), 7, "one line per request: {lines:?}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i, "{line}");
    }
    for (i, line) in lines.iter().take(6).enumerate() {
        assert!(line.get("error").is_none(), "{line}");
        assert_eq!(line["tag"], format!("t{i}"));
    }
    let error = lines[6]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("stdin line 7") && error.contains("not valid UTF-8"),
        "{error}"
    );

    let out = throng()
        .args(["generate", "--model"])
        .arg(model.path())
        .args(["--requests", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("0 requests"), "{stderr}");
}
