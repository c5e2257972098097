//! The files of a run folder the server hands out: the report's (`report.html`, its figures,
//! `summary.json`, `means.csv`), shown in the browser, and the records, downloaded. A file is
//! served only when a listing of the folder names it, never by a path a client sent; it is
//! opened as a regular file inside the folder ([`open::regular`]); and it is served under a
//! Content-Security-Policy that runs no script, never sniffed, an SVG or a record only as an
//! attachment when opened. A run folder holds whatever its writer put there: none of its
//! files may become a page of this origin that runs a script with the page's token.

use crate::record::{AGGREGATES, CELLS, DECISIONS, GROUPS, PROMPTS, STATE_CSV, STATE_PARQUET};
use crate::record::{STEPS, open};
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The policy of every file of a run folder: no script, no plugin, no frame, no form; images
/// of this server and inline styles, as the report uses them.
pub(crate) const POLICY: &str = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; \
                          base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The records a run's page offers to download, when the folder has them.
const RECORDS: [&str; 7] = [
    STEPS,
    AGGREGATES,
    STATE_PARQUET,
    STATE_CSV,
    DECISIONS,
    PROMPTS,
    CELLS,
];

/// Bytes read from the disk at a time while a file is sent.
const CHUNK: usize = 256 << 10;

/// The report's files in `dir`: `report.html`, the figures it shows and the tables beside it,
/// regular files of the folder and of its `figures/` folder (never through a link).
pub(crate) fn report_files(dir: &Path) -> Vec<String> {
    let wanted = |name: &str| {
        name == "report.html"
            || name == "summary.json"
            || name == "means.csv"
            || name.ends_with(".svg")
            || name.ends_with(".png")
    };
    let mut files: Vec<String> = super::folders::listing(dir, "")
        .into_iter()
        .chain(
            super::folders::listing(dir, "figures")
                .into_iter()
                .map(|n| format!("figures/{n}")),
        )
        .filter(|n| wanted(n.rsplit('/').next().unwrap_or(n)))
        .collect();
    files.sort();
    files
}

/// The records of `dir` there are to download.
pub fn downloads(dir: &Path) -> Vec<String> {
    let groups = format!("{GROUPS}.parquet");
    let present = super::folders::listing(dir, "");
    RECORDS
        .iter()
        .copied()
        .chain([groups.as_str()])
        .filter(|r| present.iter().any(|p| p == r))
        .map(str::to_string)
        .collect()
}

/// The file `name` of `dir`, if a listing of the folder names it: shown when it is a report
/// file, an attachment when it is a record or a figure in SVG.
pub fn serve(dir: &Path, name: &str) -> Response {
    let record = downloads(dir).iter().any(|d| d == name);
    if !record && !report_files(dir).iter().any(|f| f == name) {
        return super::json_error::error(StatusCode::NOT_FOUND, "no such file in this run");
    }
    let file = match open::regular(dir, name) {
        Ok(f) => f,
        Err(e) => return super::json_error::error(StatusCode::NOT_FOUND, e),
    };
    // What the file holds now: a log still growing is sent up to here.
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return super::json_error::error(StatusCode::NOT_FOUND, e),
    };
    let mut r = Response::new(stream(file, len));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::assets::mime(name)),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // An SVG opened in a tab is a document that may run scripts; as an <img> it never does,
    // and an image ignores this header.
    if record || name.ends_with(".svg") {
        let base: String = name
            .rsplit('/')
            .next()
            .unwrap_or(name)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{base}\"")) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
    }
    r.into_response()
}

/// `len` bytes of `file`, read a chunk at a time off the async workers, so that a
/// multi-gigabyte log is sent without being held.
fn stream(file: File, len: u64) -> Body {
    let chunks = futures_util::stream::unfold(Some((file, len)), |state| async move {
        let (mut file, left) = state?;
        if left == 0 {
            return None;
        }
        let want = left.min(CHUNK as u64) as usize;
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; want];
            let n = file.read(&mut buf)?;
            buf.truncate(n);
            Ok::<_, std::io::Error>((file, buf))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match read {
            Ok((file, buf)) if !buf.is_empty() => {
                let n = buf.len() as u64;
                Some((Ok(Bytes::from(buf)), Some((file, left - n))))
            }
            Ok(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file shrank while it was sent",
                )),
                None,
            )),
            Err(e) => Some((Err(e), None)),
        }
    });
    Body::from_stream(chunks)
}
