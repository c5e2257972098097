//! The agent workload the gate decides: chat requests of the kinds simulations send, built
//! from a seed so that no two evaluations depend on a hand-picked set of prompts.
//!
//! Four roles take turns: an energy producer and a utility (the energy market's two kinds of
//! company), a player of "guess a share of the average" and a contributor to a public good.
//! Each role has its own long system prompt, shared by every agent of that role (as a
//! simulation's rules are), a user turn with that agent's own state drawn from the seed, and
//! a bounded schema with a free-text field, where a model that has lost its way loops
//! (`"reason": "1.1.1.1...`) until `max_tokens` cuts it off.

use crate::engine::{Message, Request, SamplingParams};
use crate::seed::derive;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Most reply tokens per decision: room for the schema's fields and a few sentences of reason.
pub(crate) const MAX_TOKENS: usize = 96;

/// Longest free text of a decision: a few sentences of prose (some 55 tokens, which leaves the
/// other fields room within [`MAX_TOKENS`]), while a reply that loops on digits and dots
/// (`"1.1.1.1...`, about two characters a token) runs out of tokens before it reaches the
/// limit and is cut off, as the replies of issue 17's workload were. Numbers carry a
/// `multipleOf`, as throng's own schemas do, so that endless decimals are not what ends a
/// reply.
const REASON_CHARS: usize = 240;

/// The kinds of agent in the workload, in the order requests cycle through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Producer,
    Utility,
    Guesser,
    Contributor,
}

