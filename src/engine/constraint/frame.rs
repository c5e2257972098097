//! A JSON value written inside text of its own: a call of a tool in the syntax a model was
//! trained on (`<tool_call>\n{...}\n</tool_call>`, `[TOOL_CALLS] [{...}]`), and what else the
//! reply may be instead of the call (words, another JSON value, nothing). Compiled as a Lark
//! grammar around the schema's JSON (llguidance's `%json`).
//!
//! A reply is the framed value exactly when its text, spaces at its start aside, begins with
//! the frame's [`lead`](Frame::lead): the opening's text and the value's `{`. Words are held
//! to begin otherwise, so a reply's text alone says which it is, while it is generated too.

use serde::Serialize;
use serde_json::Value;

/// A piece of a frame's opening or closing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Mark {
    /// Text, generated as whatever tokens spell it.
    Text(String),
    /// One control token of the vocabulary (Mistral's `[TOOL_CALLS]`), which a decoded reply
    /// leaves out.
    Token(u32),
}

/// What a framed reply may be instead of its framed value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Otherwise {
    /// Only the framed value.
    Nothing,
    /// Words: any text that does not begin as the framed value does.
    Words,
    /// A JSON value satisfying this schema (a response format beside the tools).
    Json(Value),
}

/// The text around a schema's value in a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub open: Vec<Mark>,
    pub close: Vec<Mark>,
    pub otherwise: Otherwise,
}

/// Why a finished constrained reply has no value.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    #[error("its JSON does not parse: {0}")]
    Json(#[source] serde_json::Error),
    #[error("it is neither its framed value nor what else it may be")]
    NotFramed,
}

/// What a reply's text is, so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split<'t> {
    /// Too short to tell.
    Undecided,
    /// The framed value: its JSON text from its `{`, to its end where it is whole (the
    /// closing left out) or to the end of the text so far.
    Framed(&'t str),
    /// The other thing it may be.
    Other,
}

impl Frame {
    /// The text a framed reply begins with, spaces at its start aside.
    pub fn lead(&self) -> String {
        let mut lead: String = self
            .open
            .iter()
            .filter_map(|m| match m {
                Mark::Text(t) => Some(t.as_str()),
                Mark::Token(_) => None,
            })
            .collect();
        lead.push('{');
        lead.trim_start().to_string()
    }

    /// What `text` is (see [`Split`]).
    pub fn split<'t>(&self, text: &'t str) -> Split<'t> {
        let trimmed = text.trim_start();
        let lead = self.lead();
        if let Some(rest) = trimmed.strip_prefix(lead.as_str()) {
            // From the value's `{`, which ends the lead.
            let body = &trimmed[trimmed.len() - rest.len() - 1..];
            return Split::Framed(&body[..json_end(body).unwrap_or(body.len())]);
        }
        if lead.starts_with(trimmed) {
            Split::Undecided
        } else {
            Split::Other
        }
    }

    /// The value of a whole reply: the framed value, or the other JSON value; `None` for
    /// words.
    pub fn value_of(&self, text: &str) -> Result<Option<Value>, ReplyError> {
        match (self.split(text), &self.otherwise) {
            (Split::Framed(body), _) => serde_json::from_str(body)
                .map(Some)
                .map_err(ReplyError::Json),
            (_, Otherwise::Words) => Ok(None),
            (Split::Other, Otherwise::Json(_)) => serde_json::from_str(text)
                .map(Some)
                .map_err(ReplyError::Json),
            _ => Err(ReplyError::NotFramed),
        }
    }

    /// The grammar of a reply: the frame around `%json` of `schema`, or the other thing.
    ///
    /// llguidance's lexer is greedy and does not go back: where words and the opening could
    /// both still be read, it goes on reading words, and a call could not follow. So the
    /// opening's text is one lexeme, and words are held to end (fail) exactly where it ends:
    /// they may not begin with it (spaces before it or not), nor, where the frame has no
    /// opening text, with the value's `{`. An opening that begins with a control token
    /// parts from words at once (words never hold one).
    pub(crate) fn lark(&self, schema: &Value) -> String {
        let marks = |marks: &[Mark]| -> String {
            let mut items = Vec::new();
            let mut text = String::new();
            for m in marks {
                match m {
                    Mark::Text(t) => text.push_str(t),
                    Mark::Token(id) => {
                        if !text.is_empty() {
                            items.push(quoted(&std::mem::take(&mut text)));
                        }
                        items.push(format!("<[{id}]>"));
                    }
                }
            }
            if !text.is_empty() {
                items.push(quoted(&text));
            }
            items.join(" ")
        };
        let call = format!(
            "framed: {} %json {} {}\n",
            marks(&self.open),
            schema,
            marks(&self.close)
        );
        let other = match &self.otherwise {
            Otherwise::Nothing => return format!("start: framed\n{call}"),
            Otherwise::Words => {
                let opening: String = self
                    .open
                    .iter()
                    .map_while(|m| match m {
                        Mark::Text(t) => Some(t.as_str()),
                        Mark::Token(_) => None,
                    })
                    .collect();
                let not_before = match self.open.first() {
                    Some(Mark::Token(_)) => self.lead(),
                    _ if opening.trim_start().is_empty() => "{".to_string(),
                    _ => opening.trim_start().to_string(),
                };
                format!(
                    "other: WORDS\nWORDS: /(?s:.*)/ & ~/[ \\t\\r\\n]*{}(?s:.*)/\n",
                    regex_escape(&not_before)
                )
            }
            Otherwise::Json(other) => format!("other: %json {other}\n"),
        };
        format!("start: framed | other\n{call}{other}")
    }
}

