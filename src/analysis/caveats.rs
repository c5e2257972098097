//! What a reader must know before trusting a report's numbers, after whether the run is
//! finished: that a model below the study's size made the decisions, or that scripted rules
//! made some or all of them. Every scenario's report says these at its top (terminal and
//! `report.html`), in the same words, through [`notes`].

use crate::record::Manifest;

/// The study a scenario reproduces, as the notes name it.
#[derive(Debug, Clone, Copy)]
pub struct Study {
    /// The model the study ran, in words (`Llama 3.2 3B`), and its parameters in billions.
    pub model: &'static str,
    pub parameters: f64,
    /// What the study reports of smaller models, as a clause after the model (or empty).
    pub on_smaller_models: &'static str,
    /// What the study describes, which a smaller model or scripted rules cannot show
    /// (`the market behaviour the study describes`).
    pub behaviour: &'static str,
    /// How the command below gets the study's model (`the model it used`), and the preset.
    pub reproduce_with: &'static str,
    pub preset: &'static str,
    /// The config to name when the run's own is not recorded.
    pub config: &'static str,
}

/// What the scripted policy is in a scenario.
#[derive(Debug, Clone, Copy)]
pub struct ScriptedRules<'a> {
    /// Who follows which rules (`companies follow fixed rules of thumb`).
    pub agents: &'a str,
    /// What a scripted run's numbers test (`the market's rules, the records and the report`).
    pub tests: &'a str,
    /// What the rules build in that a reader could take for a finding, as a sentence (or
    /// empty).
    pub built_in: &'a str,
}

/// Parameters in billions, read from a model's name (`smollm2-135m-instruct`,
/// `llama-3.2-3b-instruct`, `SmolLM2-135M-Instruct.Q4_1.gguf`), when it says.
pub(crate) fn parameters_in_name(name: &str) -> Option<f64> {
    let base = name
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(name)
        .to_lowercase();
    base.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
        .filter_map(|token| {
            let (number, unit) = token.split_at(token.len().checked_sub(1)?);
            let scale = match unit {
                "m" => 1e-3,
                "b" => 1.0,
                _ => return None,
            };
            number.parse::<f64>().ok().map(|n| n * scale)
        })
        .next_back()
}

/// The notes of the run `m` describes: the scripted policy; a mixed one; a model below the
/// study's size (one whose size its name does not say counts as below). `seen` adds what the
/// run's own records show of the small model (a sentence starting with a space, or empty); it
/// is called only when that note is written.
pub fn notes(
    m: &Manifest,
    study: &Study,
    scripted: &ScriptedRules<'_>,
    seen: impl FnOnce() -> String,
) -> Vec<String> {
    let reproduce = format!(
        "To reproduce the study, run it on a GPU with {}: `cargo run --release --features cuda -- run {} --model {} --device cuda:0`.",
        study.reproduce_with,
        if m.config_file.is_empty() {
            study.config
        } else {
            &m.config_file
        },
        study.preset,
    );
    let built_in = if scripted.built_in.is_empty() {
        String::new()
    } else {
        format!(" {}", scripted.built_in)
    };
    let mut out = Vec::new();
    match m.policy.as_str() {
        "scripted" => {
            out.push(format!(
                "Scripted policy: {}, not a language model. These numbers test {}, not the study's claims about LLM agents.{built_in} {reproduce}",
                scripted.agents, scripted.tests
            ));
            return out;
        }
        "mixed" => out.push(format!(
            "Mixed policy: some agents decided through the model, the others by scripted rules ({}); decisions.jsonl says which policy made each decision. What the scripted agents did is built into their rules, so differences between the groups are differences between policies as much as between agents.{built_in}",
            scripted.agents
        )),
        _ => {}
    }
    if let Some(model) = m.model.as_deref() {
        let size = parameters_in_name(model);
        if size.is_none_or(|b| b < study.parameters) {
            let size = match size {
                Some(b) if b < 1.0 => format!("about {:.0}M parameters", b * 1000.0),
                Some(b) => format!("about {b}B parameters"),
                None => "a size throng cannot read from its name".into(),
            };
            let smaller = if study.on_smaller_models.is_empty() {
                String::new()
            } else {
                format!("; {}", study.on_smaller_models)
            };
            out.push(format!(
                "Small model: this run used {model} ({size}), below the {} the study used{smaller}.{} What this run demonstrates is the engine, the records and the report pipeline, not {}. {reproduce}",
                study.model,
                seen(),
                study.behaviour,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_sizes_are_read_from_names() {
        assert_eq!(parameters_in_name("smollm2-135m-instruct"), Some(0.135));
        assert_eq!(parameters_in_name("llama-3.2-3b-instruct"), Some(3.0));
        assert_eq!(
            parameters_in_name("/cache/SmolLM2-135M-Instruct.Q4_1.gguf"),
            Some(0.135)
        );
        assert_eq!(
            parameters_in_name("meta-llama/Llama-3.1-8B-Instruct"),
            Some(8.0)
        );
        assert_eq!(parameters_in_name("my-model"), None);
    }

    const STUDY: Study = Study {
        model: "Llama 3 8B",
        parameters: 8.0,
        on_smaller_models: "",
        behaviour: "what the study describes",
        reproduce_with: "a model of its size",
        preset: "llama-3.1-8b-instruct",
        config: "x.toml",
    };

    const RULES: ScriptedRules<'static> = ScriptedRules {
        agents: "agents follow rules",
        tests: "the rules",
        built_in: "The gradient is built in.",
    };

    fn notes_of(policy: &str, model: Option<&str>) -> Vec<String> {
        let m = Manifest {
            policy: policy.into(),
            model: model.map(str::to_string),
            ..Manifest::default()
        };
        notes(&m, &STUDY, &RULES, || " Seen.".into())
    }

    // Guards against issue 17, item 22: only the energy market's report said when rules or a
    // small model made its numbers, and neither said so of a mixed policy.
    #[test]
    fn every_policy_and_model_size_gets_its_note() {
        let scripted = notes_of("scripted", None);
        assert_eq!(scripted.len(), 1);
        assert!(
            scripted[0].starts_with("Scripted policy: agents follow rules, not a language model.")
                && scripted[0].contains("The gradient is built in.")
                && scripted[0].contains("run x.toml --model llama-3.1-8b-instruct"),
            "{scripted:?}"
        );
        let mixed = notes_of("mixed", Some("smollm2-135m-instruct"));
        assert_eq!(mixed.len(), 2, "{mixed:?}");
        assert!(mixed[0].starts_with("Mixed policy") && mixed[0].contains("built in"));
        assert!(
            mixed[1].starts_with("Small model: this run used smollm2-135m-instruct (about 135M parameters), below the Llama 3 8B the study used. Seen."),
            "{mixed:?}"
        );
        assert_eq!(notes_of("mixed", Some("llama-3.1-8b-instruct")).len(), 1);
        assert!(notes_of("llm", Some("llama-3.1-8b-instruct")).is_empty());
        assert!(notes_of("llm", Some("llama-3.1-70b-instruct")).is_empty());
        assert_eq!(notes_of("llm", Some("llama-3.2-3b-instruct")).len(), 1);
        // A model whose size its name does not say counts as below the study's.
        let unknown = notes_of("llm", Some("/models/mine"));
        assert!(
            unknown[0].contains("a size throng cannot read from its name"),
            "{unknown:?}"
        );
    }
}
