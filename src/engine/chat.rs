//! Chat templates: a model's own Jinja template rendered the way Hugging Face's
//! `apply_chat_template` does (minijinja with `trim_blocks`, `lstrip_blocks`, Python string
//! methods, `raise_exception` and `strftime_now`), or `templates/chat/fallback.jinja`.

use crate::model::loader::ChatSpec;
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

const FALLBACK: &str = include_str!("../../templates/chat/fallback.jinja");

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self {
            role: "system".into(),
            content: content.into(),
        }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self {
            role: "assistant".into(),
            content: content.into(),
        }
    }
}

/// The work one render of a template may do, in minijinja's fuel (about one instruction, or
/// 64 bytes of data, each): a hundred times what the largest prompts throng renders take, so
/// that only a runaway template (a loop of `range(99999)` inside another) reaches it, and
/// fails in well under a second instead of running for hours.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// A minijinja environment that treats whitespace as Hugging Face's templates expect
/// (transformers' `_compile_jinja_template`: `trim_blocks`, `lstrip_blocks`), and stops a
/// render that does more than [`TEMPLATE_FUEL`] of work.
pub fn jinja_environment() -> Environment<'static> {
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

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the model's chat template does not compile: {0}")]
    Compile(String),
    #[error("the chat template refused the conversation: {0}")]
    Render(String),
}

/// A compiled chat template with the special tokens it refers to.
#[derive(Debug)]
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
        env.add_template_owned("chat", source)
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        Ok(Self {
            env,
            bos_token: spec.bos_token.clone().unwrap_or_default(),
            eos_token: spec.eos_token.clone().unwrap_or_default(),
            date_string: Some("26 Jul 2024".into()),
            is_models_own,
            roles,
        })
    }

    /// Prints the real date where the template asks for it (`strftime_now`) instead of the
    /// fixed default.
    pub fn with_live_date(mut self) -> Self {
        self.date_string = None;
        self
    }

    /// Message roles this template knows.
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// The first message whose role the template does not know, with the known roles.
    pub fn unknown_role<'m>(&self, messages: &'m [Message]) -> Option<&'m str> {
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
        let template = self
            .env
            .get_template("chat")
            .expect("invariant: added in new()");
        let ctx = context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            // transformers passes `tools=None` when a request has no tools.
            tools => Value::from(()),
            date_string => self.date_string.as_deref().map(Value::from).unwrap_or(Value::UNDEFINED),
        };
        template
            .render(ctx)
            .map_err(|e| ChatError::Render(describe(&e)))
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
        let wizard = Message {
            role: "wizard".into(),
            content: "x".into(),
        };
        assert_eq!(
            plain.unknown_role(std::slice::from_ref(&wizard)),
            Some("wizard")
        );
        let with_tools =
            ChatTemplate::new(&spec("{% if m.role == 'ipython' %}tool output{% endif %}")).unwrap();
        assert!(with_tools.roles().contains(&"ipython".to_string()));
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
