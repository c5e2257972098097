//! What a streamed reply held to tools shows while it is generated. The model writes a call
//! as `{"name": "f", "arguments": {...}}` (inside its template's own syntax, or alone in the
//! text form) and an answer in words as words (in the text form `{"content": "..."}`); a
//! client sees neither markup: a call's name as soon as it is whole, then its arguments'
//! text as it comes (as OpenAI streams `tool_calls[].function.arguments`), and words as
//! words.
//!
//! Only text that cannot change is shown: a call's arguments up to their last character that
//! is not a closing brace or a space (the call's own `}` may follow), an answer's words up
//! to the last escape that reads whole, and nothing while the reply may still become either.
//! What the finished reply adds goes out when it ends, so the deltas of a choice join to
//! exactly its unstreamed message.

use super::call_text::{Scan, call_prefix};
use super::tools::{Form, ToolMode};

/// Whether `text`, which is not yet a whole [`call_prefix`] (nor, in the text form, an
/// answer in words), may still become one as more comes: too short to tell, or a call's or
/// an answer's opening cut short.
fn could_be_a_call(text: &str, tools: &[&str], key: &str, words_wrapped: bool) -> bool {
    // `None` where the text ends before a token can be read (undecided), `Some(false)` where
    // it reads otherwise.
    fn step(scan: &mut Scan, token: &str) -> Option<bool> {
        scan.skip_space();
        if token.starts_with(scan.0) {
            return None;
        }
        Some(scan.token(token).is_some())
    }
    fn steps(scan: &mut Scan, tokens: &[&str]) -> Option<bool> {
        for token in tokens {
            if !step(scan, token)? {
                return Some(false);
            }
        }
        Some(true)
    }
    let key = format!("\"{key}\"");
    let call = |scan: &mut Scan| -> Option<bool> {
        if !steps(scan, &["{", "\"name\"", ":"])? {
            return Some(false);
        }
        let name = scan.string()?;
        Some(tools.contains(&name.as_str()) && steps(scan, &[",", &key, ":"])?)
    };
    let words = |scan: &mut Scan| steps(scan, &["{", "\"content\"", ":", "\""]);
    call(&mut Scan(text)).unwrap_or(true)
        || (words_wrapped && words(&mut Scan(text)).unwrap_or(true))
}

/// What one choice has shown of its reply so far.
#[derive(Debug, Default)]
pub(crate) struct Shown {
    /// The reply's text so far.
    text: String,
    form: Shape,
}

#[derive(Debug, Default, Clone, PartialEq)]
enum Shape {
    /// Too little text to tell a call from an answer.
    #[default]
    Undecided,
    /// A call, whose arguments begin at `start` of the text: `sent` bytes of them shown.
    Call { start: usize, sent: usize },
    /// An answer in words of the text form: `sent` bytes of its words shown.
    Words { sent: usize },
    /// An answer in the template's own syntax, which is its text: `sent` bytes shown.
    Text { sent: usize },
    /// Neither: shown whole when it ends.
    Whole,
}

/// A piece of a choice to send.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delta {
    /// A call of the tool `name` begins.
    Call(String),
    Arguments(String),
    Content(String),
}

impl Shown {
    /// What `more` text lets the client see of a reply held to `tools`.
    pub(crate) fn on_text(&mut self, more: &str, tools: &ToolMode) -> Vec<Delta> {
        self.text.push_str(more);
        let mut out = Vec::new();
        if self.form == Shape::Undecided {
            self.form = self.decide(tools, &mut out);
        }
        match &mut self.form {
            Shape::Call { start, sent } => {
                // To the end of the call's JSON where it is whole (its template's closing
                // may follow).
                let end = tools
                    .form
                    .call_body(&self.text)
                    .map_or(self.text.len(), |body| {
                        offset(&self.text, body) + body.len()
                    });
                let arguments = &self.text[*start..end];
                let stable = arguments
                    .trim_end_matches(['}', ' ', '\t', '\n', '\r'])
                    .len();
                if stable > *sent {
                    out.push(Delta::Arguments(arguments[*sent..stable].to_string()));
                    *sent = stable;
                }
            }
            Shape::Words { sent } => {
                let words = super::call_text::cut_words(&self.text).unwrap_or_default();
                if words.len() > *sent && words.is_char_boundary(*sent) {
                    out.push(Delta::Content(words[*sent..].to_string()));
                    *sent = words.len();
                }
            }
            Shape::Text { sent } => {
                if self.text.len() > *sent {
                    out.push(Delta::Content(self.text[*sent..].to_string()));
                    *sent = self.text.len();
                }
            }
            Shape::Undecided | Shape::Whole => {}
        }
        out
    }

