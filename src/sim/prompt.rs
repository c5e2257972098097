//! Prompt templates: `system.jinja` (what every agent of a cell shares, first, so that the
//! prefix cache computes it once) and one `<role>.jinja` per role (what differs, last),
//! read from the scenario's templates folder so that wording changes need no rebuild.

use crate::engine::chat::{RenderFailure, describe, jinja_environment, render_bounded};
use minijinja::{Environment, UndefinedBehavior};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error(
        "prompt template {path} is missing (the {scenario} scenario needs system.jinja and {needed}); restore it or point `templates` at a folder that has it"
    )]
    Missing {
        path: PathBuf,
        scenario: String,
        needed: String,
    },
    #[error("prompt template {path}: {message}")]
    Template { path: PathBuf, message: String },
}

/// The compiled templates of one scenario.
#[derive(Debug)]
pub struct PromptBook {
    env: Environment<'static>,
    /// Each template's text, by name.
    sources: std::collections::HashMap<String, String>,
    dir: PathBuf,
}

impl PromptBook {
    /// Loads `system.jinja` and `<role>.jinja` for every role from `dir`, and the `extra`
    /// templates (a persona meta-prompt) when given. Undefined variables
    /// are errors, so that a typo in a template stops the run at its first prompt rather
    /// than silently printing nothing.
    pub fn load(
        dir: &Path,
        scenario: &str,
        roles: &[&str],
        extra: &[&str],
    ) -> Result<Self, PromptError> {
        let mut env = jinja_environment();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        let names: Vec<String> = std::iter::once("system".to_string())
            .chain(roles.iter().map(|r| r.to_string()))
            .chain(extra.iter().map(|r| r.to_string()))
            .collect();
        let needed = roles
            .iter()
            .chain(extra)
            .map(|r| format!("{r}.jinja"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut sources = std::collections::HashMap::new();
        for name in names {
            let path = dir.join(format!("{name}.jinja"));
            let text = std::fs::read_to_string(&path).map_err(|_| PromptError::Missing {
                path: path.clone(),
                scenario: scenario.to_string(),
                needed: needed.clone(),
            })?;
            sources.insert(name.clone(), text.clone());
            env.add_template_owned(name, text)
                .map_err(|e| PromptError::Template {
                    path: path.clone(),
                    message: describe(&e),
                })?;
        }
        Ok(Self {
            env,
            sources,
            dir: dir.to_path_buf(),
        })
    }

    /// Every template's name and text, by name.
    pub fn templates(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut all: Vec<(&str, &str)> = self
            .sources
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        all.sort();
        all.into_iter()
    }

    /// The text of template `name`.
    pub fn source(&self, name: &str) -> Option<&str> {
        self.sources.get(name).map(String::as_str)
    }

    /// Renders template `name` (`system` or a role) with `context`.
    pub fn render(&self, name: &str, context: &minijinja::Value) -> Result<String, PromptError> {
        let path = self.dir.join(format!("{name}.jinja"));
        let template = self
            .env
            .get_template(name)
            .map_err(|e| PromptError::Template {
                path: path.clone(),
                message: describe(&e),
            })?;
        render_bounded(&template, context)
            .map(|s| s.trim().to_string())
            .map_err(|e| PromptError::Template {
                message: match &e {
                    RenderFailure::Template(e)
                        if e.kind() == minijinja::ErrorKind::UndefinedError =>
                    {
                        self.undefined(name, context, e)
                    }
                    _ => e.describe(&format!("{name}.jinja")),
                },
                path,
            })
    }

    /// What an undefined-value error of template `name` means: which variables the template
    /// uses that `context` does not give it, at which line, and what it is given, so that
    /// the message names the variable rather than "undefined value".
    fn undefined(&self, name: &str, context: &minijinja::Value, e: &minijinja::Error) -> String {
        let defined = |path: &str| {
            let mut parts = path.split('.');
            let head = parts.next().unwrap_or_default();
            if self.env.globals().any(|(g, _)| g == head) {
                return true;
            }
            let mut value = context.get_attr(head).unwrap_or_default();
            for part in parts {
                // An attribute of a value given as none (`group` outside a grouped game) is
                // read only under a test of that value: it is not what is missing.
                if value.is_undefined() || value.is_none() {
                    break;
                }
                value = value.get_attr(part).unwrap_or_default();
            }
            !value.is_undefined()
        };
        let mut missing: Vec<String> = self
            .env
            .get_template(name)
            .map(|t| t.undeclared_variables(true))
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !defined(v))
            .map(|v| format!("`{v}`"))
            .collect();
        missing.sort();
        let mut given: Vec<String> = context
            .try_iter()
            .map(|keys| keys.map(|k| k.to_string()).collect())
            .unwrap_or_default();
        given.sort();
        let line = e.line().filter(|&l| l > 0);
        let at = line
            .map(|l| {
                let text = self
                    .source(name)
                    .and_then(|s| s.lines().nth(l - 1))
                    .map(|t| format!(" (`{}`)", t.trim()))
                    .unwrap_or_default();
                format!("line {l}{text}: ")
            })
            .unwrap_or_default();
        let what = match missing.len() {
            0 => "an undefined value (a variable, or an attribute of one, that the context does not have)".to_string(),
            1 => format!("undefined variable {}", missing[0]),
            _ => format!("undefined variables {}", missing.join(", ")),
        };
        format!(
            "{at}{what}; {name}.jinja is given: {}",
            if given.is_empty() {
                "nothing".to_string()
            } else {
                given.join(", ")
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Guards against issue 30, item 13: a prompt template's output had no bound but fuel,
    // which counts work, so `{{ "x" * 100000000 }}` made a 100 MB prompt per agent.
    #[test]
    fn a_prompt_template_that_writes_too_much_is_stopped_naming_it_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("system.jinja"), "Rules: {{ rules }}").unwrap();
        std::fs::write(
            dir.path().join("player.jinja"),
            "You are {{ name }}.\n{{ \"x\" * 100000000 }}",
        )
        .unwrap();
        let book = PromptBook::load(dir.path(), "guess", &["player"], &[]).unwrap();
        let ctx = minijinja::context! { rules => "guess", name => "Ada" };
        assert_eq!(book.render("system", &ctx).unwrap(), "Rules: guess");
        let err = book.render("player", &ctx).unwrap_err().to_string();
        assert!(
            err.contains("player.jinja") && err.contains("8 MiB") && err.contains("shorten"),
            "{err}"
        );
    }

    // The book (your-own-study.md, templates) says how block tags shape whitespace, as in
    // Hugging Face's chat templates; issue 39, item 13 found it undocumented.
    #[test]
    fn a_block_tag_on_a_line_of_its_own_leaves_no_line_and_plus_keeps_indentation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("system.jinja"), "Rules.").unwrap();
        std::fs::write(
            dir.path().join("agent.jinja"),
            "A\n  {% if rich %}\nrich\n  {% endif %}\nB\n  {%+ if rich %}x{% endif %}\n\nC",
        )
        .unwrap();
        let book = PromptBook::load(dir.path(), "s", &["agent"], &[]).unwrap();
        let text = book
            .render("agent", &minijinja::context! { rich => true })
            .unwrap();
        assert_eq!(text, "A\nrich\nB\n  x\nC");
    }
}
