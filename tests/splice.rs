//! A conversation that repeats replies the engine generated is tokenized with those replies
//! as the ids the model generated (`PromptEncoder::spliced_tokens`), so that the prompt up
//! to the end of a reply is the one that already ran, and the prefix cache holds it.

mod common;

use common::TinyLlama;
use throng::engine::{EngineConfig, Message, Prompt, PromptEncoder};

fn conversation(reply: &str) -> Vec<Message> {
    vec![
        Message::system("You are a utility in an energy market."),
        Message::user("Set your price."),
        Message::assistant(reply),
        Message::user("The market cleared at 41. And now?"),
    ]
}

fn tokens(encoder: &PromptEncoder, messages: &[Message]) -> Vec<u32> {
    encoder
        .tokens(&Prompt::Messages(messages.to_vec()))
        .unwrap()
}

/// Every engine the tests can run: the tiny byte-level one, and SmolLM2 (a real BPE
/// tokenizer and ChatML) when its file is there.
fn encoders() -> Vec<(String, PromptEncoder)> {
    let tiny = common::tiny_model(&TinyLlama::default());
    let mut out = vec![(
        "tiny".to_string(),
        common::engine(tiny.path().to_str().unwrap(), EngineConfig::default())
            .prompt_encoder()
            .clone(),
    )];
    if let Some(path) = common::smollm2() {
        let engine = common::engine(path.to_str().unwrap(), EngineConfig::default());
        out.push(("smollm2".into(), engine.prompt_encoder().clone()));
    }
    out
}

#[test]
fn spliced_tokens_equal_whole_tokens_when_ids_are_the_texts_own() {
    for (name, encoder) in encoders() {
        let reply = "{\"price\": 42.5, \"reason\": \"demand is high\"}";
        let messages = conversation(reply);
        let ids = encoder.tokenizer().encode(reply, false).unwrap();
        let spliced = encoder
            .spliced_tokens(&messages, None, &[(2, &ids)])
            .unwrap();
        assert_eq!(spliced.spliced, 1, "{name}");
        assert_eq!(spliced.tokens, tokens(&encoder, &messages), "{name}");
    }
}

#[test]
fn a_reply_goes_in_as_the_ids_the_model_wrote_after_the_prompt_that_asked_for_it() {
    let Some(path) = common::smollm2() else {
        return;
    };
    let encoder = common::engine(path.to_str().unwrap(), EngineConfig::default())
        .prompt_encoder()
        .clone();
    let reply = "{\"price\": 42.5}";
    // The reply as a model may sample it (forced tokens, or a spelling of its own): not as
    // the tokenizer would split the text.
    let mut ids = Vec::new();
    for piece in ["{\"", "pr", "ice", "\": ", "4", "2", ".", "5", "}"] {
        ids.extend(encoder.tokenizer().encode(piece, false).unwrap());
    }
    assert_eq!(encoder.tokenizer().decode(&ids, false).unwrap(), reply);
    let whole = tokens(&encoder, &conversation(reply));
    assert!(
        !whole.windows(ids.len()).any(|w| w == ids),
        "a spelling of its own"
    );
    let messages = conversation(reply);
    let spliced = encoder
        .spliced_tokens(&messages, None, &[(2, &ids)])
        .unwrap();
    assert_eq!(spliced.spliced, 1);
    let asked = tokens(&encoder, &messages[..2]);
    assert_eq!(
        &spliced.tokens[..asked.len()],
        asked,
        "the prompt that asked, as it ran"
    );
    assert_eq!(&spliced.tokens[asked.len()..asked.len() + ids.len()], ids);
    assert_eq!(
        encoder.tokenizer().decode(&spliced.tokens, false).unwrap(),
        encoder.tokenizer().decode(&whole, false).unwrap(),
        "the same text"
    );
}

#[test]
fn a_template_that_changes_a_reply_as_it_renders_it_gets_it_as_text() {
    // The tiny model's template trims each message, as Llama 3's does: ids of " yes " would
    // stand for text the template does not render.
    let tiny = common::tiny_model(&TinyLlama::default());
    let encoder = common::engine(tiny.path().to_str().unwrap(), EngineConfig::default())
        .prompt_encoder()
        .clone();
    let messages = conversation(" yes ");
    let ids = encoder.tokenizer().encode(" yes ", false).unwrap();
    let spliced = encoder
        .spliced_tokens(&messages, None, &[(2, &ids)])
        .unwrap();
    assert_eq!(spliced.spliced, 0);
    assert_eq!(spliced.tokens, tokens(&encoder, &messages));
}

#[test]
fn a_replys_ids_are_those_that_spell_it_without_what_ended_it() {
    for (name, encoder) in encoders() {
        let tokenizer = encoder.tokenizer();
        let text = "{\"price\": 42.5}";
        let ids = tokenizer.encode(text, false).unwrap();
        let eos = tokenizer.eos_ids()[0];
        let ended = [ids.clone(), vec![eos]].concat();
        assert_eq!(encoder.reply_ids(&ended, text), Some(ids.clone()), "{name}");
        assert_eq!(encoder.reply_ids(&ids, text), Some(ids.clone()), "{name}");
        // A stop string cut the reply after its tokens: they are what went before it.
        let stopped = [ids.clone(), tokenizer.encode("\nEND", false).unwrap()].concat();
        assert_eq!(
            encoder.reply_ids(&stopped, text),
            Some(ids.clone()),
            "{name}"
        );
        // Ids that spell other text are not this reply's.
        assert_eq!(encoder.reply_ids(&ids, "{\"price\": 1}"), None, "{name}");
    }
}
