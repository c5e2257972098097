//! A step's turns as a policy sees them: each cell's view, and the agents whose turn it is.

use crate::sim::config::LlmConfig;
use crate::sim::population::Population;
use crate::sim::scenario::{CellInfo, Scenario};

/// One cell of the step being decided.
pub struct CellView<'a, S: Scenario> {
    pub scenario: &'a S,
    pub world: &'a S::World,
    pub population: &'a Population,
    pub info: &'a CellInfo,
    /// The model and sampling of the cell's arm.
    pub llm: &'a LlmConfig,
    /// Per route of the cell's arm (see [`crate::sim::experiment::Experiment::llm_of`]):
    /// the arm's own, then each policy group's.
    pub llms: &'a [LlmConfig],
    /// Each agent's route; `None`: every agent is on route 0.
    pub route: Option<&'a [u8]>,
    pub step: usize,
}

impl<S: Scenario> CellView<'_, S> {
    /// The model and sampling agent `agent` decides with: its policy group's, if the group
    /// names its own, else its arm's.
    pub(crate) fn llm_of(&self, agent: usize) -> &LlmConfig {
        match self.route {
            Some(route) => &self.llms[route[agent] as usize],
            None => self.llm,
        }
    }
}

/// An agent whose turn it is: small, so that a step of a million agents is a small list.
#[derive(Debug, Clone, Copy)]
pub struct AgentTurn {
    /// Index into the cells of the step.
    pub cell: usize,
    pub agent: usize,
    /// Seeds the agent's draws this step (its sampling, or the scripted rules' noise).
    pub seed: u64,
    /// Whether the decisions log keeps this turn: a model then keeps its whole prompt too.
    pub logged: bool,
}

/// The whole prompt of a turn the decisions log keeps, for a reader: each message under its
/// role. The system message is shared with the other turns of its cell rather than copied, so
/// that a step whose every turn is logged holds each turn's own messages only (the system
/// message is most of a prompt).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Transcript {
    system: std::sync::Arc<str>,
    /// The turn's own messages, already under their roles.
    own: String,
}

impl Transcript {
    pub fn new(system: std::sync::Arc<str>, own: &[crate::engine::Message]) -> Self {
        let mut text = String::new();
        for m in own {
            text.push_str(&format!("\n[{}]\n{}\n", m.role, m.content));
        }
        Self { system, own: text }
    }

    /// The prompt as one text.
    pub fn text(&self) -> String {
        format!("[system]\n{}\n{}", self.system, self.own)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Message;

    #[test]
    fn a_transcript_reads_as_the_prompts_messages_under_their_roles() {
        let system: std::sync::Arc<str> = "Guess 2/3 of the average.".into();
        let own = [
            Message::user("Round 1?"),
            Message::assistant("{\"guess\": 33}"),
            Message::user("Round 2?"),
        ];
        let transcript = Transcript::new(system.clone(), &own);
        assert_eq!(
            transcript.text(),
            "[system]\nGuess 2/3 of the average.\n\n[user]\nRound 1?\n\n[assistant]\n\
             {\"guess\": 33}\n\n[user]\nRound 2?\n"
        );
        // Turns of a cell share its system message rather than copy it.
        assert!(std::sync::Arc::ptr_eq(&transcript.system, &system));
        // A transcript crosses ranks whole.
        let bytes = rmp_serde::to_vec_named(&transcript).unwrap();
        let back: Transcript = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back.text(), transcript.text());
    }
}