    fn decide(&self, tools: &ToolMode, out: &mut Vec<Delta>) -> Shape {
        let form: &Form = &tools.form;
        let names = tools.names();
        let key = form.arguments_key();
        if form.undecided(&self.text) {
            return Shape::Undecided;
        }
        let Some(body) = form.call_body(&self.text) else {
            // Not a call: in the template's own syntax, words (or the response format's
            // value), shown as they come.
            return Shape::Text { sent: 0 };
        };
        if let Some((name, start)) = call_prefix(body, key) {
            if names.contains(&name.as_str()) {
                out.push(Delta::Call(name));
                return Shape::Call {
                    start: offset(&self.text, body) + start,
                    sent: 0,
                };
            }
            return Shape::Whole;
        }
        let wrapped = !tools.native();
        if wrapped && super::call_text::cut_words(&self.text).is_some() {
            return Shape::Words { sent: 0 };
        }
        if could_be_a_call(body, &names, key, wrapped) {
            Shape::Undecided
        } else {
            // An answer in the response format (or a reply past its first key that is none
            // of the forms): shown whole when it ends.
            Shape::Whole
        }
    }

    /// What is left to send once the reply ended as `call` (a call's name and arguments) or
    /// `content` (its words): the call's opening if it was never shown, and the rest of what
    /// was shown in part. A call cut short (neither) adds nothing to what it showed.
    pub(crate) fn on_end(&self, call: Option<(&str, &str)>, content: Option<&str>) -> Vec<Delta> {
        // What was shown is a prefix of the end: the form is the grammar's.
        let rest = |whole: &str, sent: usize| {
            debug_assert!(whole.is_char_boundary(sent) && sent <= whole.len());
            whole.get(sent..).unwrap_or_default().to_string()
        };
        match (call, &self.form) {
            (Some((_, arguments)), Shape::Call { sent, .. }) => {
                vec![Delta::Arguments(rest(arguments, *sent))]
            }
            (Some((name, arguments)), _) => vec![
                Delta::Call(name.to_string()),
                Delta::Arguments(arguments.to_string()),
            ],
            (None, Shape::Words { sent } | Shape::Text { sent }) => {
                content.map_or_else(Vec::new, |c| vec![Delta::Content(rest(c, *sent))])
            }
            (None, Shape::Call { .. }) => Vec::new(),
            (None, _) => content.map_or_else(Vec::new, |c| vec![Delta::Content(c.to_string())]),
        }
    }
}

