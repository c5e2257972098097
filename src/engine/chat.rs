//! Chat templates: a model's own Jinja template rendered the way Hugging Face's
//! `apply_chat_template` does (minijinja with `trim_blocks`, `lstrip_blocks`, Python string
//! methods, `raise_exception` and `strftime_now`), or `templates/chat/fallback.jinja`.

use crate::model::loader::ChatSpec;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

const FALLBACK: &str = include_str!("../../templates/chat/fallback.jinja");

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// Empty where a message has none (an assistant's turn that only calls tools).
    #[serde(default)]
    pub content: String,
    /// An assistant's calls of tools, for a template with a tool syntax of its own
    /// ([`ToolSyntax`](super::ToolSyntax)) to write in it; absent from a plain turn, as in
    /// transformers' messages (Llama 3.1's template asks `'tool_calls' in message`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A call of a tool in an assistant's turn, in the form chat templates read:
/// `{"id", "type": "function", "function": {"name", "arguments": {...}}}`, the arguments an
/// object (templates write them with `tojson`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: CalledFunction,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalledFunction {
    pub name: String,
    pub arguments: serde_json::Value,
}

impl Message {
    fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
    /// An assistant's turn that calls tools (after its words, if any).
    pub fn calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::new("assistant", content)
        }
    }
    /// A tool's result, answering the call `id`.
    pub fn tool_result(id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(id.into()),
            ..Self::new("tool", content)
        }
    }
    /// A message with `role` (any the template knows).
    pub fn with_role(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            ..Self::new("", content)
        }
    }

    /// Every piece of text the message holds that came from its author: its content, its
    /// calls' names, ids and arguments (keys and strings), the id it answers.
    pub(crate) fn texts(&self) -> Vec<&str> {
        let mut out = vec![self.content.as_str()];
        for call in &self.tool_calls {
            out.push(&call.id);
            out.push(&call.function.name);
            json_texts(&call.function.arguments, &mut out);
        }
        out.extend(self.tool_call_id.as_deref());
        out
    }

    /// The message with every text [`Message::texts`] names passed through `f`.
    pub(crate) fn map_texts(&self, f: &impl Fn(&str) -> String) -> Self {
        Self {
            role: self.role.clone(),
            content: f(&self.content),
            tool_calls: self
                .tool_calls
                .iter()
                .map(|c| ToolCall {
                    id: f(&c.id),
                    kind: c.kind.clone(),
                    function: CalledFunction {
                        name: f(&c.function.name),
                        arguments: map_json_texts(&c.function.arguments, f),
                    },
                })
                .collect(),
            tool_call_id: self.tool_call_id.as_deref().map(f),
        }
    }
}

/// The strings of a JSON value, keys included.
pub(crate) fn json_texts<'v>(value: &'v serde_json::Value, out: &mut Vec<&'v str>) {
    match value {
        serde_json::Value::String(s) => out.push(s),
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_texts(v, out)),
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.push(k);
                json_texts(v, out);
            }
        }
        _ => {}
    }
}

