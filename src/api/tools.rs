//! Tools: what a model may call, how it is told, and how its reply becomes a tool call.
//!
//! A call is the JSON object `{"name": <a tool's name>, "arguments": <its parameters>}`, and
//! the constrained decoder holds the reply to it: `tool_choice: "required"` to a call of any
//! tool, a named function to a call of that one, `"auto"` to a call or an answer, so that
//! even `auto` gives only calls whose arguments satisfy their tool's schema. One call per
//! reply.
//!
//! A model whose chat template has a tool syntax of its own ([`ToolSyntax`]: Qwen2.5's
//! `<tool_call>`, Llama 3.1's JSON, Mistral's `[TOOL_CALLS]`) is held to that syntax, the
//! form it was trained on: the template lists the tools and writes the calls and results of
//! the history, and an answer under `auto` is words (or the response format) that do not
//! begin as a call does. A template without one gets throng's text form, which every
//! template can render: the tools listed in the system message, calls and results written
//! as text, and an answer under `auto` written `{"content": "..."}`.

use super::call_text::raw_arguments;
use super::error::ApiFailure;
use super::schema;
use crate::engine::constraint::{Frame, Mark, Otherwise, Split};
use crate::engine::{FinishReason, Message, PromptEncoder, Response, Schema, ToolSyntax};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    /// Throng holds every call to its parameters, strict or not.
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum ToolChoice {
    Mode(String),
    Named {
        #[serde(rename = "type")]
        kind: String,
        function: NamedFunction,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamedFunction {
    pub name: String,
}

/// A call in an assistant message of the history.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: CallFunction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallFunction {
    pub name: String,
    /// JSON text, as OpenAI sends it.
    pub arguments: String,
}

/// What a reply may be, as `tools` and `tool_choice` ask.
#[derive(Debug, Clone)]
pub(crate) enum Choice {
    /// Words (or the response format): no tools, or `tool_choice: "none"`.
    None,
    /// A call of one of the tools.
    Required(Vec<Function>),
    /// A call of this tool (the only one listed).
    Named(Function),
    /// A call, or an answer: `{"content": ...}`, or in the response format when there is one.
    Auto { tools: Vec<Function>, wrapped: bool },
}

/// What a reply may be, and the syntax a call is written in.
#[derive(Debug, Clone)]
pub(crate) struct ToolMode {
    pub choice: Choice,
    pub form: Form,
}

/// A model's tool syntax, its control tokens found in the model's vocabulary: the frame a
/// call is written in (what else a reply may be is the request's to say).
#[derive(Debug, Clone)]
pub(crate) struct Form {
    pub syntax: ToolSyntax,
    call: Frame,
}

impl Form {
    fn new(syntax: ToolSyntax, mark: impl Fn(&str) -> Mark) -> Self {
        Form {
            syntax,
            call: Frame {
                open: syntax.opening().iter().map(|p| mark(p)).collect(),
                close: syntax.closing().iter().map(|p| mark(p)).collect(),
                otherwise: Otherwise::Nothing,
            },
        }
    }

    /// The syntax of `encoder`'s chat template.
    pub fn of(encoder: &PromptEncoder) -> Self {
        Self::in_vocabulary(encoder.chat_template().tool_syntax(), encoder.tokenizer())
    }

    /// `syntax` over `tokenizer`'s vocabulary: a piece that is one of its control tokens
    /// (Mistral's `[TOOL_CALLS]`) is generated as that token.
    fn in_vocabulary(syntax: ToolSyntax, tokenizer: &crate::engine::Tokenizer) -> Self {
        Self::new(syntax, |piece| {
            tokenizer
                .inner()
                .token_to_id(piece)
                .filter(|_| tokenizer.holds_control(piece))
                .map_or_else(|| Mark::Text(piece.to_string()), Mark::Token)
        })
    }

    /// Throng's text form, for any template.
    #[cfg(test)]
    pub fn text() -> Self {
        Self::spelled(ToolSyntax::Text)
    }

    /// `syntax` with every piece spelled as text (a vocabulary without its control tokens).
    #[cfg(test)]
    pub fn spelled(syntax: ToolSyntax) -> Self {
        Self::new(syntax, |piece| Mark::Text(piece.to_string()))
    }

    fn native(&self) -> bool {
        self.syntax.is_native()
    }

    fn frame(&self, otherwise: Otherwise) -> Frame {
        Frame {
            otherwise,
            ..self.call.clone()
        }
    }

    /// Whether a call is the whole reply, with no text around it (Llama's JSON, the text
    /// form): beside another JSON reply it needs no frame, both one schema's alternatives.
    fn bare(&self) -> bool {
        self.call.open.is_empty() && self.call.close.is_empty()
    }

    /// The JSON text of the call a reply is or begins, from its `{`; `None` for another reply
    /// or one too short to tell.
    pub(crate) fn call_body<'t>(&self, text: &'t str) -> Option<&'t str> {
        if !self.native() {
            return Some(text);
        }
        match self.call.split(text) {
            Split::Framed(body) => Some(body),
            _ => None,
        }
    }

    /// Whether a reply's `text` is too short to tell a call from another reply.
    pub(crate) fn undecided(&self, text: &str) -> bool {
        self.native() && self.call.split(text) == Split::Undecided
    }

    pub(crate) fn arguments_key(&self) -> &'static str {
        self.syntax.arguments_key()
    }
}

