//! The pieces of every report page: escaping, tables, the page itself, and numbers with
//! their intervals in a readable form.

use super::stats::Summary;
use crate::record::{Manifest, Status};
use std::fmt::Write as _;

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An HTML table; cells are already escaped.
pub fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut out = String::from("<table><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

/// Figures as `<figure>`s of their SVGs.
pub fn figures(names: &[String]) -> String {
    let mut out = String::new();
    for f in names {
        let _ = write!(
            out,
            "<figure><img src=\"{f}.svg\" alt=\"{f}\"><figcaption>{f}</figcaption></figure>"
        );
    }
    out
}

/// A whole page around `body`.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>\
         body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}\
         img{{max-width:100%}}figure{{margin:2em 0}}.note{{background:#fff6d5;border:1px solid #e6c200;padding:.6em 1em}}\
         </style></head><body>{body}</body></html>",
        esc(title)
    )
}

/// `mean [low, high] (n=..)`, or `-`.
pub fn fmt(s: &Option<Summary>) -> String {
    match s {
        Some(s) => format!(
            "{:.2} [{:.2}, {:.2}] (n={})",
            s.mean, s.ci_low, s.ci_high, s.n
        ),
        None => "-".into(),
    }
}

/// Seconds in a readable unit: `1.39 ms`, `12.3 s`, with the interval.
pub fn fmt_seconds(s: &Option<Summary>) -> String {
    let Some(s) = s else { return "-".into() };
    let (scale, unit) = if s.mean.abs() < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    format!(
        "{:.3} [{:.3}, {:.3}] {unit} (n={})",
        s.mean * scale,
        s.ci_low * scale,
        s.ci_high * scale,
        s.n
    )
}

/// A line saying that the run is not finished (steps done out of those planned), or `None`
/// for a finished run: reports of unfinished runs say so first.
pub fn unfinished(m: &Manifest) -> Option<String> {
    (m.status != Status::Finished).then(|| {
        format!(
            "This run is not finished (status: {}): {} of {} steps done{}. Its numbers cover only the steps done; `throng run --resume` continues it.",
            m.status,
            m.steps_done,
            m.planned_steps(),
            m.error
                .as_deref()
                .map(|e| format!("; it stopped with: {e}"))
                .unwrap_or_default()
        )
    })
}

/// [`unfinished`] as the first element of a page.
pub fn unfinished_note(m: &Manifest) -> String {
    unfinished(m)
        .map(|t| format!("<p class=\"note\"><b>Unfinished run.</b> {}</p>", esc(&t)))
        .unwrap_or_default()
}
