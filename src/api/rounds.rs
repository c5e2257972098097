//! The rounds of calls a simulation makes, learned from the `user` of its requests, so that
//! next-call retention (`--kv-policy next-call`) works for frameworks that announce nothing:
//! agents that call once each per round, in about the same order every round, are the usual
//! simulation. A round is the run of distinct callers until one calls again; that caller
//! opens the next round, which is announced to the engine as the last one's order. A
//! framework that announces its rounds itself (`POST /v1/throng/expect_calls`) is taken at
//! its word, and nothing is learned for that model any more. A wrong guess costs cache hits,
//! never a different reply.

use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Default)]
pub struct Rounds(Mutex<Round>);

#[derive(Default)]
struct Round {
    /// The callers of the round so far, in the order they first called.
    order: Vec<String>,
    seen: HashSet<String>,
    /// A client announces the rounds itself.
    told: bool,
}

impl Rounds {
    /// `user` calls: the order to announce when this call opens a new round.
    pub fn called(&self, user: &str) -> Option<Vec<String>> {
        let mut round = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if round.told {
            return None;
        }
        if round.seen.insert(user.to_string()) {
            round.order.push(user.to_string());
            return None;
        }
        let finished = std::mem::replace(&mut round.order, vec![user.to_string()]);
        round.seen.clear();
        round.seen.insert(user.to_string());
        // A lone caller calling again is no round to plan for.
        (finished.len() > 1).then_some(finished)
    }

    /// A client announced the order of its calls: learning stops.
    pub fn told(&self) {
        let mut round = self.0.lock().unwrap_or_else(|e| e.into_inner());
        round.told = true;
        round.order.clear();
        round.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(rounds: &Rounds, users: &[&str]) -> Vec<Option<Vec<String>>> {
        users.iter().map(|u| rounds.called(u)).collect()
    }

    #[test]
    fn a_round_is_announced_when_its_first_caller_calls_again() {
        let rounds = Rounds::default();
        let seen = call(&rounds, &["a", "b", "c", "b", "a", "c", "b"]);
        let order = |o: &[&str]| Some(o.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        // "b" calls again: the round a, b, c ended, and the next is expected the same.
        assert_eq!(
            seen,
            [
                None,
                None,
                None,
                order(&["a", "b", "c"]),
                None,
                None,
                order(&["b", "a", "c"])
            ]
        );
    }

    #[test]
    fn one_caller_alone_announces_nothing() {
        let rounds = Rounds::default();
        assert!(call(&rounds, &["a", "a", "a"]).iter().all(Option::is_none));
    }

    #[test]
    fn a_client_that_announces_its_rounds_is_not_second_guessed() {
        let rounds = Rounds::default();
        call(&rounds, &["a", "b"]);
        rounds.told();
        assert!(
            call(&rounds, &["a", "b", "a", "b", "a"])
                .iter()
                .all(Option::is_none)
        );
    }
}