impl ToolMode {
    /// The part of a request the reply's schema comes from: the tools' parameters (which the
    /// call's schema holds) when any are offered, else the response format.
    pub(crate) fn schema_param(&self) -> &'static str {
        match self.choice {
            Choice::None => "response_format",
            _ => "tools",
        }
    }

    /// Whether the reply is held to no tools.
    pub(crate) fn is_none(&self) -> bool {
        matches!(self.choice, Choice::None)
    }

    /// Whether calls and results of the history, and the tools, are the template's to write.
    pub(crate) fn native(&self) -> bool {
        self.form.native()
    }
}

/// The mode `tools` and `tool_choice` ask for, each tool's parameters checked, in `form`.
pub fn mode(
    tools: Option<Vec<Tool>>,
    choice: Option<ToolChoice>,
    response: Option<&Value>,
    form: Form,
) -> Result<ToolMode, ApiFailure> {
    let choice = choice_of(tools, choice, response)?;
    Ok(ToolMode { choice, form })
}

fn choice_of(
    tools: Option<Vec<Tool>>,
    choice: Option<ToolChoice>,
    response: Option<&Value>,
) -> Result<Choice, ApiFailure> {
    let tools = tools.unwrap_or_default();
    let mut functions = Vec::with_capacity(tools.len());
    for (i, tool) in tools.into_iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiFailure::invalid(
                format!("tools[{i}].type"),
                format!("tool type {:?}: throng's tools are functions", tool.kind),
            ));
        }
        let name = &tool.function.name;
        if name.is_empty() || functions.iter().any(|f: &Function| f.name == *name) {
            return Err(ApiFailure::invalid(
                format!("tools[{i}].function.name"),
                format!("tool name {name:?} is empty or given twice: name each tool once"),
            ));
        }
        if let Some(parameters) = &tool.function.parameters {
            schema::check(parameters).map_err(|e| {
                ApiFailure::invalid(
                    format!("tools[{i}].function.parameters"),
                    format!("tools[{i}].function.parameters: {e}"),
                )
                .code("unsupported_schema_keyword")
            })?;
        }
        functions.push(tool.function);
    }
    let choice = match choice {
        None if functions.is_empty() => return Ok(Choice::None),
        None => "auto".to_string(),
        Some(ToolChoice::Mode(m)) => m,
        Some(ToolChoice::Named { kind, function }) => {
            if kind != "function" {
                return Err(ApiFailure::invalid(
                    "tool_choice.type",
                    "tool_choice.type must be \"function\"",
                ));
            }
            let Some(f) = functions.iter().find(|f| f.name == function.name) else {
                return Err(ApiFailure::invalid(
                    "tool_choice.function.name",
                    format!(
                        "tool_choice names {:?}, which is not among the tools",
                        function.name
                    ),
                ));
            };
            return Ok(Choice::Named(f.clone()));
        }
    };
    match choice.as_str() {
        "none" => Ok(Choice::None),
        _ if functions.is_empty() => Err(ApiFailure::invalid(
            "tool_choice",
            format!("tool_choice {choice:?} needs tools"),
        )),
        "required" => Ok(Choice::Required(functions)),
        "auto" => Ok(Choice::Auto {
            tools: functions,
            wrapped: response.is_none(),
        }),
        other => Err(ApiFailure::invalid(
            "tool_choice",
            format!(
                "tool_choice {other:?}: use \"auto\", \"required\", \"none\" or a named function"
            ),
        )),
    }
}

/// The arguments of a tool without `parameters`: none (OpenAI's reading), so `{}`.
fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

