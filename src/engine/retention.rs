//! When each cached KV block will be needed next, as far as the engine's caller has said.
//!
//! A simulation calls its agents round after round, in the same order, each prompt extending
//! the agent's previous prompt and reply. Least-recently-freed eviction is the worst policy
//! for that cyclic pattern: the agent served longest ago is the very next one to be called,
//! so with room for a quarter of the agents LRU evicts every agent's history just before it
//! is needed. Belady's MIN (evict what is needed furthest in the future) keeps about a
//! quarter. The engine cannot know the future, but the caller can tell it: requests carry an
//! opaque *retention key* (an agent's history key, say), and at the start of each round the
//! caller lists the keys it will call, in order ([`crate::engine::Engine::expect_calls`]).
//!
//! When a keyed sequence finishes, its key holds the full blocks of its prompt and reply: the
//! prefix of its next prompt. A key's next use is
//! - `(this round, its rank)` while it has not been served this round;
//! - `(next round, its rank)` once it has: rounds of a synchronous simulation call in the same
//!   order, and a key's next call is the only thing a retained block is kept for;
//! - unknown for a key not listed in the current round: a new round forgets the keys it does
//!   not list, so what is tracked never outgrows one round's callers.
//!
//! A block's next use is the soonest of its holders' (the rules every agent shares are held
//! by every key, so they are needed at the next call of anyone); a block no key holds has no
//! known next use. Only hints are involved: a wrong one costs hits, never correctness.

use super::block_hash::BlockHash;
use std::collections::{BTreeSet, HashMap};

/// Which free cached blocks are evicted first when a fresh block is needed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvPolicy {
    /// Least recently freed first, whatever the caller says.
    Lru,
    /// Blocks no announced caller will use first (least recently freed first), then those
    /// whose next use ([`crate::engine::Engine::expect_calls`]) is furthest away. Without
    /// hints it is [`KvPolicy::Lru`].
    #[default]
    NextCall,
}

impl KvPolicy {
    pub const ALL: [KvPolicy; 2] = [KvPolicy::Lru, KvPolicy::NextCall];

    /// The command line's and the reports' name.
    pub fn name(self) -> &'static str {
        match self {
            KvPolicy::Lru => "lru",
            KvPolicy::NextCall => "next-call",
        }
    }
}

/// When a block is next needed: `round << 32 | rank`, smaller is sooner.
pub(crate) type NextUse = u64;

fn next_use(round: u64, rank: u32) -> NextUse {
    (round << 32) | rank as u64
}

/// A key of the current round.
#[derive(Debug)]
struct Caller {
    /// Its place in the round's order (its first, if listed twice).
    rank: u32,
    /// Whether a sequence of it finished this round.
    served: bool,
    /// Names of the blocks of its last finished sequence; some may have been evicted since.
    holds: Vec<BlockHash>,
}

/// The announced callers of the current round and the blocks they hold.
#[derive(Debug, Default)]
pub(crate) struct Retention {
    round: u64,
    /// The current round's keys, each naming its index in `callers`.
    ids: HashMap<String, u32>,
    callers: Vec<Caller>,
    /// For every block name some caller holds: its holders by next use, the soonest first.
    holders: HashMap<BlockHash, BTreeSet<(NextUse, u32)>>,
}

impl Retention {
    /// When the block named `hash` is next needed, if any caller holds it.
    pub(crate) fn next_use(&self, hash: &BlockHash) -> Option<NextUse> {
        self.holders
            .get(hash)
            .and_then(|h| h.first())
            .map(|&(at, _)| at)
    }

    fn caller_next_use(&self, id: u32) -> NextUse {
        let c = &self.callers[id as usize];
        next_use(self.round + c.served as u64, c.rank)
    }

