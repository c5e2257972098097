//! Each model family's own chat template, rendered by throng, against fixtures rendered once
//! by Python's jinja2 the way transformers' `apply_chat_template` renders them
//! (`scripts/render-chat-fixtures.py`; the templates and where they came from are in
//! `tests/data/chat_templates/`).

use std::path::{Path, PathBuf};

use serde_json::Value;
use throng::engine::{ChatTemplate, Message};
use throng::model::loader::ChatSpec;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates")
}

/// One rendered conversation: its inputs, and what transformers gave (output or error).
struct Fixture {
    name: String,
    json: Value,
}

impl Fixture {
    fn str(&self, key: &str) -> Option<String> {
        self.json
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
    }
}

fn fixtures(family: &str) -> Vec<Fixture> {
    let mut found: Vec<Fixture> = std::fs::read_dir(data_dir().join("fixtures"))
        .expect("tests/data/chat_templates/fixtures is readable")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{family}__")))
        })
        .map(|p| Fixture {
            name: p.file_stem().unwrap().to_string_lossy().into_owned(),
            json: serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

fn template_for(fixture: &Fixture) -> ChatTemplate {
    let file = fixture.str("template").unwrap();
    let source = std::fs::read_to_string(data_dir().join("templates").join(&file)).unwrap();
    ChatTemplate::new(&ChatSpec {
        template: Some(source),
        bos_token: fixture.str("bos_token"),
        eos_token: fixture.str("eos_token"),
    })
    .unwrap_or_else(|e| panic!("{file} does not compile: {e}"))
}

/// The fixture's messages as throng's `Message`s, when every one is a plain role and text
/// (the conversations a simulation sends).
fn plain_messages(fixture: &Fixture) -> Option<Vec<Message>> {
    fixture.json["messages"]
        .as_array()?
        .iter()
        .map(|m| {
            let obj = m.as_object()?;
            if obj.len() != 2 {
                return None;
            }
            Some(Message::with_role(
                obj.get("role")?.as_str()?,
                obj.get("content")?.as_str()?,
            ))
        })
        .collect()
}

/// Renders every fixture of `family` and compares with what transformers gave: the same
/// bytes, or an error naming the template's own message. Plain conversations go through the
/// engine's path (`ChatTemplate::render` with `Message`s) as well as the JSON one.
fn check_family(family: &str, min_fixtures: usize) {
    let all = fixtures(family);
    assert!(
        all.len() >= min_fixtures,
        "{family}: {} fixtures, expected at least {min_fixtures}; run scripts/render-chat-fixtures.py",
        all.len()
    );
    let mut failures = Vec::new();
    for fixture in &all {
        let template = template_for(fixture);
        let add_generation_prompt = fixture.json["add_generation_prompt"].as_bool().unwrap();
        let tools = match &fixture.json["tools"] {
            Value::Null => None,
            tools => Some(tools),
        };
        let mut results = vec![(
            "render_json",
            template.render_json(&fixture.json["messages"], tools, add_generation_prompt),
        )];
        if let (Some(messages), None) = (plain_messages(fixture), tools) {
            results.push(("render", template.render(&messages, add_generation_prompt)));
        }
        // The engine's own messages, calls and results included (as `throng api` hands a
        // template with a tool syntax of its own the history's calls to write).
        if let Ok(messages) =
            serde_json::from_value::<Vec<Message>>(fixture.json["messages"].clone())
        {
            results.push((
                "render_with_tools",
                template.render_with_tools(&messages, tools, add_generation_prompt),
            ));
        }
        for (how, got) in results {
            match (fixture.str("output"), fixture.str("error"), got) {
                (Some(want), _, Ok(got)) if want == got => {}
                (Some(want), _, Ok(got)) => failures.push(format!(
                    "{} ({how}): output differs\n--- transformers\n{want:?}\n--- throng\n{got:?}",
                    fixture.name
                )),
                (Some(_), _, Err(e)) => failures.push(format!(
                    "{} ({how}): transformers rendered it, throng failed: {e}",
                    fixture.name
                )),
                (None, Some(want), Err(e)) => {
                    let text = e.to_string();
                    if !text.contains(&want) || !text.contains("chat template") {
                        failures.push(format!(
                            "{} ({how}): error {text:?} does not carry the template's message {want:?}",
                            fixture.name
                        ));
                    }
                }
                (None, Some(want), Ok(got)) => failures.push(format!(
                    "{} ({how}): transformers raised {want:?}, throng rendered {got:?}",
                    fixture.name
                )),
                (None, None, _) => panic!("{}: fixture has neither output nor error", fixture.name),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// Guards against Qwen2's ChatML template losing its default system prompt, or a newline,
// when throng renders it.
#[test]
fn qwen2_renders_as_transformers_does() {
    check_family("qwen2", 5);
}

// Guards against Qwen2.5's tool blocks (`<tools>`, `<tool_call>`, `<tool_response>`) coming
// out differently from transformers: `tojson`'s separators, key order and escaping, and the
// `loop.previtem`/`loop.nextitem` grouping of tool responses.
#[test]
fn qwen2_5_renders_as_transformers_does() {
    check_family("qwen2.5", 8);
}

// Guards against the original Mistral template's `[INST]` spacing drifting, and against
// throng rendering a conversation it refuses (a system message, roles out of turn) instead
// of failing with its message.
#[test]
fn mistral_v0_1_renders_and_refuses_as_transformers_does() {
    check_family("mistral-v0.1", 5);
}

// Guards against the v0.1/v0.2 "system message folded into the first [INST]" template
// rendering differently, or accepting two user turns in a row.
#[test]
fn mistral_v0_2_renders_and_refuses_as_transformers_does() {
    check_family("mistral-v0.2", 5);
}

// Guards against Mistral v0.3's `[AVAILABLE_TOOLS]`/`[TOOL_CALLS]` blocks differing from
// transformers (`tojson`, `dict.items()` with a loop filter, `namespace`, `selectattr`,
// message equality) and against its tool-call-id check not raising.
#[test]
fn mistral_v0_3_renders_and_refuses_as_transformers_does() {
    check_family("mistral-v0.3", 8);
}

// Guards against Mixtral's template (no space after `</s>`, unlike Mistral v0.1's) being
// confused with its sibling, and against non-alternating roles being accepted.
#[test]
fn mixtral_renders_and_refuses_as_transformers_does() {
    check_family("mixtral-8x7b", 5);
}

// Guards against Llama 3.1's template (tools as `tojson(indent=4)`, tool calls, `ipython`
// results, the fixed date) drifting from transformers; the comparison family.
#[test]
fn llama_3_1_renders_as_transformers_does() {
    check_family("llama-3.1", 7);
}

// Guards against a family's fixtures going missing, or a fixture naming a template that is
// not there, without any test noticing.
#[test]
fn every_template_has_fixtures_and_every_fixture_a_template() {
    let templates: Vec<String> = std::fs::read_dir(data_dir().join("templates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for family in [
        "qwen2",
        "qwen2.5",
        "mistral-v0.1",
        "mistral-v0.2",
        "mistral-v0.3",
        "mixtral-8x7b",
        "llama-3.1",
    ] {
        let all = fixtures(family);
        assert!(!all.is_empty(), "no fixtures for {family}");
        for f in all {
            let file = f.str("template").unwrap();
            assert!(templates.contains(&file), "{}: no template {file}", f.name);
        }
    }
    let sources = std::fs::read_to_string(data_dir().join("SOURCES.md")).unwrap();
    for t in &templates {
        assert!(
            sources.contains(&format!("`{t}`")),
            "SOURCES.md does not name {t}"
        );
    }
}
