//! Reading the text the model writes under tools: a call is `{"name": "f", "arguments":
//! {...}}` (its arguments under `parameters` in Llama's syntax), an answer in words of the
//! text form `{"content": "..."}`. What a finished reply's call or words are, and how far a
//! reply cut short or still being written goes.

/// Where a call's arguments begin in `text`, and its name, once both are whole: the text is
/// `{"name": "<name>", "<key>": ` so far (spacing as the model wrote it). `None` while it is
/// too short to tell or is not a call.
pub(super) fn call_prefix(text: &str, key: &str) -> Option<(String, usize)> {
    let mut rest = Scan(text);
    rest.token("{")?;
    rest.token("\"name\"")?;
    rest.token(":")?;
    let name = rest.string()?;
    rest.token(",")?;
    rest.token(&format!("\"{key}\""))?;
    rest.token(":")?;
    rest.skip_space();
    Some((name, text.len() - rest.0.len()))
}

/// The arguments' own text in a finished call, as the model wrote them (`None` if `text` is
/// not a call written as [`call_prefix`] reads one).
pub(super) fn raw_arguments<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    let (_, start) = call_prefix(text, key)?;
    let end = text.trim_end().strip_suffix('}')?.trim_end().len();
    (end > start).then(|| &text[start..end])
}

/// The words of an answer `{"content": "...` cut before its end, as far as they go.
pub(super) fn cut_words(text: &str) -> Option<String> {
    let rest = text.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest.strip_prefix("\"content\"")?.trim_start();
    let rest = rest.strip_prefix(':')?.trim_start();
    let literal = rest.strip_prefix('"')?;
    // The string's body runs to its closing quote, or to the cut; a cut inside an escape
    // (`\`, `\u00`) leaves at most six bytes that do not read, dropped.
    let mut escaped = false;
    let close = literal
        .char_indices()
        .find(|&(_, c)| {
            let closes = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            closes
        })
        .map_or(literal.len(), |(i, _)| i);
    let body = &literal[..close];
    (0..=6.min(body.len()))
        .map(|drop| body.len() - drop)
        .filter(|&end| body.is_char_boundary(end))
        .find_map(|end| serde_json::from_str::<String>(&format!("\"{}\"", &body[..end])).ok())
        .or(Some(String::new()))
}

/// Text scanned from its front.
pub(super) struct Scan<'a>(pub(super) &'a str);

impl Scan<'_> {
    pub(super) fn skip_space(&mut self) {
        self.0 = self.0.trim_start_matches([' ', '\t', '\n', '\r']);
    }

    pub(super) fn token(&mut self, token: &str) -> Option<()> {
        self.skip_space();
        self.0 = self.0.strip_prefix(token)?;
        Some(())
    }

    /// A whole JSON string, decoded.
    pub(super) fn string(&mut self) -> Option<String> {
        self.skip_space();
        let body = self.0.strip_prefix('"')?;
        let mut escaped = false;
        let close = body.char_indices().find_map(|(i, c)| {
            let closes = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            closes.then_some(i)
        })?;
        let literal = &self.0[..close + 2];
        self.0 = &self.0[close + 2..];
        serde_json::from_str(literal).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::cut_words;

    #[test]
    fn a_cut_answer_in_words_keeps_its_words_and_a_cut_call_none() {
        assert_eq!(
            cut_words(r#"{"content": "Hello, wor"#).as_deref(),
            Some("Hello, wor")
        );
        assert_eq!(
            cut_words(r#"{"content":"a\"b\n"#).as_deref(),
            Some("a\"b\n")
        );
        // Cut inside an escape: the escape is left out.
        assert_eq!(cut_words(r#"{"content": "tab\"#).as_deref(), Some("tab"));
        assert_eq!(cut_words(r#"{"content": "x\u00e"#).as_deref(), Some("x"));
        assert_eq!(cut_words(r#"{"content": "é漢"#).as_deref(), Some("é漢"));
        assert_eq!(cut_words(r#"{"content": ""#).as_deref(), Some(""));
        // A call, or too little to tell: no content.
        assert_eq!(cut_words(r#"{"name": "note", "arguments"#), None);
        assert_eq!(cut_words(r#"{"con"#), None);
    }
}
