//! The agents' prompts, step after step, as a simulation with history builds them.
//!
//! Step 1: every agent's prompt is the same `shared` tokens (the rules) followed by `own`
//! tokens of its own (its state). Step `s > 1`: the agent's previous prompt, its previous
//! reply and `own` new tokens, so that everything but the new tokens is a prefix the cache
//! holds from the previous step. Tokens are random ordinary-text ids, seeded by the run seed,
//! the agent and the step.

use crate::seed::derive;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
pub struct Workload {
    shared: usize,
    own: usize,
    text_vocab: u32,
    seed: u64,
    /// Each agent's context so far: its last prompt and reply.
    contexts: Vec<Vec<u32>>,
    /// Steps whose prompts were handed out.
    step: usize,
}

impl Workload {
    pub fn new(agents: usize, shared: usize, own: usize, text_vocab: u32, seed: u64) -> Self {
        Self {
            shared,
            own,
            text_vocab,
            seed,
            contexts: vec![Vec::new(); agents],
            step: 0,
        }
    }

    fn tokens(&self, n: usize, stream: &[u64]) -> Vec<u32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(derive(self.seed, stream));
        (0..n)
            .map(|_| rng.random_range(0..self.text_vocab))
            .collect()
    }

    /// The next step's number (1-based) and every agent's prompt for it.
    pub(crate) fn next_prompts(&mut self) -> (usize, Vec<Vec<u32>>) {
        self.step += 1;
        let step = self.step;
        if step == 1 {
            let shared = self.tokens(self.shared, &[0]);
            for ctx in &mut self.contexts {
                ctx.extend_from_slice(&shared);
            }
        }
        let own: Vec<Vec<u32>> = (0..self.contexts.len())
            .map(|a| self.tokens(self.own, &[1, a as u64, step as u64]))
            .collect();
        for (ctx, own) in self.contexts.iter_mut().zip(own) {
            ctx.extend(own);
        }
        (step, self.contexts.clone())
    }

    /// Appends each agent's reply to its context, for the next step.
    pub(crate) fn record_replies(&mut self, replies: &[Vec<u32>]) {
        for (ctx, reply) in self.contexts.iter_mut().zip(replies) {
            ctx.extend_from_slice(reply);
        }
    }

    /// The key agent `agent`'s requests carry, under which the engine retains its history.
    pub(crate) fn agent_key(agent: usize) -> String {
        format!("agent {agent}")
    }

    /// The seed of agent `agent`'s sampling at step `step`.
    pub(crate) fn sampling_seed(&self, agent: usize, step: usize) -> u64 {
        derive(self.seed, &[2, agent as u64, step as u64])
    }

    /// Longest context any agent reaches in `steps` steps with replies of at most `reply`.
    pub fn max_context(shared: usize, own: usize, reply: usize, steps: usize) -> usize {
        // Saturating: absurd settings give a context too long for any model, never a wrap.
        shared
            .saturating_add(steps.saturating_mul(own))
            .saturating_add(steps.saturating_sub(1).saturating_mul(reply))
            .saturating_add(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each step's prompt extends the previous prompt and reply, so the prefix cache can
    /// serve everything but the new tokens.
    #[test]
    fn later_prompts_extend_the_previous_turn() {
        let mut w = Workload::new(3, 10, 4, 256, 7);
        let (s1, p1) = w.next_prompts();
        assert_eq!(s1, 1);
        assert!(p1.iter().all(|p| p.len() == 14 && p[..10] == p1[0][..10]));
        assert_ne!(p1[0][10..], p1[1][10..]);
        let replies = vec![vec![1, 2], vec![3], vec![]];
        w.record_replies(&replies);
        let (s2, p2) = w.next_prompts();
        assert_eq!(s2, 2);
        for a in 0..3 {
            let prefix: Vec<u32> = p1[a].iter().chain(&replies[a]).copied().collect();
            assert_eq!(p2[a][..prefix.len()], prefix[..]);
            assert_eq!(p2[a].len(), prefix.len() + 4);
        }
        assert_eq!(Workload::new(3, 10, 4, 256, 7).next_prompts().1, p1);
    }
}
