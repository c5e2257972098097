//! What a streamed reply held to tools shows while it is generated. The model writes a call
//! as `{"name": "f", "arguments": {...}}` and an answer in words as `{"content": "..."}`; a
//! client sees neither: a call's name as soon as it is whole, then its arguments' text as it
//! comes (as OpenAI streams `tool_calls[].function.arguments`), and words as words.
//!
//! Only text that cannot change is shown: a call's arguments up to their last character that
//! is not a closing brace or a space (the call's own `}` may follow), an answer's words up
//! to the last escape that reads whole. What the finished reply adds goes out when it ends,
//! so the deltas of a choice join to exactly its unstreamed message.

use super::call_text::{Scan, call_prefix};

/// Whether `text`, which is not yet a whole [`call_prefix`] nor an answer in words, may still
/// become either as more comes: too short to tell, or a call's or an answer's opening cut
/// short.
fn could_be_a_call(text: &str, tools: &[&str]) -> bool {
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
    let call = |scan: &mut Scan| -> Option<bool> {
        if !steps(scan, &["{", "\"name\"", ":"])? {
            return Some(false);
        }
        let name = scan.string()?;
        Some(tools.contains(&name.as_str()) && steps(scan, &[",", "\"arguments\"", ":"])?)
    };
    let words = |scan: &mut Scan| steps(scan, &["{", "\"content\"", ":", "\""]);
    call(&mut Scan(text)).unwrap_or(true) || words(&mut Scan(text)).unwrap_or(true)
}

/// What one choice has shown of its reply so far.
#[derive(Debug, Default)]
pub(crate) struct Shown {
    /// The reply's text so far.
    text: String,
    form: Form,
}

#[derive(Debug, Default, Clone, PartialEq)]
enum Form {
    /// Too little text to tell a call from an answer.
    #[default]
    Undecided,
    /// A call, whose arguments begin at `start` of the text: `sent` bytes of them shown.
    Call { start: usize, sent: usize },
    /// An answer in words: `sent` bytes of its words shown.
    Words { sent: usize },
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
    /// What `more` text lets the client see, given the names of the tools it may call.
    pub(crate) fn on_text(&mut self, more: &str, tools: &[&str]) -> Vec<Delta> {
        self.text.push_str(more);
        let mut out = Vec::new();
        if self.form == Form::Undecided {
            self.form = self.decide(tools, &mut out);
        }
        match &mut self.form {
            Form::Call { start, sent } => {
                let arguments = &self.text[*start..];
                let stable = arguments
                    .trim_end_matches(['}', ' ', '\t', '\n', '\r'])
                    .len();
                if stable > *sent {
                    out.push(Delta::Arguments(arguments[*sent..stable].to_string()));
                    *sent = stable;
                }
            }
            Form::Words { sent } => {
                let words = super::call_text::cut_words(&self.text).unwrap_or_default();
                if words.len() > *sent && words.is_char_boundary(*sent) {
                    out.push(Delta::Content(words[*sent..].to_string()));
                    *sent = words.len();
                }
            }
            Form::Undecided | Form::Whole => {}
        }
        out
    }

    fn decide(&self, tools: &[&str], out: &mut Vec<Delta>) -> Form {
        if let Some((name, start)) = call_prefix(&self.text) {
            if tools.contains(&name.as_str()) {
                out.push(Delta::Call(name));
                return Form::Call { start, sent: 0 };
            }
            return Form::Whole;
        }
        if super::call_text::cut_words(&self.text).is_some() {
            return Form::Words { sent: 0 };
        }
        if could_be_a_call(&self.text, tools) {
            Form::Undecided
        } else {
            // An answer in the response format (or a reply past its first key that is none
            // of the forms): shown whole when it ends.
            Form::Whole
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
            (Some((_, arguments)), Form::Call { sent, .. }) => {
                vec![Delta::Arguments(rest(arguments, *sent))]
            }
            (Some((name, arguments)), _) => vec![
                Delta::Call(name.to_string()),
                Delta::Arguments(arguments.to_string()),
            ],
            (None, Form::Words { sent }) => {
                content.map_or_else(Vec::new, |c| vec![Delta::Content(rest(c, *sent))])
            }
            (None, Form::Call { .. }) => Vec::new(),
            (None, _) => content.map_or_else(Vec::new, |c| vec![Delta::Content(c.to_string())]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::call_text::raw_arguments;

    fn show(pieces: &[&str], tools: &[&str]) -> (Shown, Vec<Delta>) {
        let mut shown = Shown::default();
        let deltas = pieces
            .iter()
            .flat_map(|p| shown.on_text(p, tools))
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
        let arguments = raw_arguments(&text).unwrap();
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
}
