//! Continuous batching: every step, decide which sequences advance by how many tokens.
//!
//! Running sequences go first, oldest first, each taking as many of its pending tokens as the
//! step's token budget allows (a long prompt is split into chunks over several steps). What
//! budget is left admits waiting sequences in arrival order, each starting after the longest
//! prefix of its prompt already in the prefix cache.
//!
//! Admission is cache-aware: a request whose next uncached block is being computed right now
//! by a running sequence (the shared system prompt of a wave of agents) waits for it, then
//! joins with the prefix cached, instead of computing its own copy in the same step. Requests
//! behind it that share nothing are admitted meanwhile, so nobody starves; a request that
//! does not fit in memory stops admission, so nobody is overtaken forever.
//!
//! A sequence that needs a block when none is free takes it from the newest running
//! sequence, which is preempted: its blocks are freed and it goes back to the head of the
//! queue to be recomputed later (mostly from the prefix cache), its tokens, sampler and
//! grammar state kept so that its output does not change.

use super::block_hash::{BlockHash, extend_hashes};
use super::block_manager::BlockManager;
use super::sequence::{SeqId, Sequence};
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone, Copy)]
pub(crate) struct SchedulerConfig {
    /// Tokens one forward pass may process.
    pub max_batch_tokens: usize,
    /// Sequences that may be running at once.
    pub max_seqs: usize,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scheduled {
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
    /// Blocks announced by running sequences and not computed yet, with how many announced.
    in_flight: HashMap<BlockHash, u32>,
    preemptions: u64,
}

impl Scheduler {
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        Self {
            cfg,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: HashMap::new(),
            preemptions: 0,
        }
    }

    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    pub(crate) fn running_mut(&mut self) -> &mut [Sequence] {
        &mut self.running
    }

    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
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
            plan.push(self.scheduled(i, len));
            budget -= len;
            i += 1;
        }
        let mut w = 0;
        while budget > 0 && self.running.len() < self.cfg.max_seqs && w < self.waiting.len() {
            match self.try_admit(w) {
                Admission::Admitted => {
                    let index = self.running.len() - 1;
                    let len = self.running[index].pending().min(budget);
                    plan.push(self.scheduled(index, len));
                    budget -= len;
                }
                Admission::Deferred => w += 1,
                Admission::NoRoom => break,
            }
        }
        plan
    }

    fn scheduled(&mut self, index: usize, len: usize) -> Scheduled {
        let seq = &mut self.running[index];
        seq.first_scheduled
            .get_or_insert_with(std::time::Instant::now);
        Scheduled {
            index,
            len,
            wants_logits: seq.computed + len == seq.tokens.len(),
        }
    }

    /// Moves waiting sequence `w` to the running ones if its blocks fit, starting it after
    /// its cached prefix.
    fn try_admit(&mut self, w: usize) -> Admission {
        let bs = self.blocks.block_size();
        let seq = &mut self.waiting[w];
        extend_hashes(&mut seq.hashes, &seq.tokens, bs);
        // At least one token is always computed, for the logits of the first sample.
        let hits = self
            .blocks
            .cached_prefix(&seq.hashes)
            .min((seq.tokens.len() - 1) / bs);
        if seq
            .hashes
            .get(hits)
            .is_some_and(|h| self.in_flight.contains_key(h))
        {
            return Admission::Deferred;
        }
        let total = self.blocks.blocks_for(seq.tokens.len());
        let Some(blocks) = self.blocks.allocate(&seq.hashes, hits, total) else {
            return Admission::NoRoom;
        };
        let mut seq = self.waiting.remove(w).expect("invariant: index in range");
        seq.blocks = blocks;
        seq.computed = hits * bs;
        seq.registered = hits;
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(hits * bs);
            self.blocks.record_lookup(seq.tokens.len(), hits * bs);
        }
        if self.blocks.caching() {
            seq.in_flight_until = seq.hashes.len();
            for h in &seq.hashes[hits..] {
                *self.in_flight.entry(*h).or_default() += 1;
            }
        }
        self.running.push(seq);
        Admission::Admitted
    }

    /// Gives running sequence `i` the blocks for `len` more tokens, preempting the newest
    /// sequences while none are free. False when `i` had to preempt itself.
    fn grow(&mut self, i: usize, len: usize) -> bool {
        let seq = &self.running[i];
        let needed = self
            .blocks
            .blocks_for(seq.computed + len)
            .saturating_sub(seq.blocks.len());
        while self.blocks.num_free() < needed {
            let victim = self.running.len() - 1;
            self.preempt(victim);
            if victim == i {
                return false;
            }
        }
        let new = self
            .blocks
            .allocate(&[], 0, needed)
            .expect("invariant: enough free blocks");
        self.running[i].blocks.extend(new);
        true
    }

    fn preempt(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.withdraw(&mut seq);
        self.blocks.release(&seq.blocks);
        seq.blocks.clear();
        seq.computed = 0;
        seq.registered = 0;
        self.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Takes back the in-flight announcements of `seq` it has not fulfilled.
    fn withdraw(&mut self, seq: &mut Sequence) {
        for h in &seq.hashes[seq.registered.min(seq.in_flight_until)..seq.in_flight_until] {
            if let Some(count) = self.in_flight.get_mut(h) {
                *count -= 1;
                if *count == 0 {
                    self.in_flight.remove(h);
                }
            }
        }
        seq.in_flight_until = 0;
    }

    /// Registers the blocks that running sequences have filled since the last call, making
    /// them available to every later request with the same prefix.
    pub(crate) fn register_computed(&mut self) {
        let bs = self.blocks.block_size();
        for seq in &mut self.running {
            extend_hashes(&mut seq.hashes, &seq.tokens, bs);
            let full = (seq.computed / bs).min(seq.hashes.len());
            for b in seq.registered..full {
                self.blocks.register(seq.blocks[b], seq.hashes[b]);
                if b < seq.in_flight_until
                    && let Some(count) = self.in_flight.get_mut(&seq.hashes[b])
                {
                    *count -= 1;
                    if *count == 0 {
                        self.in_flight.remove(&seq.hashes[b]);
                    }
                }
            }
            seq.registered = seq.registered.max(full);
        }
    }

    /// Removes running sequence `index`, freeing its blocks (registered ones stay cached,
    /// and with a retention key are kept for the key's next call).
    pub fn finish(&mut self, index: usize) -> Sequence {
        let mut seq = self.running.remove(index);
        if let Some(key) = &seq.retention_key {
            let full = seq.registered.min(seq.hashes.len());
            self.blocks.retain(key, &seq.hashes[..full]);
        }
        self.let_go(&mut seq);
        seq
    }

    /// Takes sequence `id` out, waiting or running; `None` if it is neither. A running one
    /// frees its blocks as [`Scheduler::finish`] does, registered ones staying cached like
    /// any finished sequence's, but none is retained for its key: its caller gave up on the
    /// reply, so it says nothing of the key's next call. Its announcements are withdrawn, so
    /// requests waiting for a block it was computing are admitted and compute it themselves.
    pub fn cancel(&mut self, id: SeqId) -> Option<Sequence> {
        if let Some(w) = self.waiting.iter().position(|s| s.id == id) {
            // A waiting sequence holds no blocks: it never ran, or preemption freed them.
            return self.waiting.remove(w);
        }
        let index = self.running.iter().position(|s| s.id == id)?;
        let mut seq = self.running.remove(index);
        self.let_go(&mut seq);
        Some(seq)
    }

    /// Withdraws the announcements of `seq`, which has left the running ones, and releases
    /// its blocks.
    fn let_go(&mut self, seq: &mut Sequence) {
        self.withdraw(seq);
        self.blocks.release(&seq.blocks);
        seq.blocks.clear();
    }

    /// Takes every sequence out (running and waiting), freeing all blocks.
    pub fn drain(&mut self) -> Vec<Sequence> {
        let mut out = Vec::new();
        while !self.running.is_empty() {
            out.push(self.finish(self.running.len() - 1));
        }
        out.extend(self.waiting.drain(..));
        out
    }
}