/// The schema of one call of `f`, its arguments under `key`.
fn call_schema(f: &Function, key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": f.name},
            key: f.parameters.clone().unwrap_or_else(no_arguments),
        },
        "required": ["name", key],
        "additionalProperties": false,
    })
}

/// An answer in words under `auto`.
fn content_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"content": {"type": "string"}},
        "required": ["content"],
        "additionalProperties": false,
    })
}

fn any_of(mut schemas: Vec<Value>) -> Value {
    if schemas.len() == 1 {
        schemas.remove(0)
    } else {
        json!({"anyOf": schemas})
    }
}

impl ToolMode {
    /// The names of the tools a reply may call.
    pub(crate) fn names(&self) -> Vec<&str> {
        self.tools().iter().map(|f| f.name.as_str()).collect()
    }

    fn tools(&self) -> &[Function] {
        match &self.choice {
            Choice::None => &[],
            Choice::Required(tools) | Choice::Auto { tools, .. } => tools,
            Choice::Named(f) => std::slice::from_ref(f),
        }
    }

    /// The tools as the chat template lists them (OpenAI's form), where the template has a
    /// syntax of its own.
    pub(crate) fn template_tools(&self) -> Option<Value> {
        if !self.native() || self.tools().is_empty() {
            return None;
        }
        let listed = self
            .tools()
            .iter()
            .map(|f| {
                let mut function = json!({"name": f.name});
                if let Some(d) = f.description.as_deref().filter(|d| !d.is_empty()) {
                    function["description"] = json!(d);
                }
                function["parameters"] = f.parameters.clone().unwrap_or_else(no_arguments);
                json!({"type": "function", "function": function})
            })
            .collect();
        Some(Value::Array(listed))
    }

    /// The schema the reply is held to, given the response format's (if any).
    pub fn schema(&self, response: Option<Value>) -> Option<Schema> {
        let key = self.form.arguments_key();
        let calls: Vec<Value> = self.tools().iter().map(|f| call_schema(f, key)).collect();
        // What an answer under `auto` is, beside a call: words in the template's own syntax,
        // `{"content": ...}` in the text form, or the response format's value.
        let other = match &self.choice {
            Choice::None => return response.map(Schema::new),
            Choice::Required(_) | Choice::Named(_) => Otherwise::Nothing,
            Choice::Auto { wrapped: true, .. } if self.native() => Otherwise::Words,
            Choice::Auto { wrapped: true, .. } => Otherwise::Json(content_schema()),
            Choice::Auto { wrapped: false, .. } => Otherwise::Json(
                response.expect("invariant: an unwrapped auto answer has a response format"),
            ),
        };
        Some(match other {
            Otherwise::Nothing if self.form.bare() => Schema::new(any_of(calls)),
            Otherwise::Json(other) if self.form.bare() => {
                let mut all = calls;
                all.push(other);
                Schema::new(any_of(all))
            }
            other => Schema::framed(any_of(calls), self.form.frame(other)),
        })
    }

    /// What the system message says of the tools, in the text form (a template with a
    /// syntax of its own lists them itself).
    pub(crate) fn instructions(&self) -> Option<String> {
        let tools = self.tools();
        if tools.is_empty() || self.native() {
            return None;
        }
        let mut text = String::from("You have these tools:\n");
        for f in tools {
            let parameters = f.parameters.clone().unwrap_or_else(no_arguments);
            text.push_str(&format!("- {}", f.name));
            if let Some(d) = f.description.as_deref().filter(|d| !d.is_empty()) {
                text.push_str(&format!(": {d}"));
            }
            text.push_str(&format!("\n  arguments (JSON schema): {parameters}\n"));
        }
        text.push_str(match &self.choice {
            Choice::Auto { wrapped: true, .. } => {
                "To call a tool, answer with only {\"name\": <tool name>, \"arguments\": {...}}. \
                 To answer in words instead, answer with only {\"content\": \"<your answer>\"}."
            }
            Choice::Auto { wrapped: false, .. } => {
                "To call a tool, answer with only {\"name\": <tool name>, \"arguments\": {...}}; \
                 otherwise answer in the format asked for."
            }
            _ => "Call a tool: answer with only {\"name\": <tool name>, \"arguments\": {...}}.",
        });
        Some(text)
    }

