//! Tools: what a model may call, how it is told, and how its reply becomes a tool call.
//!
//! A call is the JSON object `{"name": <a tool's name>, "arguments": <its parameters>}`, and
//! the constrained decoder holds the reply to it: `tool_choice: "required"` to a call of any
//! tool, a named function to a call of that one, `"auto"` to a call or an answer in words
//! written `{"content": "..."}` (or, with a `response_format`, an answer in that format), so
//! that even `auto` gives only calls whose arguments satisfy their tool's schema. The tools
//! are listed in the system message, and calls and results in the history are written as
//! text, which every model's chat template can render (templates with tool syntax of their
//! own are not asked to use it yet). One call per reply.

use super::error::ApiFailure;
use super::schema;
use crate::engine::Response;
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

/// What a reply may be.
#[derive(Debug, Clone)]
pub(crate) enum ToolMode {
    /// Words (or the response format): no tools, or `tool_choice: "none"`.
    None,
    /// A call of one of the tools.
    Required(Vec<Function>),
    /// A call of this tool (the only one listed).
    Named(Function),
    /// A call, or an answer: `{"content": ...}`, or in the response format when there is one.
    Auto { tools: Vec<Function>, wrapped: bool },
}

impl ToolMode {
    /// The part of a request the reply's schema comes from: the tools' parameters (which the
    /// call's schema holds) when any are offered, else the response format.
    pub(crate) fn schema_param(&self) -> &'static str {
        match self {
            ToolMode::None => "response_format",
            _ => "tools",
        }
    }
}

/// The mode `tools` and `tool_choice` ask for, each tool's parameters checked.
pub fn mode(
    tools: Option<Vec<Tool>>,
    choice: Option<ToolChoice>,
    response: Option<&Value>,
) -> Result<ToolMode, ApiFailure> {
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
        None if functions.is_empty() => return Ok(ToolMode::None),
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
            return Ok(ToolMode::Named(f.clone()));
        }
    };
    match choice.as_str() {
        "none" => Ok(ToolMode::None),
        _ if functions.is_empty() => Err(ApiFailure::invalid(
            "tool_choice",
            format!("tool_choice {choice:?} needs tools"),
        )),
        "required" => Ok(ToolMode::Required(functions)),
        "auto" => Ok(ToolMode::Auto {
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

/// The schema of one call of `f`.
fn call_schema(f: &Function) -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": f.name},
            "arguments": f.parameters.clone().unwrap_or_else(no_arguments),
        },
        "required": ["name", "arguments"],
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
        match self {
            ToolMode::None => &[],
            ToolMode::Required(tools) | ToolMode::Auto { tools, .. } => tools,
            ToolMode::Named(f) => std::slice::from_ref(f),
        }
    }

    /// The schema the reply is held to, given the response format's (if any).
    pub fn schema(&self, response: Option<Value>) -> Option<Value> {
        let calls = || self.tools().iter().map(call_schema).collect::<Vec<_>>();
        match self {
            ToolMode::None => response,
            ToolMode::Required(_) | ToolMode::Named(_) => Some(any_of(calls())),
            ToolMode::Auto { wrapped, .. } => {
                let mut all = calls();
                all.push(if *wrapped {
                    content_schema()
                } else {
                    response.expect("invariant: an unwrapped auto answer has a response format")
                });
                Some(any_of(all))
            }
        }
    }

    /// What the system message says of the tools.
    pub(crate) fn instructions(&self) -> Option<String> {
        let tools = self.tools();
        if tools.is_empty() {
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
        text.push_str(match self {
            ToolMode::Auto { wrapped: true, .. } => {
                "To call a tool, answer with only {\"name\": <tool name>, \"arguments\": {...}}. \
                 To answer in words instead, answer with only {\"content\": \"<your answer>\"}."
            }
            ToolMode::Auto { wrapped: false, .. } => {
                "To call a tool, answer with only {\"name\": <tool name>, \"arguments\": {...}}; \
                 otherwise answer in the format asked for."
            }
            _ => "Call a tool: answer with only {\"name\": <tool name>, \"arguments\": {...}}.",
        });
        Some(text)
    }

    /// The tool call `response` is, if it is one.
    pub fn reply(&self, response: &Response, id: &str, index: usize) -> Option<Value> {
        let value = response.value.as_ref()?.as_object()?;
        let name = value.get("name")?.as_str()?;
        if value.len() != 2 || !self.tools().iter().any(|f| f.name == name) {
            return None;
        }
        // The arguments as the model wrote them, as OpenAI returns them (and as they stream).
        let arguments = super::call_text::raw_arguments(&response.text).map_or_else(
            || value.get("arguments").map(Value::to_string),
            |a| Some(a.into()),
        )?;
        Some(json!({
            "id": format!("call_{id}_{index}"),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }))
    }

    /// The text of a reply that is not a call; `None` for a call cut short (by
    /// `max_tokens`), whose protocol text is never a client's content, as vLLM answers it.
    pub fn content(&self, response: &Response) -> Option<String> {
        match self {
            ToolMode::None | ToolMode::Auto { wrapped: false, .. } => Some(response.text.clone()),
            ToolMode::Required(_) | ToolMode::Named(_) => {
                response.value.is_some().then(|| response.text.clone())
            }
            ToolMode::Auto { wrapped: true, .. } => match &response.value {
                Some(value) => match value.get("content") {
                    Some(Value::String(words)) => Some(words.clone()),
                    _ => Some(response.text.clone()),
                },
                // Cut: the words so far of an answer in words, nothing of a call.
                None => super::call_text::cut_words(&response.text),
            },
        }
    }
}

/// An assistant message of the history as the model wrote it: its words, then each call as
/// the JSON object a call is.
pub(crate) fn written_assistant(
    text: &str,
    calls: &[ToolCall],
    param: &str,
) -> Result<String, ApiFailure> {
    let mut out = text.to_string();
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
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&json!({"name": call.function.name, "arguments": arguments}).to_string());
    }
    Ok(out)
}

/// A tool's result, as the user turn that reports it.
pub(crate) fn written_result(name: &str, id: &str, content: &str) -> String {
    format!("Result of the tool call {name} ({id}):\n{content}")
}