    /// Starts a round in which `keys` will be called in this order. Callers it does not list
    /// are forgotten; those it lists keep the blocks they held, found cached by `is_cached`.
    /// Every name whose next use may have changed is pushed to `touched`.
    pub(crate) fn begin_round<K: AsRef<str>>(
        &mut self,
        keys: impl IntoIterator<Item = K>,
        is_cached: impl Fn(&BlockHash) -> bool,
        touched: &mut Vec<BlockHash>,
    ) {
        touched.extend(self.holders.drain().map(|(h, _)| h));
        let mut old_ids = std::mem::take(&mut self.ids);
        let mut old = std::mem::take(&mut self.callers);
        self.round += 1;
        for (rank, key) in keys.into_iter().enumerate() {
            let key = key.as_ref();
            if self.ids.contains_key(key) {
                continue;
            }
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            let mut holds = old_ids
                .remove(key)
                .map(|i| std::mem::take(&mut old[i as usize].holds))
                .unwrap_or_default();
            holds.retain(|h| is_cached(h));
            let id = self.callers.len() as u32;
            self.ids.insert(key.to_string(), id);
            self.callers.push(Caller {
                rank,
                served: false,
                holds,
            });
            let at = self.caller_next_use(id);
            for h in &self.callers[id as usize].holds {
                self.holders.entry(*h).or_default().insert((at, id));
            }
        }
    }

    /// A sequence of `key` finished holding the blocks named `hashes`: they replace what the
    /// key held, and the key's next call is in the next round. A key the round does not list
    /// is ignored. Every name whose next use may have changed is pushed to `touched`.
    pub fn served(&mut self, key: &str, hashes: &[BlockHash], touched: &mut Vec<BlockHash>) {
        let Some(&id) = self.ids.get(key) else {
            return;
        };
        let before = self.caller_next_use(id);
        let caller = &mut self.callers[id as usize];
        for h in std::mem::take(&mut caller.holds) {
            if let Some(set) = self.holders.get_mut(&h) {
                set.remove(&(before, id));
                if set.is_empty() {
                    self.holders.remove(&h);
                }
            }
            touched.push(h);
        }
        caller.served = true;
        caller.holds = hashes.to_vec();
        let at = self.caller_next_use(id);
        for h in hashes {
            self.holders.entry(*h).or_default().insert((at, id));
            touched.push(*h);
        }
    }

    /// The block named `hash` was evicted: nobody holds it any more. (Callers' lists keep the
    /// name until the next round prunes it.)
    pub(crate) fn forget(&mut self, hash: &BlockHash) {
        self.holders.remove(hash);
    }

    /// Callers of the current round.
    #[cfg(test)]
    pub(crate) fn num_callers(&self) -> usize {
        self.callers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_next_needed_at_its_rank_this_round_then_at_its_rank_next_round() {
        let mut r = Retention::default();
        let mut touched = Vec::new();
        r.begin_round(["a", "b", "c"], |_| true, &mut touched);
        r.served("b", &[10, 11], &mut touched);
        r.served("a", &[10, 12], &mut touched);
        // Block 10 is held by both: needed at the sooner of their next calls.
        let round = r.round;
        assert_eq!(r.next_use(&10), Some(next_use(round + 1, 0)));
        assert_eq!(r.next_use(&11), Some(next_use(round + 1, 1)));
        assert_eq!(r.next_use(&99), None);

        // A new round in another order: nobody has been served yet.
        r.begin_round(["c", "b"], |h| *h != 11, &mut touched);
        assert_eq!(r.next_use(&10), Some(next_use(round + 1, 1)), "b holds it");
        assert_eq!(r.next_use(&12), None, "a is not called: forgotten");
        assert_eq!(r.next_use(&11), None, "evicted names are pruned");
        assert_eq!(r.num_callers(), 2);

        // An unannounced key changes nothing; an evicted name is held by nobody.
        r.served("z", &[10], &mut touched);
        assert_eq!(r.next_use(&10), Some(next_use(round + 1, 1)));
        r.forget(&10);
        assert_eq!(r.next_use(&10), None);
    }
}