    /// The tool call `response` is, if it is one: a finished reply that is a call of one of
    /// the tools, read from its text (a reply from a store has no parsed value).
    pub fn reply(&self, response: &Response, id: &str, index: usize) -> Option<Value> {
        if response.finish_reason != FinishReason::Stop {
            return None;
        }
        let body = self.form.call_body(&response.text)?;
        let value: Value = serde_json::from_str(body).ok()?;
        let value = value.as_object()?;
        let name = value.get("name")?.as_str()?;
        let key = self.form.arguments_key();
        if value.len() != 2 || !value.contains_key(key) || !self.names().contains(&name) {
            return None;
        }
        // The arguments as the model wrote them, as OpenAI returns them (and as they stream).
        let arguments = raw_arguments(body, key)
            .map_or_else(|| value.get(key).map(Value::to_string), |a| Some(a.into()))?;
        Some(json!({
            "id": format!("call_{id}_{index}"),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }))
    }

    /// The text of a reply that is not a call; `None` for a call cut short (by
    /// `max_tokens`), whose protocol text is never a client's content, as vLLM answers it.
    pub fn content(&self, response: &Response) -> Option<String> {
        let finished = response.finish_reason == FinishReason::Stop;
        if self.native() {
            return match &self.choice {
                Choice::None => Some(response.text.clone()),
                Choice::Required(_) | Choice::Named(_) => finished.then(|| response.text.clone()),
                // A finished reply that is no call is an answer (Llama's JSON answers begin
                // as calls do); one cut short is an answer where it began as none.
                Choice::Auto { .. } if finished => Some(response.text.clone()),
                Choice::Auto { .. } => (self.form.call_body(&response.text).is_none()
                    && !self.form.undecided(&response.text))
                .then(|| response.text.clone()),
            };
        }
        match &self.choice {
            Choice::None | Choice::Auto { wrapped: false, .. } => Some(response.text.clone()),
            Choice::Required(_) | Choice::Named(_) => {
                response.value.is_some().then(|| response.text.clone())
            }
            Choice::Auto { wrapped: true, .. } => match &response.value {
                Some(value) => match value.get("content") {
                    Some(Value::String(words)) => Some(words.clone()),
                    _ => Some(response.text.clone()),
                },
                // Cut: the words so far of an answer in words, nothing of a call.
                None => super::call_text::cut_words(&response.text),
            },
        }
    }

