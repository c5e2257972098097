//! Continuous batching: every step, decide which sequences advance by how many tokens.
//!
//! Running sequences go first, oldest first, each taking as many of its pending tokens as the
//! step's token budget allows (a long prompt is split into chunks over several steps). What
//! budget is left admits waiting sequences in arrival order. A sequence that needs a block
//! when none is free takes it from the newest running sequence, which is preempted: its
//! blocks are freed and it goes back to the head of the queue to be recomputed later, its
//! tokens and sampler state kept so that its output does not change.

use super::block_manager::BlockManager;
use super::sequence::Sequence;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Tokens one forward pass may process.
    pub max_batch_tokens: usize,
    /// Sequences that may be running at once.
    pub max_seqs: usize,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    /// Index into [`Scheduler::running`].
    pub index: usize,
    /// Tokens from `computed` on to run this step.
    pub len: usize,
    /// Whether the chunk reaches the end of the sequence, so a token is sampled after it.
    pub wants_logits: bool,
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pub blocks: BlockManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        Self {
            cfg,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        }
    }

    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    pub fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    /// Sequences preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Plans one step. Every running sequence has at least one pending token.
    pub fn schedule(&mut self) -> Vec<Scheduled> {
        let mut budget = self.cfg.max_batch_tokens;
        let mut plan = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let len = self.running[i].pending().min(budget);
            if !self.grow(i, len) {
                // `i` itself was the newest and has been preempted.
                continue;
            }
            let seq = &mut self.running[i];
            seq.first_scheduled
                .get_or_insert_with(std::time::Instant::now);
            plan.push(Scheduled {
                index: i,
                len,
                wants_logits: seq.computed + len == seq.tokens.len(),
            });
            budget -= len;
            i += 1;
        }
        while budget > 0 && self.running.len() < self.cfg.max_seqs {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            let needed = self.blocks.blocks_for(seq.tokens.len());
            let Some(blocks) = self.blocks.allocate(needed) else {
                break;
            };
            let mut seq = self.waiting.pop_front().expect("invariant: front exists");
            seq.blocks = blocks;
            seq.first_scheduled
                .get_or_insert_with(std::time::Instant::now);
            let len = seq.pending().min(budget);
            plan.push(Scheduled {
                index: self.running.len(),
                len,
                wants_logits: seq.computed + len == seq.tokens.len(),
            });
            budget -= len;
            self.running.push(seq);
        }
        plan
    }

    /// Gives running sequence `i` the blocks for `len` more tokens, preempting the newest
    /// sequences while none are free. False when `i` had to preempt itself.
    fn grow(&mut self, i: usize, len: usize) -> bool {
        let seq = &self.running[i];
        let needed = self
            .blocks
            .blocks_for(seq.computed + len)
            .saturating_sub(seq.blocks.len());
        while !self.blocks.can_allocate(needed) {
            let victim = self.running.len() - 1;
            self.preempt(victim);
            if victim == i {
                return false;
            }
        }
        let new = self
            .blocks
            .allocate(needed)
            .expect("invariant: checked can_allocate");
        self.running[i].blocks.extend(new);
        true
    }

    fn preempt(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.blocks.release(&seq.blocks);
        seq.blocks.clear();
        seq.computed = 0;
        self.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Removes running sequence `index`, freeing its blocks.
    pub fn finish(&mut self, index: usize) -> Sequence {
        let seq = self.running.remove(index);
        self.blocks.release(&seq.blocks);
        seq
    }

    /// Takes every sequence out (running and waiting), freeing all blocks.
    pub fn drain(&mut self) -> Vec<Sequence> {
        let running: Vec<Sequence> = self.running.drain(..).collect();
        for seq in &running {
            self.blocks.release(&seq.blocks);
        }
        running.into_iter().chain(self.waiting.drain(..)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::{Sampler, SamplingParams};

    fn seq(id: u64, prompt: usize) -> Sequence {
        Sequence::new(
            id,
            vec![1; prompt],
            Sampler::new(SamplingParams::greedy()),
            8,
        )
    }

    fn scheduler(tokens: usize, seqs: usize, blocks: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_batch_tokens: tokens,
                max_seqs: seqs,
            },
            BlockManager::new(blocks, 4),
        )
    }

    /// Pretends the planned chunks ran and each finished chunk sampled one token.
    fn run(s: &mut Scheduler, plan: &[Scheduled]) {
        for p in plan {
            let seq = &mut s.running_mut()[p.index];
            seq.computed += p.len;
            if p.wants_logits {
                seq.tokens.push(2);
            }
        }
    }

    #[test]
    fn long_prompts_are_chunked_under_the_token_budget() {
        let mut s = scheduler(8, 4, 16);
        s.add(seq(0, 20));
        let mut chunks = Vec::new();
        loop {
            let plan = s.schedule();
            chunks.push(plan[0].len);
            let done = plan[0].wants_logits;
            run(&mut s, &plan);
            if done {
                break;
            }
        }
        assert_eq!(chunks, vec![8, 8, 4]);
    }

    #[test]
    fn decodes_go_first_and_newcomers_fill_the_rest() {
        let mut s = scheduler(6, 4, 16);
        s.add(seq(0, 3));
        let plan = s.schedule();
        run(&mut s, &plan);
        s.add(seq(1, 10));
        let plan = s.schedule();
        assert_eq!(
            plan[0],
            Scheduled {
                index: 0,
                len: 1,
                wants_logits: true
            }
        );
        assert_eq!(
            plan[1],
            Scheduled {
                index: 1,
                len: 5,
                wants_logits: false
            }
        );
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_readmits_it_first() {
        // 3 blocks of 4 tokens: two sequences of 4 fill two blocks; growing needs more.
        let mut s = scheduler(64, 4, 3);
        s.add(seq(0, 4));
        s.add(seq(1, 4));
        let plan = s.schedule();
        assert_eq!(plan.len(), 2);
        run(&mut s, &plan);
        // Both now need a second block, only one is free: seq 1 (newest) yields.
        let plan = s.schedule();
        assert_eq!(plan.len(), 1);
        assert_eq!(s.running()[0].id, 0);
        assert_eq!(s.preemptions(), 1);
        run(&mut s, &plan);
        let done = s.finish(0);
        assert_eq!(done.id, 0);
        // The preempted sequence comes back with its generated token, recomputed from 0.
        let plan = s.schedule();
        assert_eq!(s.running()[0].id, 1);
        assert_eq!(plan[0].len, 5);
    }
}