impl Role {
    pub const ALL: [Role; 4] = [
        Role::Producer,
        Role::Utility,
        Role::Guesser,
        Role::Contributor,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Utility => "utility",
            Role::Guesser => "guesser",
            Role::Contributor => "contributor",
        }
    }

    fn rules(self) -> &'static str {
        match self {
            Role::Producer => PRODUCER_RULES,
            Role::Utility => UTILITY_RULES,
            Role::Guesser => GUESSER_RULES,
            Role::Contributor => CONTRIBUTOR_RULES,
        }
    }

    /// The decision's JSON schema, with the bounds the constrained decoder enforces.
    pub fn schema(self) -> Value {
        let (properties, order) = match self {
            Role::Producer => (
                json!({
                    "production_change": {"type": "integer", "minimum": -50, "maximum": 50},
                    "energy_price_change": {
                        "type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.1
                    },
                    "upgrade_capacity": {"type": "boolean"},
                    "reason": {"type": "string", "maxLength": REASON_CHARS}
                }),
                vec![
                    "production_change",
                    "energy_price_change",
                    "upgrade_capacity",
                    "reason",
                ],
            ),
            Role::Utility => (
                json!({
                    "reason": {"type": "string", "maxLength": REASON_CHARS},
                    "purchase_amount": {"type": "integer", "minimum": 0, "maximum": 2000},
                    "consumer_price": {
                        "type": "number", "minimum": 0, "maximum": 200, "multipleOf": 0.01
                    }
                }),
                vec!["reason", "purchase_amount", "consumer_price"],
            ),
            Role::Guesser => (
                json!({
                    "reasoning": {"type": "string", "maxLength": REASON_CHARS},
                    "guess": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.01}
                }),
                vec!["reasoning", "guess"],
            ),
            Role::Contributor => (
                json!({
                    "contribution": {"type": "integer", "minimum": 0, "maximum": 20},
                    "reason": {"type": "string", "maxLength": REASON_CHARS}
                }),
                vec!["contribution", "reason"],
            ),
        };
        json!({
            "type": "object",
            "properties": properties,
            "required": order,
            "additionalProperties": false
        })
    }

    /// One agent's state, drawn from `rng`.
    fn state(self, agent: usize, rng: &mut impl Rng) -> String {
        let step = rng.random_range(1..=12);
        match self {
            Role::Producer => {
                let kind = ["coal", "nuclear", "renewable", "oil and gas"][rng.random_range(0..4)];
                let price = rng.random_range(30.0..90.0f64);
                format!(
                    "Step {step}. You are company {agent}, a {kind} producer. Resources {}, \
                     production {} of capacity {}, price {price:.1}, cost per unit {:.1}. Last \
                     step you sold {} units. Neighbours: company {} sells at {:.1}, company {} \
                     sells at {:.1}. Demand is {} units and {}.",
                    rng.random_range(-2_000..60_000),
                    rng.random_range(40..220),
                    rng.random_range(150..260),
                    rng.random_range(20.0..80.0f64),
                    rng.random_range(0..240),
                    rng.random_range(0..64),
                    price + rng.random_range(-15.0..15.0),
                    rng.random_range(0..64),
                    price + rng.random_range(-15.0..15.0),
                    rng.random_range(600..2_400),
                    ["rising", "falling", "steady"][rng.random_range(0..3)],
                )
            }
            Role::Utility => {
                let persona = [
                    "environmentally conscious",
                    "greedy",
                    "depressed",
                    "cautious",
                ][rng.random_range(0..4)];
                format!(
                    "Step {step}. You are utility {agent}, and your persona is {persona}. \
                     Resources {}. Your customers want {} units. Your suppliers offer: \
                     producer {} at {:.1}, producer {} at {:.1}. Last step you charged {:.1} \
                     and sold {} units.{}",
                    rng.random_range(-5_000..80_000),
                    rng.random_range(200..1_500),
                    rng.random_range(0..64),
                    rng.random_range(25.0..95.0f64),
                    rng.random_range(0..64),
                    rng.random_range(25.0..95.0f64),
                    rng.random_range(10.0..120.0f64),
                    rng.random_range(0..1_500),
                    if rng.random_bool(0.5) {
                        format!(
                            " The regulator caps the consumer price at {:.0}.",
                            rng.random_range(40.0..100.0f64)
                        )
                    } else {
                        String::new()
                    },
                )
            }
            Role::Guesser => {
                let education = [
                    "elementary school",
                    "high school",
                    "a bachelor's degree",
                    "a master's degree",
                    "a doctorate",
                ][rng.random_range(0..5)];
                let occupation = [
                    "a nurse",
                    "a game theory professor",
                    "a farmer",
                    "an economist",
                    "a student",
                    "a retired teacher",
                ][rng.random_range(0..6)];
                let history = if step > 1 {
                    format!(
                        " In the previous round the average guess was {:.2} and the target was \
                         {:.2}; you guessed {:.0}.",
                        rng.random_range(5.0..55.0f64),
                        rng.random_range(3.0..37.0f64),
                        rng.random_range(0.0..100.0f64),
                    )
                } else {
                    String::new()
                };
                format!(
                    "Round {step}. You are player {agent}, aged {}, with {education}, working as \
                     {occupation}.{history} The target this round is {} of the average guess. \
                     What number do you choose?",
                    rng.random_range(18..80),
                    ["two thirds", "one half", "5 plus one half"][rng.random_range(0..3)],
                )
            }
            Role::Contributor => format!(
                "Round {step}. You are player {agent} in a group of {}. You hold {} tokens and \
                 may put up to 20 of them in the common pot. Last round the group put in {} \
                 tokens in total and each player received {:.1} back.",
                rng.random_range(3..9),
                rng.random_range(20..60),
                rng.random_range(0..120),
                rng.random_range(0.0..40.0f64),
            ),
        }
    }
}

/// One decision of the workload: who asks, and the request.
#[derive(Debug, Clone)]
pub struct AgentRequest {
    pub role: Role,
    pub request: Request,
}

/// `n` decisions at temperature 0, the roles in turn, each agent's state drawn from `seed`.
pub fn agent_requests(n: usize, seed: u64) -> Vec<AgentRequest> {
    (0..n)
        .map(|agent| {
            let role = Role::ALL[agent % Role::ALL.len()];
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(derive(seed, &[agent as u64]));
            let messages = vec![
                Message::system(role.rules()),
                Message::user(role.state(agent, &mut rng)),
            ];
            let request = Request::chat(messages)
                .with_schema(role.schema())
                .with_max_tokens(MAX_TOKENS)
                .with_sampling(SamplingParams::greedy())
                .with_tag(format!("{}-{agent}", role.name()));
            AgentRequest { role, request }
        })
        .collect()
}