/// `value` with every string, keys included, passed through `f`.
pub(crate) fn map_json_texts(
    value: &serde_json::Value,
    f: &impl Fn(&str) -> String,
) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        J::String(s) => J::String(f(s)),
        J::Array(items) => J::Array(items.iter().map(|v| map_json_texts(v, f)).collect()),
        J::Object(map) => J::Object(
            map.iter()
                .map(|(k, v)| (f(k), map_json_texts(v, f)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The work one render of a template may do, in minijinja's fuel (about one instruction, or
/// 64 bytes of data, each): a hundred times what the largest prompts throng renders take, so
/// that only a runaway template (a loop of `range(99999)` inside another) reaches it, and
/// fails in well under a second instead of running for hours.
pub(crate) const TEMPLATE_FUEL: u64 = 10_000_000;

/// A minijinja environment that treats whitespace as Hugging Face's templates expect
/// (transformers' `_compile_jinja_template`: `trim_blocks`, `lstrip_blocks`), and stops a
/// render that does more than [`TEMPLATE_FUEL`] of work.
pub(crate) fn jinja_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("invariant: the default delimiters are valid"),
    );
    env
}

/// The most text one render of a template may write: 8 MiB, sixteen times what fills the
/// longest context throng runs (128K tokens of about 4 bytes each). Fuel counts work, not
/// output, and minijinja sets no limit of its own: `{{ "x" * 100000000 }}` wrote 100 MB per
/// render, which the tokenizer then took past 13 GB.
pub(crate) const MAX_RENDERED_BYTES: usize = 8 << 20;

/// Why a template's render failed.
#[derive(Debug)]
pub(crate) enum RenderFailure {
    /// It wrote more than [`MAX_RENDERED_BYTES`].
    TooLong,
    /// Any other error of the template (see [`describe`]).
    Template(minijinja::Error),
}

impl RenderFailure {
    /// What went wrong, on one line, with the way on; `template` names the template.
    pub fn describe(&self, template: &str) -> String {
        match self {
            RenderFailure::TooLong => format!(
                "{template} wrote more than {} MiB in one render, far more than any prompt (a \
                 string repeated or multiplied, such as `\"x\" * 100000000`, or a loop that runs \
                 too long?); shorten what it writes",
                MAX_RENDERED_BYTES >> 20
            ),
            RenderFailure::Template(e) => describe(e),
        }
    }
}

/// Writes a render into memory until it passes [`MAX_RENDERED_BYTES`], then refuses more.
struct Bounded {
    out: Vec<u8>,
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > MAX_RENDERED_BYTES {
            self.over = true;
            return Err(std::io::Error::other("the rendered text is too long"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders `template` with `ctx`, stopping at [`MAX_RENDERED_BYTES`] of output.
pub(crate) fn render_bounded(
    template: &minijinja::Template<'_, '_>,
    ctx: impl Into<Value>,
) -> Result<String, RenderFailure> {
    let mut out = Bounded {
        out: Vec::new(),
        over: false,
    };
    let rendered = template.render_captured_to(ctx, &mut out).map(|_| ());
    if out.over {
        return Err(RenderFailure::TooLong);
    }
    rendered.map_err(RenderFailure::Template)?;
    // minijinja writes whole `str`s, and a refused write leaves no part behind.
    Ok(String::from_utf8(out.out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

/// A template error with its causes, on one line.
pub fn describe(e: &minijinja::Error) -> String {
    if e.kind() == ErrorKind::OutOfFuel {
        return too_much_work(e);
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// A render stopped by [`TEMPLATE_FUEL`], with where it stopped.
fn too_much_work(e: &minijinja::Error) -> String {
    let at = match (e.name(), e.line()) {
        (Some(name), Some(line)) => format!("{name}, line {line}: "),
        (None, Some(line)) => format!("line {line}: "),
        _ => String::new(),
    };
    format!(
        "{at}the template did too much work: rendering stopped after {TEMPLATE_FUEL} steps (a \
         loop that runs too long, such as one `range(99999)` inside another?); a prompt needs \
         far fewer, so shorten the loop"
    )
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`. minijinja's own escapes `<`, `>`, `&` and
/// `'` for HTML and writes other separators, so a tool's JSON schema came out in a form the
/// model never saw in training.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    // Python: an int indents by that many spaces, a string by itself; None is one line.
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let (item, key) = match separators {
        Some(v) if !v.is_none() => {
            let item = v.get_item_by_index(0)?;
            let key = v.get_item_by_index(1)?;
            match (item.as_str(), key.as_str()) {
                (Some(i), Some(k)) => (i.to_string(), k.to_string()),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings, as (item, key)",
                    ));
                }
            }
        }
        // json.dumps' defaults: no space before a newline when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let mut json = PyJson {
        out: String::new(),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    json.value(value, 0)?;
    Ok(json.out)
}

/// Python's `json.dumps`, over minijinja values.
struct PyJson {
    out: String,
    ensure_ascii: bool,
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl PyJson {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value)?,
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.open_close('[', ']', depth, items.len(), |json, i, depth| {
                    json.value(&items[i], depth)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((json_key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.open_close('{', '}', depth, entries.len(), |json, i, depth| {
                    json.string(&entries[i].0);
                    json.out.push_str(&json.key.clone());
                    json.value(&entries[i].1, depth)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of kind {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// `[`, the items each on its own indented line when indenting, `]`.
    fn open_close(
        &mut self,
        open: char,
        close: char,
        depth: usize,
        len: usize,
        mut item: impl FnMut(&mut Self, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                self.out.push_str(&self.item.clone());
            }
            self.newline(depth + 1);
            item(self, i, depth + 1)?;
        }
        self.newline(depth);
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn number(&mut self, value: &Value) -> Result<(), Error> {
        if value.is_integer() {
            self.out.push_str(&value.to_string());
            return Ok(());
        }
        let f = f64::try_from(value.clone())?;
        self.out.push_str(&python_float(f));
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// A map key as `json.dumps` writes it: strings as they are, numbers, booleans and None as
/// their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float(f64::try_from(key.clone())?),
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ));
        }
    })
}

/// Python's `repr(float)`: the shortest digits that read back the same, positional between
/// 1e-4 and 1e16 (`0.5`, `12.0`), else exponential (`1e-05`, `1.5e+16`); `NaN`, `Infinity`.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the same shortest digits: `-1.5e-7`, `1e20`, `0e0`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("invariant: {:e} has an e");
    let exp: i32 = exp.parse().expect("invariant: {:e}'s exponent is a number");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let mantissa = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    } else if exp >= 0 {
        let whole = exp as usize + 1;
        if digits.len() <= whole {
            format!("{sign}{digits}{}.0", "0".repeat(whole - digits.len()))
        } else {
            format!("{sign}{}.{}", &digits[..whole], &digits[whole..])
        }
    } else {
        format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the model's chat template does not compile: {0}")]
    Compile(String),
    #[error("the chat template refused the conversation: {0}")]
    Render(String),
    #[error("{0}")]
    TooLong(String),
}

/// A compiled chat template with the special tokens it refers to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// `date_string` for templates that print today's date (Llama 3.1+). Fixed by default so
    /// that a simulation's prompts, and so its results, do not change with the calendar.
    date_string: Option<String>,
    /// Whether the template is the model's own (false: the fallback).
    pub is_models_own: bool,
    /// Message roles the template knows.
    roles: Vec<String>,
    /// How the template writes a call of a tool.
    tool_syntax: super::ToolSyntax,
}

/// Roles every chat template handles.
const STANDARD_ROLES: [&str; 3] = ["system", "user", "assistant"];
/// Roles some templates add, recognised when the template's text names them.
const OTHER_ROLES: [&str; 5] = ["tool", "ipython", "function", "developer", "observation"];

/// The roles a template's source knows: the standard three, and the others it names in
/// quotes (Llama 3.1's `ipython`, a `tool` role).
fn roles_of(source: &str) -> Vec<String> {
    let mut roles: Vec<String> = STANDARD_ROLES.iter().map(|r| r.to_string()).collect();
    for role in OTHER_ROLES {
        if source.contains(&format!("'{role}'")) || source.contains(&format!("\"{role}\"")) {
            roles.push(role.to_string());
        }
    }
    roles
}

impl ChatTemplate {
    pub fn new(spec: &ChatSpec) -> Result<Self, ChatError> {
        let mut env = jinja_environment();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", |format: String| -> Result<String, Error> {
            jiff::fmt::strtime::format(&format, &jiff::Zoned::now()).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now({format:?}): {e}"),
                )
            })
        });
        let (source, is_models_own) = match &spec.template {
            Some(t) => (t.clone(), true),
            None => (FALLBACK.to_string(), false),
        };
        let roles = roles_of(&source);
        let tool_syntax = super::ToolSyntax::of_template(&source);
        env.add_template_owned("chat", source)
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        Ok(Self {
            env,
            bos_token: spec.bos_token.clone().unwrap_or_default(),
            eos_token: spec.eos_token.clone().unwrap_or_default(),
            date_string: Some("26 Jul 2024".into()),
            is_models_own,
            roles,
            tool_syntax,
        })
    }

    /// Prints the real date where the template asks for it (`strftime_now`) instead of the
    /// fixed default.
    #[cfg(test)]
    pub(crate) fn with_live_date(mut self) -> Self {
        self.date_string = None;
        self
    }

    /// How this template writes a call of a tool.
    pub fn tool_syntax(&self) -> super::ToolSyntax {
        self.tool_syntax
    }

    /// Message roles this template knows.
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// The first message whose role the template does not know, with the known roles.
    pub(crate) fn unknown_role<'m>(&self, messages: &'m [Message]) -> Option<&'m str> {
        messages
            .iter()
            .map(|m| m.role.as_str())
            .find(|r| !self.roles.iter().any(|k| k == r))
    }

    /// Renders `messages`, ending with the assistant's header when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders `messages` with the `tools` the template lists (OpenAI's form: `[{"type":
    /// "function", "function": {...}}]`), as transformers' `apply_chat_template(messages,
    /// tools=tools)` does.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_values(
            Value::from(minijinja::value::Serde(messages)),
            tools
                .map(|t| Value::from(minijinja::value::Serde(t)))
                .unwrap_or(Value::from(())),
            add_generation_prompt,
        )
    }

    /// Renders messages given as JSON, as transformers' `apply_chat_template(messages,
    /// tools=tools)` does: for the parts of a template that [`Message`] cannot reach (an
    /// assistant's `tool_calls`, a `tool` message's `tool_call_id`, the `tools` list).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_values(
            Value::from(minijinja::value::Serde(messages)),
            tools
                .map(|t| Value::from(minijinja::value::Serde(t)))
                .unwrap_or(Value::from(())),
            add_generation_prompt,
        )
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Value,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template("chat")
            .expect("invariant: added in new()");
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            // transformers passes `tools=None` when a request has no tools.
            tools => tools,
            date_string => self.date_string.as_deref().map(Value::from).unwrap_or(Value::UNDEFINED),
        };
        render_bounded(&template, ctx).map_err(|e| match e {
            RenderFailure::TooLong => ChatError::TooLong(e.describe("the model's chat template")),
            RenderFailure::Template(e) => ChatError::Render(describe(&e)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(template: &str) -> ChatSpec {
        ChatSpec {
            template: Some(template.into()),
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
        }
    }

    #[test]
    fn python_string_methods_and_trim_blocks_work_as_in_transformers() {
        let t = ChatTemplate::new(&spec(
            "{% for m in messages %}\n{{ m['role'].upper() }}:{{ m['content'].strip() }}|\n{% endfor %}",
        ))
        .unwrap();
        let out = t.render(&[Message::user("  hi  ")], false).unwrap();
        assert_eq!(out, "USER:hi|\n");
    }

    // A tool's JSON schema came out HTML-escaped (`\u003c`) and without Python's spaces.
    #[test]
    fn tojson_writes_what_pythons_json_dumps_writes() {
        let t = ChatTemplate::new(&spec(
            "{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ x|tojson(sort_keys=true, separators=(',', ':')) }}|{{ x|tojson(ensure_ascii=true) }}|{{ []|tojson(indent=2) }}",
        ))
        .unwrap();
        let x = serde_json::json!({"z": "<a> & 'b' \"c\" é\n\u{1}", "a": [1, 2.5, null, true], "e": {}});
        let out = t
            .env
            .get_template("chat")
            .unwrap()
            .render(context! { x => Value::from(minijinja::value::Serde(&x)) })
            .unwrap();
        let parts: Vec<&str> = out.split('|').collect();
        // What `json.dumps` gives for the same dict, with each of those arguments.
        assert_eq!(
            parts[0],
            r#"{"z": "<a> & 'b' \"c\" é\n\u0001", "a": [1, 2.5, null, true], "e": {}}"#
        );
        assert_eq!(
            parts[1],
            "{\n  \"z\": \"<a> & 'b' \\\"c\\\" é\\n\\u0001\",\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"e\": {}\n}"
        );
        assert_eq!(
            parts[2],
            r#"{"a":[1,2.5,null,true],"e":{},"z":"<a> & 'b' \"c\" é\n\u0001"}"#
        );
        assert!(parts[3].contains(r#"\u00e9"#), "{}", parts[3]);
        assert_eq!(parts[4], "[]");
    }

    #[test]
    fn floats_print_as_python_prints_them() {
        for (f, python) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (12.5, "12.5"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.25e20, "1.25e+20"),
            (-3.75, "-3.75"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(python_float(f), python, "{f:e}");
        }
    }

    #[test]
    fn raise_exception_becomes_a_render_error() {
        let t = ChatTemplate::new(&spec(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}",
        ))
        .unwrap();
        let err = t
            .render(&[Message::assistant("x")], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Conversation must start with user"), "{err}");
    }

    #[test]
    fn date_is_fixed_unless_asked_to_be_live() {
        let src = "{% if date_string is defined %}{{ date_string }}{% else %}{{ strftime_now('%Y') }}{% endif %}";
        let fixed = ChatTemplate::new(&spec(src)).unwrap();
        assert_eq!(fixed.render(&[], false).unwrap(), "26 Jul 2024");
        let live = ChatTemplate::new(&spec(src)).unwrap().with_live_date();
        let year = live.render(&[], false).unwrap();
        assert!(year.len() == 4 && year.starts_with("20"), "{year}");
    }

    // A `wizard` message was once rendered into the prompt without a word.
    #[test]
    fn roles_are_the_standard_ones_and_those_the_template_names() {
        let plain = ChatTemplate::new(&spec("{{ messages[0]['content'] }}")).unwrap();
        assert_eq!(plain.unknown_role(&[Message::user("x")]), None);
        let wizard = Message::with_role("wizard", "x");
        assert_eq!(
            plain.unknown_role(std::slice::from_ref(&wizard)),
            Some("wizard")
        );
        let with_tools =
            ChatTemplate::new(&spec("{% if m.role == 'ipython' %}tool output{% endif %}")).unwrap();
        assert!(with_tools.roles().contains(&"ipython".to_string()));
    }

    // Guards against issue 30, item 13: `{{ "x" * 100000000 }}` in a chat template rendered
    // 100 MB a conversation (and the tokenizer took it past 13 GB); fuel bounds work, not
    // output.
    #[test]
    fn a_chat_template_that_writes_too_much_is_stopped_by_name_and_limit() {
        for source in [
            "{{ 'x' * 100000000 }}",
            "{% for i in range(3000) %}{{ 'y' * 5000 }}{% endfor %}",
        ] {
            let t = ChatTemplate::new(&spec(source)).unwrap();
            let err = t.render(&[Message::user("hi")], true).unwrap_err();
            assert!(matches!(err, ChatError::TooLong(_)), "{source}: {err:?}");
            let text = err.to_string();
            assert!(
                text.contains("chat template") && text.contains("8 MiB"),
                "{source}: {text}"
            );
        }
        // Just under the limit renders.
        let t = ChatTemplate::new(&spec("{{ 'z' * 8000000 }}")).unwrap();
        assert_eq!(t.render(&[], true).unwrap().len(), 8_000_000);
    }

    #[test]
    fn models_without_a_template_get_the_fallback() {
        let t = ChatTemplate::new(&ChatSpec::default()).unwrap();
        assert!(!t.is_models_own);
        let out = t
            .render(&[Message::system("Be brief."), Message::user("Hi")], true)
            .unwrap();
        assert_eq!(
            out,
            "### System:\nBe brief.\n\n### User:\nHi\n\n### Assistant:\n"
        );
    }
}
