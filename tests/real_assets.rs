//! The real assets: the Llama 3 tokenizer and chat template, and SmolLM2-135M as a GGUF file.

mod common;

use throng::engine::{ChatTemplate, EngineConfig, Message, Request, Tokenizer};
use throng::model::loader;

#[test]
fn llama3_tokenizer_round_trips_text() {
    let Some(dir) = common::llama3_tokenizer_dir() else {
        return;
    };
    let inner = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let tokenizer = Tokenizer::new(inner, vec![128001, 128009]);
    assert_eq!(tokenizer.vocab_size(), 128256);
    for text in [
        "Hello, world!",
        "  leading spaces, tabs\tand\nnewlines ",
        "Énergie: 42 €/MWh — prix plafonné à 0.25; 日本語も",
        "{\"production_change\": -12.5, \"upgrade_capacity\": false}",
    ] {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
    }
    assert_eq!(tokenizer.encode("Hello", false).unwrap(), vec![9906]);
    // Special tokens in text are single ids, as the chat template relies on.
    let ids = tokenizer
        .encode("<|begin_of_text|>Hello<|eot_id|>", false)
        .unwrap();
    assert_eq!(ids, vec![128000, 9906, 128009]);
}

#[test]
fn llama3_chat_template_renders_exactly() {
    let Some(dir) = common::llama3_tokenizer_dir() else {
        return;
    };
    let spec = loader::read_chat_spec(&dir).unwrap();
    let template = ChatTemplate::new(&spec).unwrap();
    assert!(template.is_models_own);
    let text = template
        .render(
            &[
                Message::system("You are an energy utility."),
                Message::user("Set your price."),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        text,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are an energy utility.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nSet your price.<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn smollm2_greedy_is_deterministic_and_knows_paris() {
    let Some(path) = common::smollm2() else {
        return;
    };
    // Under every format `auto` can choose: int8's quantized products must not cost the
    // model its knowledge.
    for weights in common::AUTO_CPU_FORMATS {
        let mut engine =
            common::engine_with(path.to_str().unwrap(), EngineConfig::default(), weights);
        let ask = || {
            Request::chat(vec![Message::user("What is the capital of France?")]).with_max_tokens(40)
        };
        let first = engine.generate(vec![ask()]).pop().unwrap().unwrap();
        let second = engine.generate(vec![ask()]).pop().unwrap().unwrap();
        assert_eq!(first.token_ids, second.token_ids, "{weights:?}");
        assert_eq!(first.text, second.text, "{weights:?}");
        assert!(
            first.text.contains("Paris"),
            "{weights:?}: {:?}",
            first.text
        );
    }
}

#[test]
fn smollm2_gguf_carries_its_tokenizer_and_chat_template() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let loaded = loader::load(path.to_str().unwrap(), &common::f32_options()).unwrap();
    let template = ChatTemplate::new(&loaded.chat).unwrap();
    assert!(template.is_models_own);
    let text = template.render(&[Message::user("Hi")], true).unwrap();
    assert!(text.starts_with("<|im_start|>system\n"), "{text:?}");
    assert!(
        text.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
        "{text:?}"
    );
    assert!(loaded.weights.contains("Q4_1"), "{}", loaded.weights);
    // As SmolLM2's own tokenizer.json: no space before the text, digits one by one.
    let ids = |text: &str| {
        loaded
            .tokenizer
            .encode(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    };
    assert_eq!(ids("<|im_start|>user\nHi"), vec![1, 4093, 198, 26843]);
    assert_eq!(ids("2024"), vec![34, 32, 34, 36]);
}

// Issue 39 A8 over a real vocabulary: a call framed in a template's tool syntax, and the
// words beside it, compile and read token by token under Llama 3's 128K BPE tokens (which
// join text across what the grammar treats as parts: ` {"`, `}\n`), and an opening that is
// one of its control tokens (id 128010, Llama 3.1's `<|python_tag|>`) is generated as that token.
#[test]
fn framed_calls_and_words_are_read_under_llama3s_real_vocabulary() {
    use serde_json::json;
    use throng::engine::Schema;
    use throng::engine::constraint::{Frame, Grammars, Mark, Otherwise};
    let Some(dir) = common::llama3_tokenizer_dir() else {
        return;
    };
    let inner = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let tokenizer = Tokenizer::new(inner, vec![128001, 128009]);
    let grammars = Grammars::new(&tokenizer, 128256);
    let call = json!({"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"], "additionalProperties": false}},
        "required": ["name", "arguments"], "additionalProperties": false});
    let accepts = |schema: &Schema, ids: &[u32]| {
        let mut c = grammars.constraint(schema).unwrap();
        for &id in ids {
            let mask = c.mask().unwrap();
            if !mask.is_allowed(id) {
                return false;
            }
            c.accept(id).unwrap();
        }
        c.mask().unwrap().is_allowed(128009)
    };
    let hermes = Schema::framed(
        call.clone(),
        Frame {
            open: vec![Mark::Text("<tool_call>\n".into())],
            close: vec![Mark::Text("\n</tool_call>".into())],
            otherwise: Otherwise::Words,
        },
    );
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>";
    assert!(accepts(&hermes, &tokenizer.encode(text, false).unwrap()));
    assert!(accepts(
        &hermes,
        &tokenizer.encode("It is sunny in Zürich.", false).unwrap()
    ));
    assert!(!accepts(
        &hermes,
        &tokenizer.encode("<tool_call>\nhello", false).unwrap()
    ));
    // An opening that is one control token.
    let tagged = Schema::framed(
        call,
        Frame {
            open: vec![Mark::Token(128010)],
            close: vec![],
            otherwise: Otherwise::Words,
        },
    );
    let mut ids = vec![128010];
    ids.extend(
        tokenizer
            .encode(
                "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}",
                false,
            )
            .unwrap(),
    );
    assert!(accepts(&tagged, &ids));
    assert!(accepts(&tagged, &tokenizer.encode("Sure.", false).unwrap()));
    // Words may not begin as the call's text does, so that a reply's text alone tells them
    // apart (the control token is not in the decoded text).
    assert!(!accepts(
        &tagged,
        &tokenizer.encode("{not a call}", false).unwrap()
    ));
}
