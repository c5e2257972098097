//! The pages, their script and style, and the vendored chart library (uPlot, MIT, from the
//! npm registry; its licence beside it), compiled into the binary: `throng serve` needs no
//! network and no files beside the binary.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(rust_embed::RustEmbed)]
#[folder = "src/serve/assets/"]
struct Assets;

/// The content type of a file by its extension.
pub(crate) fn mime(name: &str) -> &'static str {
    match name.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "json" => "application/json",
        "csv" => "text/csv; charset=utf-8",
        "jsonl" => "application/jsonl",
        "parquet" => "application/vnd.apache.parquet",
        _ => "text/plain; charset=utf-8",
    }
}

/// An embedded file (looked up by name in the binary, never on disk).
pub fn file(name: &str) -> Response {
    match Assets::get(name) {
        Some(f) => {
            let mut r = Response::new(Body::from(f.data.into_owned()));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(mime(name)));
            r
        }
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

/// The policy of the server's own pages: their scripts and styles come from the binary, and
/// they talk to this server alone.
pub(crate) const POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self' \
                          'unsafe-inline'; object-src 'none'; base-uri 'none'; \
                          form-action 'none'; frame-ancestors 'none'";

/// A page: like [`file`], under [`POLICY`], and never cached, so that a new binary's page is
/// the one shown.
pub fn page(name: &str) -> Response {
    let mut r = file(name);
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    r
}
