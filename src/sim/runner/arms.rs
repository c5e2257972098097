//! The typed arms of a run at each step. An arm whose changes hold from a later step
//! (`[[arms]] from_step`) is the base scenario until then, so the runner asks for the arms of
//! the step it is on rather than holding one scenario per arm.

use crate::sim::scenario::Descriptor;

/// The arms from the start, and the arms from each later step at which one of them changes,
/// with what the runner knows of their kind.
#[derive(Debug)]
pub struct Arms<S> {
    kind: Descriptor,
    start: Vec<S>,
    /// `(first step, arms)`, by step; each holds every arm.
    later: Vec<(usize, Vec<S>)>,
}

impl<S> Arms<S> {
    /// Arms that are the same at every step.
    pub fn fixed(kind: Descriptor, arms: Vec<S>) -> Self {
        Self {
            kind,
            start: arms,
            later: Vec::new(),
        }
    }

    /// `start`, then from each `(step, arms)` on, those arms. Steps count from 1, as records
    /// count them; step 0 is the start (the worlds' first state).
    pub(crate) fn changing(
        kind: Descriptor,
        start: Vec<S>,
        mut later: Vec<(usize, Vec<S>)>,
    ) -> Self {
        later.sort_by_key(|(step, _)| *step);
        debug_assert!(
            later
                .iter()
                .all(|(step, arms)| *step > 0 && arms.len() == start.len())
        );
        Self { kind, start, later }
    }

    /// What the runner knows of the arms' kind: its name, roles, tables and aggregates.
    pub fn kind(&self) -> &Descriptor {
        &self.kind
    }

    /// The arms that rule step `step` (counted from 1; 0 for the worlds' first state).
    pub fn at(&self, step: usize) -> &[S] {
        self.later
            .iter()
            .rev()
            .find(|(from, _)| *from <= step)
            .map_or(&self.start, |(_, arms)| arms)
    }

    /// The arms from the start: they make the worlds.
    pub fn start(&self) -> &[S] {
        &self.start
    }

    /// The steps at which some arm changes, with the arms from then on.
    pub fn changes(&self) -> impl Iterator<Item = (usize, &[S])> {
        self.later
            .iter()
            .map(|(step, arms)| (*step, arms.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_ruled_by_the_latest_change_at_or_before_it() {
        let kind = || Descriptor::new("test", &["agent"]);
        let arms = Arms::changing(kind(), vec!["a0"], vec![(6, vec!["a6"]), (3, vec!["a3"])]);
        let at: Vec<&str> = (0..9).map(|s| arms.at(s)[0]).collect();
        assert_eq!(at, ["a0", "a0", "a0", "a3", "a3", "a3", "a6", "a6", "a6"]);
        assert_eq!(Arms::fixed(kind(), vec![1]).at(100), [1]);
    }
}