/// Where `part`, a slice of `whole`, begins in it.
fn offset(whole: &str, part: &str) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::call_text::raw_arguments;
    use crate::api::tools::{Choice, Function};
    use crate::engine::ToolSyntax;

    fn show(pieces: &[&str], tools: &[&str]) -> (Shown, Vec<Delta>) {
        show_in(pieces, tools, Form::text())
    }

    fn show_in(pieces: &[&str], tools: &[&str], form: Form) -> (Shown, Vec<Delta>) {
        let mode = ToolMode {
            choice: Choice::Auto {
                tools: tools
                    .iter()
                    .map(|name| Function {
                        name: name.to_string(),
                        description: None,
                        parameters: None,
                        strict: None,
                    })
                    .collect(),
                wrapped: true,
            },
            form,
        };
        let mut shown = Shown::default();
        let deltas = pieces
            .iter()
            .flat_map(|p| shown.on_text(p, &mode))
            .collect();
        (shown, deltas)
    }

    #[test]
    fn a_calls_arguments_stream_as_they_come_and_join_to_the_whole() {
        let pieces = [
            "{\"na",
            "me\": \"note",
            "\", \"arguments\"",
            ": {\"text\"",
            ": \"hi\"",
            "}",
            "}",
        ];
        let (shown, deltas) = show(&pieces, &["note"]);
        assert_eq!(deltas[0], Delta::Call("note".into()), "{deltas:?}");
        let text: String = pieces.concat();
        let arguments = raw_arguments(&text, "arguments").unwrap();
        assert_eq!(arguments, "{\"text\": \"hi\"}");
        let mut joined: String = deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Arguments(a) => Some(a.as_str()),
                _ => None,
            })
            .collect();
        assert!(
            deltas.len() > 2,
            "arguments in more than one piece: {deltas:?}"
        );
        for d in shown.on_end(Some(("note", arguments)), None) {
            if let Delta::Arguments(a) = d {
                joined.push_str(&a);
            }
        }
        assert_eq!(joined, arguments);
    }

    #[test]
    fn words_stream_as_words_and_other_answers_whole() {
        let (shown, deltas) = show(&["{\"content\": \"Hel", "lo\\n", "wor", "ld\"}"], &["x"]);
        let words: String = deltas
            .iter()
            .map(|d| match d {
                Delta::Content(c) => c.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(words, "Hello\nworld");
        assert_eq!(
            shown.on_end(None, Some("Hello\nworld")),
            vec![Delta::Content(String::new())]
        );
        // A response format's object, or a "name" that is no tool's: whole at the end.
        let (shown, deltas) = show(&["{\"price\": 3", "}"], &["x"]);
        assert!(deltas.is_empty());
        assert_eq!(
            shown.on_end(None, Some("{\"price\": 3}")),
            vec![Delta::Content("{\"price\": 3}".into())]
        );
        let (_, deltas) = show(&["{\"name\": \"Ann\", \"arguments\": {}}"], &["x"]);
        assert!(deltas.is_empty());
        // A call cut short shows what it had, and nothing more.
        let (shown, _) = show(&["{\"name\": \"x\", \"arguments\": {\"a\": 1"], &["x"]);
        assert!(shown.on_end(None, None).is_empty());
    }

    #[test]
    fn a_call_never_shown_is_sent_whole_at_its_end() {
        let shown = Shown::default();
        assert_eq!(
            shown.on_end(Some(("f", "{}")), None),
            vec![Delta::Call("f".into()), Delta::Arguments("{}".into())]
        );
    }

    fn joined(deltas: &[Delta]) -> (String, String) {
        let mut arguments = String::new();
        let mut content = String::new();
        for d in deltas {
            match d {
                Delta::Arguments(a) => arguments.push_str(a),
                Delta::Content(c) => content.push_str(c),
                Delta::Call(_) => {}
            }
        }
        (arguments, content)
    }

    // Issue 39 A8: in a template's own syntax the markup around a call is the template's,
    // never a client's: not in the arguments, not as content.
    #[test]
    fn a_call_in_the_templates_own_syntax_streams_its_arguments_without_the_markup() {
        for (syntax, pieces) in [
            (
                ToolSyntax::Hermes,
                vec![
                    "<tool",
                    "_call>\n{\"name\": \"note\", \"arguments\": {\"t\"",
                    ": 1}",
                    "}\n</tool_call>",
                ],
            ),
            (
                ToolSyntax::Mistral,
                vec![
                    "[TOOL_CALLS] [{\"name\": \"note\", ",
                    "\"arguments\": {\"t\": 1}",
                    "}]",
                ],
            ),
            (
                ToolSyntax::LlamaJson,
                vec!["{\"name\": \"no", "te\", \"parameters\": {\"t\": 1}", "}"],
            ),
        ] {
            let (shown, deltas) = show_in(&pieces, &["note"], Form::spelled(syntax));
            assert_eq!(
                deltas[0],
                Delta::Call("note".into()),
                "{syntax:?}: {deltas:?}"
            );
            let (mut arguments, content) = joined(&deltas);
            assert_eq!(content, "", "{syntax:?}");
            arguments.push_str(&joined(&shown.on_end(Some(("note", "{\"t\": 1}")), None)).0);
            assert_eq!(arguments, "{\"t\": 1}", "{syntax:?}: {deltas:?}");
        }
    }

    #[test]
    fn words_in_the_templates_own_syntax_stream_as_they_are_once_they_cannot_be_a_call() {
        let (shown, deltas) = show_in(
            &["<to", "ols are ", "fun"],
            &["note"],
            Form::spelled(ToolSyntax::Hermes),
        );
        assert_eq!(joined(&deltas).1, "<tools are fun");
        assert!(
            shown
                .on_end(None, Some("<tools are fun"))
                .iter()
                .all(|d| d == &Delta::Content(String::new()))
        );
        // Llama's calls begin with `{`: words are all else.
        let (_, deltas) = show_in(
            &["Sure", ", done."],
            &["note"],
            Form::spelled(ToolSyntax::LlamaJson),
        );
        assert_eq!(joined(&deltas).1, "Sure, done.");
        // Held while the reply may still open a call.
        let (_, deltas) = show_in(&["<tool_c"], &["note"], Form::spelled(ToolSyntax::Hermes));
        assert!(deltas.is_empty(), "{deltas:?}");
    }
}