enum Admission {
    /// Now the last running sequence.
    Admitted,
    /// Its next block is being computed by a running sequence: wait for it.
    Deferred,
    /// Not enough free blocks.
    NoRoom,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::{Sampler, SamplingParams};

    fn seq(id: u64, prompt: Vec<u32>) -> Sequence {
        Sequence::new(id, prompt, Sampler::new(SamplingParams::greedy()), 8)
    }

    fn scheduler(tokens: usize, seqs: usize, blocks: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_batch_tokens: tokens,
                max_seqs: seqs,
            },
            BlockManager::new(blocks, 4, true),
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
        s.register_computed();
    }

    #[test]
    fn long_prompts_are_chunked_under_the_token_budget() {
        let mut s = scheduler(8, 4, 16);
        s.add(seq(0, vec![1; 20]));
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
        s.add(seq(0, vec![1; 3]));
        let plan = s.schedule();
        run(&mut s, &plan);
        s.add(seq(1, vec![3; 10]));
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
        s.add(seq(0, vec![1; 4]));
        s.add(seq(1, vec![5; 4]));
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
        // The preempted sequence comes back, its first block found in the prefix cache.
        let plan = s.schedule();
        assert_eq!(s.running()[0].id, 1);
        assert_eq!(plan[0].len, 1, "4 of its 5 tokens are cached");
    }

    #[test]
    fn a_cancelled_sequence_frees_its_blocks() {
        let shared: Vec<u32> = (100..112).collect(); // 3 blocks
        let mut s = scheduler(16, 8, 32);
        let free = s.blocks.num_free();
        s.add(seq(2, vec![7; 5]));
        s.add(seq(0, [shared.clone(), vec![1; 8]].concat()));
        s.add(seq(1, [shared.clone(), vec![2; 3]].concat()));
        // 2 decodes; 0 has computed 11 of its 20 tokens, announcing the rest of the shared
        // prefix; 1 waits for it.
        let plan = s.schedule();
        run(&mut s, &plan);
        assert_eq!(s.running().len(), 2);
        assert_eq!(s.num_waiting(), 1);
        assert!(!s.in_flight.is_empty());

        let cancelled = s.cancel(0).expect("sequence 0 is running");
        assert!(cancelled.blocks.is_empty());
        assert!(s.in_flight.is_empty(), "{:?}", s.in_flight);
        assert!(s.cancel(0).is_none(), "nothing is cancelled twice");
        // The sibling no longer waits, and finds the blocks 0 computed in the prefix cache.
        let plan = s.schedule();
        let admitted = s.running().iter().find(|q| q.id == 1);
        assert_eq!(admitted.and_then(|q| q.cached_tokens), Some(8));
        run(&mut s, &plan);

        s.add(seq(3, vec![9; 6]));
        assert!(s.cancel(3).is_some(), "a waiting sequence is cancelled too");
        assert!(s.cancel(1).is_some() && s.cancel(2).is_some());
        assert!(s.is_idle());
        assert_eq!(s.blocks.num_free(), free);
        s.blocks.check_consistency();
    }

    #[test]
    fn requests_sharing_a_prefix_wait_for_it_and_then_join_together() {
        let shared: Vec<u32> = (100..112).collect(); // 3 blocks
        let prompt = |tail: u32| [shared.clone(), vec![tail; 3]].concat();
        let mut s = scheduler(8, 8, 32);
        for i in 0..3 {
            s.add(seq(i, prompt(i as u32)));
        }
        s.add(seq(9, vec![7; 5])); // shares nothing
        // Step 1: the first request starts on the prefix; its siblings wait; the unrelated
        // request is not held back by them.
        let plan = s.schedule();
        let ids: Vec<u64> = plan.iter().map(|p| s.running()[p.index].id).collect();
        assert_eq!(ids, vec![0]);
        assert_eq!(s.num_waiting(), 3);
        run(&mut s, &plan);
        let plan = s.schedule();
        run(&mut s, &plan);
        // Once the prefix is computed, the siblings join with 12 tokens cached each.
        let mut cached = Vec::new();
        for _ in 0..4 {
            let plan = s.schedule();
            run(&mut s, &plan);
            cached = s
                .running()
                .iter()
                .filter(|q| q.id != 0 && q.id != 9)
                .map(|q| q.cached_tokens)
                .collect();
            if cached.len() == 2 {
                break;
            }
        }
        assert_eq!(cached, vec![Some(12), Some(12)]);
        assert!(s.running().iter().any(|q| q.id == 9));
    }
}