/// `text` as a Lark string literal.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("invariant: a string serialises")
}

/// `text` as a regex (inside Lark's `/.../`) that matches it literally.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '/' => out.push_str("\\/"),
            c if "\\.+*?()|[]{}^$#&-~".contains(c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Where the JSON object or array `text` begins with ends (just past its closing bracket),
/// if it is whole.
pub fn json_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hermes(otherwise: Otherwise) -> Frame {
        Frame {
            open: vec![Mark::Text("<tool_call>".into()), Mark::Text("\n".into())],
            close: vec![Mark::Text("\n".into()), Mark::Text("</tool_call>".into())],
            otherwise,
        }
    }

    #[test]
    fn a_reply_is_the_framed_value_exactly_when_it_begins_with_the_lead() {
        let frame = hermes(Otherwise::Words);
        assert_eq!(frame.lead(), "<tool_call>\n{");
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"}\"}}\n</tool_call>";
        assert_eq!(
            frame.split(call),
            Split::Framed("{\"name\": \"f\", \"arguments\": {\"a\": \"}\"}}")
        );
        assert_eq!(
            frame.value_of(call).unwrap().unwrap()["arguments"]["a"],
            "}"
        );
        assert_eq!(frame.split("<tool_"), Split::Undecided);
        assert_eq!(frame.split(""), Split::Undecided);
        assert_eq!(frame.split("<tool_call>x"), Split::Other);
        assert_eq!(frame.split("Hello"), Split::Other);
        assert_eq!(frame.value_of("Hello").unwrap(), None);
        // Cut short: the value so far.
        assert_eq!(
            frame.split("<tool_call>\n{\"name\": \"f\", \"argu"),
            Split::Framed("{\"name\": \"f\", \"argu")
        );
        let mistral = Frame {
            open: vec![Mark::Token(5), Mark::Text(" [".into())],
            close: vec![Mark::Text("]".into())],
            otherwise: Otherwise::Nothing,
        };
        assert_eq!(mistral.lead(), "[{");
        assert_eq!(
            mistral.value_of("[{\"name\": \"f\"}]").unwrap().unwrap()["name"],
            "f"
        );
        assert!(mistral.value_of("words").is_err());
    }

    #[test]
    fn the_words_beside_a_call_may_not_begin_as_one() {
        let lark = hermes(Otherwise::Words).lark(&serde_json::json!({"type": "object"}));
        assert!(
            lark.contains(r"~/[ \t\r\n]*<tool_call>\n(?s:.*)/"),
            "{lark}"
        );
        assert!(lark.contains(r#"framed: "<tool_call>\n" %json"#), "{lark}");
        assert!(lark.starts_with("start: framed | other\n"), "{lark}");
    }
}