const PRODUCER_RULES: &str = "You run an energy company in a simulated regional electricity \
market. Producers generate electricity from coal, nuclear fuel, renewable sources or oil and gas \
and sell it to the utilities they are connected to; utilities sell it on to consumers, whose \
demand moves a little every step and barely reacts to price. Every step you see your own state \
and your neighbours' state from the previous step, and then every company decides at the same \
time. Producing costs money for every unit, and energy you produce but do not sell earns \
nothing. Raising capacity costs 50000, adds 10 units of capacity and raises your cost per unit by \
10. Your goal is to maximise your profit over many steps without going bankrupt: a company whose \
resources fall below zero leaves the market for good. Answer with one JSON object and nothing \
else. production_change is how many units of production to add or remove, energy_price_change is \
how much to move your selling price, upgrade_capacity says whether to buy capacity this step, and \
reason is one short sentence on why. Stay consistent with the state of the market.";

const UTILITY_RULES: &str = "You run a utility in a simulated regional electricity market. \
Utilities buy electricity from the producers they are connected to, at the producer's price, and \
sell it to consumers at a price of their own choosing. Consumers need a certain amount of energy \
every step; what you cannot supply they buy from a rival, and what you buy but cannot sell is \
lost. A regulator may cap the price you charge consumers, and selling below your purchase price \
loses money on every unit. Your goal is to maximise your profit over many steps without going \
bankrupt: a company whose resources fall below zero leaves the market for good. Your persona \
colours how you decide, but you still want to stay in business. Answer with one JSON object and \
nothing else. reason is one short sentence on your plan, purchase_amount is how many units to buy \
from your suppliers this step, and consumer_price is the price you will charge your customers per \
unit. Stay consistent with your persona and with the state of the market.";

const GUESSER_RULES: &str = "You are taking part in a game with many other players. Every \
player chooses a number between 0 and 100, and all players choose at the same time without \
seeing the others' choices. When everyone has chosen, the average of all the numbers is \
computed, and the target is a fixed share of that average, announced before each round. The \
player whose number is closest to the target wins the round; ties share the prize. The game may \
be played for several rounds, and after each round everyone is told the average and the target. \
Think about what the other players are likely to choose, and about what they expect you to \
choose. You are playing the part of the person described in your instructions, so reason the way \
that person would. Answer with one JSON object and nothing else: reasoning is a brief \
explanation of how you chose, in at most two sentences, and guess is your number.";

const CONTRIBUTOR_RULES: &str = "You are a player in a public goods game. In every round, each \
player in your group receives tokens and decides how many of them, between 0 and 20, to put in a \
common pot. The pot is doubled and shared equally among all the players of the group, whether or \
not they contributed. Tokens you keep are yours alone. If everyone contributes the most, everyone \
ends up better off than if nobody contributes; but each player on their own does better by \
keeping their tokens while the others contribute. The game lasts for several rounds and everyone \
sees the group's total after each round. Decide how many tokens to contribute this round. Answer \
with one JSON object and nothing else: contribution is the number of tokens you put in the pot, \
and reason is one short sentence on why.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_a_function_of_its_seed() {
        let a = agent_requests(12, 7);
        let b = agent_requests(12, 7);
        let c = agent_requests(12, 8);
        let prompts =
            |w: &[AgentRequest]| -> Vec<_> { w.iter().map(|r| r.request.prompt.clone()).collect() };
        assert_eq!(prompts(&a), prompts(&b));
        assert_ne!(prompts(&a), prompts(&c));
        let roles: Vec<_> = a.iter().take(4).map(|r| r.role).collect();
        assert_eq!(roles, Role::ALL, "roles take turns");
    }

    #[test]
    fn every_schema_bounds_its_numbers_and_its_text() {
        for role in Role::ALL {
            let schema = role.schema();
            for (name, field) in schema["properties"].as_object().unwrap() {
                match field["type"].as_str().unwrap() {
                    "integer" | "number" => assert!(
                        field.get("minimum").is_some() && field.get("maximum").is_some(),
                        "{}.{name} is unbounded",
                        role.name()
                    ),
                    "string" => assert!(field.get("maxLength").is_some()),
                    _ => {}
                }
            }
        }
    }
}
