//! The syntax a model was trained to call tools in, read from its chat template: where the
//! template writes an assistant's `tool_calls` in a form of its own, replies are held to that
//! form (see the API's tools), and calls and results in the history are the template's to
//! write. A template without one gets throng's text form: calls as JSON text in the messages.

use sha2::{Digest, Sha256};

/// How a chat template writes a call of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// None of its own: calls are `{"name": ..., "arguments": ...}` written as message text.
    Text,
    /// `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`: Qwen2.5, Hermes and the
    /// many templates that took theirs.
    Hermes,
    /// `{"name": ..., "parameters": ...}` as the whole reply: Llama 3.1, 3.2 and 3.3.
    LlamaJson,
    /// `[TOOL_CALLS] [{"name": ..., "arguments": ...}]`: Mistral v0.3 and later, Mixtral
    /// 8x22B.
    Mistral,
}

impl ToolSyntax {
    /// The syntax the template `source` writes an assistant's calls in.
    pub fn of_template(source: &str) -> Self {
        // Each family's own markers, as its template writes a call in the history.
        if source.contains("<tool_call>") && source.contains("tool_calls") {
            ToolSyntax::Hermes
        } else if source.contains("[TOOL_CALLS]") {
            ToolSyntax::Mistral
        } else if source.contains("tool_calls") && source.contains("\"parameters\": ") {
            ToolSyntax::LlamaJson
        } else {
            ToolSyntax::Text
        }
    }

    /// Whether the template has a syntax of its own.
    pub fn is_native(self) -> bool {
        self != ToolSyntax::Text
    }

    /// The name it goes by in the book and in messages.
    pub fn name(self) -> &'static str {
        match self {
            ToolSyntax::Text => "text",
            ToolSyntax::Hermes => "hermes",
            ToolSyntax::LlamaJson => "llama-json",
            ToolSyntax::Mistral => "mistral",
        }
    }

    /// What comes before a call's JSON object, piece by piece: a piece that is one control
    /// token of the model's vocabulary is generated as that token (and a decoded reply
    /// leaves it out).
    pub fn opening(self) -> &'static [&'static str] {
        match self {
            ToolSyntax::Hermes => &["<tool_call>", "\n"],
            ToolSyntax::Mistral => &["[TOOL_CALLS]", " ["],
            ToolSyntax::Text | ToolSyntax::LlamaJson => &[],
        }
    }

    /// What comes after a call's JSON object.
    pub fn closing(self) -> &'static [&'static str] {
        match self {
            ToolSyntax::Hermes => &["\n", "</tool_call>"],
            ToolSyntax::Mistral => &["]"],
            ToolSyntax::Text | ToolSyntax::LlamaJson => &[],
        }
    }

    /// The key of a call's arguments.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolSyntax::LlamaJson => "parameters",
            _ => "arguments",
        }
    }

    /// A call's id as the template takes it. Mistral's templates refuse any id but nine
    /// letters and digits (OpenAI's are `call_...`): another is mapped to nine of its own,
    /// the same for the same id, so that a call and the result that answers it still match.
    pub fn call_id(self, id: &str) -> String {
        let nine = id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric());
        if self != ToolSyntax::Mistral || nine {
            return id.to_string();
        }
        const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        Sha256::digest(id.as_bytes())
            .iter()
            .take(9)
            .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::ToolSyntax;

    fn template(name: &str) -> String {
        let path = format!(
            "{}/tests/data/chat_templates/templates/{name}.jinja",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn each_familys_template_is_read_as_its_own_syntax() {
        assert_eq!(
            ToolSyntax::of_template(&template("qwen2.5")),
            ToolSyntax::Hermes
        );
        assert_eq!(
            ToolSyntax::of_template(&template("llama-3.1")),
            ToolSyntax::LlamaJson
        );
        assert_eq!(
            ToolSyntax::of_template(&template("mistral-v0.3")),
            ToolSyntax::Mistral
        );
        for plain in ["qwen2", "mistral-v0.1", "mixtral-8x7b"] {
            assert_eq!(
                ToolSyntax::of_template(&template(plain)),
                ToolSyntax::Text,
                "{plain}"
            );
        }
    }

    #[test]
    fn mistral_call_ids_are_nine_letters_or_digits_and_stable() {
        let id = ToolSyntax::Mistral.call_id("call_0123456789abcdef_0");
        assert_eq!(id.len(), 9);
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        assert_eq!(id, ToolSyntax::Mistral.call_id("call_0123456789abcdef_0"));
        assert_ne!(id, ToolSyntax::Mistral.call_id("call_0123456789abcdef_1"));
        assert_eq!(ToolSyntax::Mistral.call_id("abc123def"), "abc123def");
        assert_eq!(ToolSyntax::Hermes.call_id("call_1"), "call_1");
    }
}