    /// An assistant message of the history: in the template's own syntax, its calls for the
    /// template to write; in the text form, its words and each call as the JSON object a
    /// call is.
    pub(crate) fn assistant(
        &self,
        text: String,
        calls: &[ToolCall],
        param: &str,
    ) -> Result<Message, ApiFailure> {
        let mut written = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            if call.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(ApiFailure::invalid(
                    format!("{param}[{i}].type"),
                    "a tool call's type is \"function\"",
                ));
            }
            let arguments: Value = serde_json::from_str(&call.function.arguments).map_err(|e| {
                ApiFailure::invalid(
                    format!("{param}[{i}].function.arguments"),
                    format!("the arguments of a tool call are JSON text: {e}"),
                )
            })?;
            written.push(crate::engine::ToolCall {
                id: self.form.syntax.call_id(&call.id),
                kind: "function".into(),
                function: crate::engine::CalledFunction {
                    name: call.function.name.clone(),
                    arguments,
                },
            });
        }
        if self.native() {
            return Ok(Message::calls(text, written));
        }
        let mut out = text;
        for call in written {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(
                &json!({"name": call.function.name, "arguments": call.function.arguments})
                    .to_string(),
            );
        }
        Ok(Message::assistant(out))
    }

    /// A tool's result: a `tool` message for a template with a syntax of its own, else the
    /// user turn that reports it.
    pub(crate) fn result(&self, name: &str, id: &str, content: String) -> Message {
        if self.native() {
            return Message::tool_result(self.form.syntax.call_id(id), content);
        }
        Message::user(format!("Result of the tool call {name} ({id}):\n{content}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Timings;

    fn reply(text: &str, finish: FinishReason) -> Response {
        Response {
            text: text.into(),
            value: None,
            finish_reason: finish,
            prompt_tokens: 1,
            cached_tokens: 0,
            generated_tokens: 1,
            token_ids: Vec::new(),
            timings: Timings::default(),
            tag: None,
            logprobs: None,
        }
    }

    fn auto(syntax: ToolSyntax, wrapped: bool) -> ToolMode {
        ToolMode {
            choice: Choice::Auto {
                tools: vec![Function {
                    name: "note".into(),
                    description: None,
                    parameters: None,
                    strict: None,
                }],
                wrapped,
            },
            form: Form::spelled(syntax),
        }
    }

    // Issue 39 A8: a reply in a template's own syntax reads back as OpenAI's call, its
    // markup in neither the call nor the content.
    #[test]
    fn a_call_in_each_templates_syntax_is_read_as_the_call_and_words_as_words() {
        for (syntax, call) in [
            (
                ToolSyntax::Hermes,
                "<tool_call>\n{\"name\": \"note\", \"arguments\": {\"t\": 1}}\n</tool_call>",
            ),
            (
                ToolSyntax::LlamaJson,
                "{\"name\": \"note\", \"parameters\": {\"t\": 1}}",
            ),
            (
                ToolSyntax::Mistral,
                "[TOOL_CALLS] [{\"name\": \"note\", \"arguments\": {\"t\": 1}}]",
            ),
        ] {
            let mode = auto(syntax, true);
            let done = reply(call, FinishReason::Stop);
            let got = mode.reply(&done, "x", 0).unwrap();
            assert_eq!(got["function"]["name"], "note", "{syntax:?}");
            assert_eq!(got["function"]["arguments"], "{\"t\": 1}", "{syntax:?}");
            // Cut short: neither a call nor its markup as content.
            let cut = reply(&call[..call.len() - 6], FinishReason::Length);
            assert_eq!(mode.reply(&cut, "x", 0), None, "{syntax:?}");
            assert_eq!(mode.content(&cut), None, "{syntax:?}");
            // Words are the content, as written, whole or cut.
            for finish in [FinishReason::Stop, FinishReason::Length] {
                let words = reply("It is 21 degrees.", finish);
                assert_eq!(mode.reply(&words, "x", 0), None);
                assert_eq!(mode.content(&words).as_deref(), Some("It is 21 degrees."));
            }
            // A reply from a store, whose value was never parsed, reads the same.
            assert!(mode.reply(&done, "x", 0).is_some());
        }
        // Llama's JSON answer beside its calls (a response format): content, not a call.
        let mode = auto(ToolSyntax::LlamaJson, false);
        let answer = reply("{\"price\": 3}", FinishReason::Stop);
        assert_eq!(mode.reply(&answer, "x", 0), None);
        assert_eq!(mode.content(&answer).as_deref(), Some("{\"price\": 3}"));
    }

    #[test]
    fn a_piece_of_the_syntax_that_is_a_control_token_is_generated_as_that_token() {
        // A vocabulary of nothing but what is added to it.
        let vocabulary = |special: &[&str]| {
            let mut inner = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
            inner
                .add_special_tokens(
                    special
                        .iter()
                        .map(|t| tokenizers::AddedToken::from(*t, true)),
                )
                .unwrap();
            crate::engine::Tokenizer::new(inner, Vec::new())
        };
        let with = vocabulary(&["[TOOL_CALLS]"]);
        let id = with.inner().token_to_id("[TOOL_CALLS]").unwrap();
        let form = Form::in_vocabulary(ToolSyntax::Mistral, &with);
        assert_eq!(
            form.call.open,
            vec![Mark::Token(id), Mark::Text(" [".into())]
        );
        // Without the token in the vocabulary, its text is spelled.
        let form = Form::in_vocabulary(ToolSyntax::Mistral, &vocabulary(&["<s>"]));
        assert_eq!(form.call.open[0], Mark::Text("[TOOL_CALLS]".into()));
    }

    #[test]
    fn each_syntax_holds_its_reply_to_its_own_frame() {
        let frame = |syntax| auto(syntax, true).schema(None).unwrap();
        let hermes = frame(ToolSyntax::Hermes);
        let hermes = hermes.frame().unwrap();
        assert_eq!(hermes.lead(), "<tool_call>\n{");
        assert_eq!(hermes.otherwise, Otherwise::Words);
        assert_eq!(frame(ToolSyntax::LlamaJson).frame().unwrap().lead(), "{");
        // A call alone (required) in Llama's syntax is the whole reply: no frame.
        let mut required = auto(ToolSyntax::LlamaJson, true);
        required.choice = Choice::Required(required.tools().to_vec());
        let schema = required.schema(None).unwrap();
        assert!(schema.frame().is_none());
        assert_eq!(
            schema.value()["properties"]["parameters"]["type"],
            "object",
            "{:?}",
            schema
        );
        // The text form keeps `{"content": ...}` for words.
        let text = auto(ToolSyntax::Text, true).schema(None).unwrap();
        assert!(text.frame().is_none());
        assert!(text.value().to_string().contains("\"content\""));
    }
}
