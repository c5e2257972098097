//! The pieces of every report page: escaping, tables, the page itself, and numbers with
//! their intervals in a readable form.

use super::stats::{Nested, Summary};
use crate::record::{Manifest, Status};
use std::fmt::Write as _;

pub(crate) fn esc(s: &str) -> String {
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

/// `mean [low, high] (n=..)`; `mean (n=1, no interval)` for a sample too small for one;
/// or `-`.
pub fn fmt(s: &Option<Summary>) -> String {
    match s {
        Some(s) => match s.interval() {
            Some((lo, hi)) => format!("{:.2} [{lo:.2}, {hi:.2}] (n={})", s.mean, s.n),
            None => format!("{:.2} (n={}, no interval)", s.mean, s.n),
        },
        None => "-".into(),
    }
}

/// A nested quantity: the replicate-level mean and interval, then the agents' spread
/// (`12.30 [10.10, 14.50] (3 replicates; agents: sd 4.10, 2.00 to 20.00, n=40)`).
pub(crate) fn fmt_nested(x: &Nested) -> String {
    let Some(r) = x.replicates else {
        return "-".into();
    };
    let head = match r.interval() {
        Some((lo, hi)) => format!("{:.2} [{lo:.2}, {hi:.2}]", r.mean),
        None => format!("{:.2} (no interval)", r.mean),
    };
    let replicates = if r.n == 1 { "replicate" } else { "replicates" };
    match x.agents {
        Some(a) => format!(
            "{head} ({} {replicates}; agents: sd {:.2}, {:.2} to {:.2}, n={})",
            r.n, a.sd, a.min, a.max, a.n
        ),
        None => format!("{head} ({} {replicates})", r.n),
    }
}

/// Seconds in a readable unit: `1.39 ms`, `12.3 s`, with the interval when there is one.
pub(crate) fn fmt_seconds(s: &Option<Summary>) -> String {
    let Some(s) = s else { return "-".into() };
    let (scale, unit) = if s.mean.abs() < 1.0 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    match s.interval() {
        Some((lo, hi)) => format!(
            "{:.3} [{:.3}, {:.3}] {unit} (n={})",
            s.mean * scale,
            lo * scale,
            hi * scale,
            s.n
        ),
        None => format!("{:.3} {unit} (n={}, no interval)", s.mean * scale, s.n),
    }
}

/// A p-value as journals print it: `0.0312`, `< 0.0001`.
pub(crate) fn fmt_p(p: f64) -> String {
    if p < 1e-4 {
        "< 0.0001".into()
    } else {
        format!("{p:.4}")
    }
}

/// The run in one line, for the terminal: name, policy, model, decisions and fallbacks.
pub fn headline(m: &Manifest) -> String {
    format!(
        "{} ({} policy, model {}): {} decisions, {} fallbacks ({:.1}%)",
        m.name,
        m.policy,
        m.model.as_deref().unwrap_or("-"),
        m.counters.decisions,
        m.counters.fallbacks,
        100.0 * m.counters.fallbacks as f64 / m.counters.decisions.max(1) as f64,
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

/// A report's notes (see [`super::caveats`]), each a highlighted paragraph, for the top of
/// its page.
pub(crate) fn notes_html(notes: &[String]) -> String {
    notes
        .iter()
        .map(|n| format!("<p class=\"note\">{}</p>", esc(n)))
        .collect()
}

/// [`unfinished`] as the first element of a page.
pub(crate) fn unfinished_note(m: &Manifest) -> String {
    unfinished(m)
        .map(|t| format!("<p class=\"note\"><b>Unfinished run.</b> {}</p>", esc(&t)))
        .unwrap_or_default()
}
