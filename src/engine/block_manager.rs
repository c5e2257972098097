//! Bookkeeping of the KV cache's blocks, with prefix caching.
//!
//! A full block is named by the hash of its tokens chained with its parent's hash (as vLLM
//! and nano-vllm do), so equal prefixes get equal names. Once computed, a block is
//! registered under its name and any later sequence whose prompt starts the same way takes
//! it instead of recomputing it: the shared rules of hundreds of agents are computed once.
//! Blocks nobody holds stay in the cache and are evicted only when a fresh block is needed,
//! in this order:
//! 1. blocks that hold nothing reusable (never registered, or a private copy of a name
//!    another block carries): evicting them costs nothing;
//! 2. registered blocks no announced caller will use (all of them under [`KvPolicy::Lru`]),
//!    least recently freed first;
//! 3. under [`KvPolicy::NextCall`], registered blocks an announced caller will use (see
//!    [`super::retention`]), the one needed furthest in the future first (Belady's MIN, as
//!    far as the hints go).
//!
//! A sequence lets go of its blocks last to first, so that among blocks freed together the
//! tail of a prompt goes before its head: a prefix is found only up to its first missing
//! block, so evicting the head first would leave the rest cached but unreachable.
//!
//! Blocks a sequence holds are never free, so never evicted. The free blocks sit in one
//! ordered set keyed by eviction priority; each free block remembers its key, so a hint that
//! changes a block's next use moves it in O(log n).

use super::block_hash::BlockHash;
#[cfg(test)]
use super::block_hash::block_hashes;
use super::retention::{KvPolicy, NextUse, Retention};
use std::collections::{BTreeMap, HashMap};

pub(crate) type BlockId = u32;

/// A free block's place in the eviction order: the smallest is evicted first.
/// `(class, order, freed at)`: class 0 holds nothing reusable, 1 has no known next use, 2
/// has one, `order` being `NextUse::MAX - next use` so that the furthest goes first; the
/// time it was freed breaks ties (least recently freed first) and makes every key unique.
type FreeKey = (u8, u64, u64);

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    /// The name it is registered under, while registered.
    hash: Option<BlockHash>,
    /// Its place in the free set, while free.
    free_key: Option<FreeKey>,
}

/// Prefix-cache counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompt tokens looked up at admission.
    pub queried_tokens: u64,
    /// Of which found in the cache.
    pub hit_tokens: u64,
    /// Registered blocks evicted to make room.
    pub evictions: u64,
}

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    /// Free blocks by eviction priority: the first is evicted first.
    free: BTreeMap<FreeKey, BlockId>,
    clock: u64,
    /// Computed blocks by name.
    cached: HashMap<BlockHash, BlockId>,
    caching: bool,
    stats: CacheStats,
    policy: KvPolicy,
    /// The callers announced for this round and the blocks they hold (next-call only).
    retention: Retention,
    /// Names whose next use changed, to move their blocks if free (reused buffer).
    touched: Vec<BlockHash>,
}

impl BlockManager {
    /// A manager with the default policy (tests).
    #[cfg(test)]
    pub fn new(num_blocks: usize, block_size: usize, caching: bool) -> Self {
        Self::with_policy(num_blocks, block_size, caching, KvPolicy::default())
    }

    pub(crate) fn with_policy(
        num_blocks: usize,
        block_size: usize,
        caching: bool,
        policy: KvPolicy,
    ) -> Self {
        let mut m = Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            free: BTreeMap::new(),
            clock: 0,
            cached: HashMap::new(),
            caching,
            stats: CacheStats::default(),
            policy,
            retention: Retention::default(),
            touched: Vec::new(),
        };
        for b in 0..num_blocks as BlockId {
            m.push_free(b);
        }
        m
    }

    /// Where free block `b`, freed at `freed_at`, stands in the eviction order.
    fn free_key(&self, b: BlockId, freed_at: u64) -> FreeKey {
        let Some(hash) = self.blocks[b as usize].hash else {
            return (0, 0, freed_at);
        };
        let next: Option<NextUse> = match self.policy {
            KvPolicy::Lru => None,
            KvPolicy::NextCall => self.retention.next_use(&hash),
        };
        match next {
            None => (1, 0, freed_at),
            Some(at) => (2, NextUse::MAX - at, freed_at),
        }
    }

    fn push_free(&mut self, b: BlockId) {
        self.clock += 1;
        let key = self.free_key(b, self.clock);
        self.free.insert(key, b);
        self.blocks[b as usize].free_key = Some(key);
    }

    /// Moves the free blocks among those named in `touched` to their place in the eviction
    /// order, their next use having changed.
    fn reposition_touched(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        for h in touched.drain(..) {
            let Some(&b) = self.cached.get(&h) else {
                continue;
            };
            let Some(old) = self.blocks[b as usize].free_key else {
                continue;
            };
            let new = self.free_key(b, old.2);
            if new != old {
                self.free.remove(&old);
                self.free.insert(new, b);
                self.blocks[b as usize].free_key = Some(new);
            }
        }
        self.touched = touched;
    }

    /// Whether hints are kept at all: next-call with prefix caching on.
    fn retains(&self) -> bool {
        self.caching && self.policy == KvPolicy::NextCall
    }

    pub fn policy(&self) -> KvPolicy {
        self.policy
    }

    /// Starts a round in which the sequences keyed `keys` will be admitted in this order (see
    /// [`super::retention`]); keys not listed are forgotten. Ignored under [`KvPolicy::Lru`].
    pub fn expect_calls<K: AsRef<str>>(&mut self, keys: impl IntoIterator<Item = K>) {
        if !self.retains() {
            return;
        }
        let cached = &self.cached;
        self.retention
            .begin_round(keys, |h| cached.contains_key(h), &mut self.touched);
        self.reposition_touched();
    }

    /// A sequence keyed `key` is finishing with the full, computed blocks named `hashes`
    /// (its prompt and reply): they are the prefix of the key's next prompt, needed at its
    /// next call. Call it before releasing the sequence's blocks.
    pub(crate) fn retain(&mut self, key: &str, hashes: &[BlockHash]) {
        if !self.retains() {
            return;
        }
        self.retention.served(key, hashes, &mut self.touched);
        self.reposition_touched();
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn caching(&self) -> bool {
        self.caching
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Blocks needed to hold `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// How many leading blocks named by `hashes` are cached and computed.
    pub(crate) fn cached_prefix(&self, hashes: &[BlockHash]) -> usize {
        if !self.caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Blocks for a sequence that needs `total` blocks and whose first `hits` blocks are the
    /// cached blocks named `hashes[..hits]`; `None`, with nothing taken, if they do not fit.
    pub(crate) fn allocate(
        &mut self,
        hashes: &[BlockHash],
        hits: usize,
        total: usize,
    ) -> Option<Vec<BlockId>> {
        let shared: Vec<BlockId> = hashes[..hits].iter().map(|h| self.cached[h]).collect();
        // Cached blocks that sit in the free queue are taken out of it, not counted as free.
        let shared_free = shared
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_count == 0)
            .count();
        let fresh = total - hits;
        if fresh + shared_free > self.free.len() {
            return None;
        }
        for &b in &shared {
            let block = &mut self.blocks[b as usize];
            if let Some(key) = block.free_key.take() {
                self.free.remove(&key);
            }
            block.ref_count += 1;
        }
        let mut blocks = shared;
        for _ in 0..fresh {
            let (_, b) = self.free.pop_first().expect("invariant: counted above");
            let block = &mut self.blocks[b as usize];
            debug_assert_eq!(block.ref_count, 0, "a held block was free");
            block.free_key = None;
            block.ref_count = 1;
            if let Some(old) = block.hash.take() {
                self.cached.remove(&old);
                self.retention.forget(&old);
                self.stats.evictions += 1;
            }
            blocks.push(b);
        }
        Some(blocks)
    }

    /// Counts an admission's lookup in the hit rate.
    pub(crate) fn record_lookup(&mut self, prompt_tokens: usize, hit_tokens: usize) {
        self.stats.queried_tokens += prompt_tokens as u64;
        self.stats.hit_tokens += hit_tokens as u64;
    }

    /// Registers computed block `b` under `hash` so that later sequences can share it. A
    /// name already registered (another sequence computed the same content meanwhile) keeps
    /// its block; `b` then stays private and is freed as usual.
    pub(crate) fn register(&mut self, b: BlockId, hash: BlockHash) {
        if !self.caching
            || self.blocks[b as usize].hash.is_some()
            || self.cached.contains_key(&hash)
        {
            return;
        }
        self.cached.insert(hash, b);
        self.blocks[b as usize].hash = Some(hash);
    }

    /// Lets go of `blocks` (a block table, first block first); those nobody holds any more
    /// become free, registered ones staying findable until evicted. Freed last to first, so
    /// that of one table the tail is evicted before the head.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            let count = &mut self.blocks[b as usize].ref_count;
            debug_assert!(*count > 0, "releasing free block {b}");
            *count -= 1;
            if *count == 0 {
                self.push_free(b);
            }
        }
    }
}

#[cfg(test)]
impl BlockManager {
    /// Checks the free set against the blocks: exactly the blocks nobody holds are free, each
    /// at the place its name's current next use gives it; names map to their blocks.
    pub(super) fn check_consistency(&self) {
        let unheld = self.blocks.iter().filter(|b| b.ref_count == 0).count();
        assert_eq!(self.free.len(), unheld, "free count");
        for (key, &b) in &self.free {
            let block = &self.blocks[b as usize];
            assert_eq!(block.ref_count, 0, "block {b} is held yet free");
            assert_eq!(block.free_key, Some(*key));
            assert_eq!(*key, self.free_key(b, key.2), "block {b} is out of place");
        }
        for (i, block) in self.blocks.iter().enumerate() {
            assert_eq!(block.free_key.is_some(), block.ref_count == 0, "block {i}");
        }
        for (h, &b) in &self.cached {
            assert_eq!(self.blocks[b as usize].hash, Some(*h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4;

    #[test]
    fn equal_prefixes_have_equal_names_and_different_ones_differ() {
        let a = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], BS);
        let b = block_hashes(&[1, 2, 3, 4, 5, 6, 7, 0], BS);
        assert_eq!(a.len(), 2, "only full blocks are named");
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
        // The same block content after a different parent has a different name.
        let c = block_hashes(&[9, 9, 9, 9, 5, 6, 7, 8], BS);
        assert_ne!(a[1], c[1]);
    }

    #[test]
    fn a_registered_prefix_is_shared_and_survives_its_first_holder() {
        let mut m = BlockManager::new(6, BS, true);
        let tokens: Vec<u32> = (0..10).collect();
        let hashes = block_hashes(&tokens, BS);
        let first = m.allocate(&hashes, 0, 3).unwrap();
        m.register(first[0], hashes[0]);
        m.register(first[1], hashes[1]);
        m.release(&first);
        assert_eq!(m.num_free(), 6);
        assert_eq!(m.cached_prefix(&hashes), 2);
        let second = m.allocate(&hashes, 2, 3).unwrap();
        assert_eq!(&second[..2], &first[..2], "the cached blocks are reused");
        assert_eq!(m.num_free(), 3);
    }

    #[test]
    fn cached_blocks_are_evicted_least_recently_freed_first() {
        let mut m = BlockManager::new(2, BS, true);
        let (ha, hb) = (block_hashes(&[1; 4], BS), block_hashes(&[2; 4], BS));
        let a = m.allocate(&ha, 0, 1).unwrap();
        m.register(a[0], ha[0]);
        let b = m.allocate(&hb, 0, 1).unwrap();
        m.register(b[0], hb[0]);
        m.release(&a);
        m.release(&b);
        // One fresh block: a (freed first) goes, b stays.
        m.allocate(&[], 0, 1).unwrap();
        assert_eq!(m.cached_prefix(&ha), 0);
        assert_eq!(m.cached_prefix(&hb), 1);
        assert_eq!(m.stats().evictions, 1);
    }

    #[test]
    fn a_failed_allocation_takes_nothing_and_caching_can_be_off() {
        let mut m = BlockManager::new(3, BS, false);
        let h = block_hashes(&[1; 8], BS);
        let a = m.allocate(&h, 0, 2).unwrap();
        m.register(a[0], h[0]);
        assert_eq!(m.cached_prefix(&h), 0, "nothing is cached with caching off");
        assert!(m.allocate(&[], 0, 2).is_none());
        assert_eq!(m.num_free(), 1);
    }
}

#[cfg(test)]
mod retention_tests {
    //! Eviction under each policy, for simulations' calls: every caller once per round, in the
    //! same order, each prompt the shared rules and the caller's own history.

    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;

    const BS: usize = 4;

    fn key(caller: usize) -> String {
        format!("agent {caller}")
    }

    /// Caller `c`'s prompt: a block of rules everyone shares, then a block of its own.
    fn prompt(c: usize) -> Vec<BlockHash> {
        let mut tokens = vec![7; BS];
        tokens.extend(std::iter::repeat_n(100 + c as u32, BS));
        block_hashes(&tokens, BS)
    }

    /// One call of caller `c`: its prompt's blocks (cached ones reused) and one more for the
    /// reply, registered, retained under its key, let go. Whether its own block was cached.
    fn call(m: &mut BlockManager, c: usize) -> bool {
        let hashes = prompt(c);
        let hits = m.cached_prefix(&hashes);
        let blocks = m.allocate(&hashes, hits, hashes.len() + 1).unwrap();
        for (b, h) in blocks.iter().zip(&hashes) {
            m.register(*b, *h);
        }
        m.retain(&key(c), &hashes);
        m.release(&blocks);
        hits == hashes.len()
    }

    /// Runs `rounds` rounds of `callers` callers; own-block hits per round, and which callers'
    /// blocks are cached at the end.
    fn rounds(policy: KvPolicy, callers: usize, rounds: usize) -> (Vec<usize>, BTreeSet<usize>) {
        // While one caller runs it holds 3 blocks (rules, own, reply); 3 more hold 3 other
        // callers' own blocks.
        let mut m = BlockManager::with_policy(6, BS, true, policy);
        let mut hits = Vec::new();
        for _ in 0..rounds {
            m.expect_calls((0..callers).map(key));
            hits.push((0..callers).filter(|&c| call(&mut m, c)).count());
            m.check_consistency();
        }
        let kept = (0..callers)
            .filter(|&c| m.cached_prefix(&prompt(c)) == 2)
            .collect();
        (hits, kept)
    }

    /// Belady's MIN on the same calls, with room for `room` callers' own blocks: on a miss
    /// with no room, evict the one called again furthest in the future.
    fn min_hits(callers: usize, rounds: usize, room: usize) -> (Vec<usize>, BTreeSet<usize>) {
        // One round more than is run, so that the last round's evictions see the next one.
        let trace: Vec<usize> = (0..=rounds).flat_map(|_| 0..callers).collect();
        let mut cache = BTreeSet::new();
        let mut hits = vec![0; rounds];
        for (t, &c) in trace.iter().enumerate().take(rounds * callers) {
            if cache.contains(&c) {
                hits[t / callers] += 1;
                continue;
            }
            if cache.len() == room {
                let next = |x: usize| trace[t + 1..].iter().position(|&y| y == x);
                let victim = *cache.iter().max_by_key(|&&x| next(x)).unwrap();
                cache.remove(&victim);
            }
            cache.insert(c);
        }
        (hits, cache)
    }

    #[test]
    fn next_call_keeps_the_callers_called_soonest_and_lru_thrashes() {
        let (callers, n) = (8, 5);
        // LRU keeps the callers freed last, who are the ones called last in the next round:
        // each is evicted just before it is called. Not one hit after the cold round.
        let (lru, lru_kept) = rounds(KvPolicy::Lru, callers, n);
        assert_eq!(lru, vec![0; n]);
        assert_eq!(lru_kept, BTreeSet::from([4, 5, 6, 7]));

        // Next-call evicts the caller called again furthest in the future: exactly Belady's
        // MIN, since the hints are the future. Between calls the cache holds four callers'
        // own blocks: three beside the running caller's, and its own.
        let (next, next_kept) = rounds(KvPolicy::NextCall, callers, n);
        let (min, min_kept) = min_hits(callers, n, 4);
        assert_eq!(next, min);
        assert_eq!(next_kept, min_kept);
        assert_eq!(next[0], 0, "the first round is cold");
        // Room for 4 of 8 callers: 3 or 4 hits a round (4, 4, 4, 3 here).
        assert!(next[1..].iter().all(|&h| h >= 3), "{next:?}");
    }

    #[test]
    fn without_hints_next_call_is_lru() {
        let mut m = BlockManager::with_policy(6, BS, true, KvPolicy::NextCall);
        let mut hits = 0;
        for _ in 0..4 {
            hits += (0..8).filter(|&c| call(&mut m, c)).count();
        }
        assert_eq!(hits, 0);
        // Hints for other keys change nothing either.
        m.expect_calls(["someone else"]);
        assert_eq!((0..8).filter(|&c| call(&mut m, c)).count(), 0);
    }

    #[test]
    fn blocks_that_hold_nothing_reusable_go_before_cached_ones() {
        for policy in KvPolicy::ALL {
            let mut m = BlockManager::with_policy(3, BS, true, policy);
            let h = block_hashes(&[1; 4], BS);
            let a = m.allocate(&h, 0, 1).unwrap();
            m.register(a[0], h[0]);
            m.release(&a);
            // The two never-registered blocks were freed before it, yet go first.
            m.allocate(&[], 0, 2).unwrap();
            assert_eq!(m.cached_prefix(&h), 1, "{policy:?}");
            assert_eq!(m.stats().evictions, 0);
        }
    }

    #[test]
    fn a_released_table_is_evicted_tail_first() {
        for policy in KvPolicy::ALL {
            let mut m = BlockManager::with_policy(3, BS, true, policy);
            let h = block_hashes(&[1; 12], BS);
            let a = m.allocate(&h, 0, 3).unwrap();
            for i in 0..3 {
                m.register(a[i], h[i]);
            }
            m.release(&a);
            m.allocate(&[], 0, 1).unwrap();
            // The first two blocks are still a usable prefix.
            assert_eq!(m.cached_prefix(&h), 2, "{policy:?}");
        }
    }

    #[test]
    fn a_hint_moves_free_blocks_and_unlisted_callers_are_forgotten() {
        let mut m = BlockManager::with_policy(4, BS, true, KvPolicy::NextCall);
        m.expect_calls(["a", "b"]);
        let (ha, hb) = (block_hashes(&[1; 4], BS), block_hashes(&[2; 4], BS));
        for (k, h) in [("a", &ha), ("b", &hb)] {
            let x = m.allocate(h, 0, 1).unwrap();
            m.register(x[0], h[0]);
            m.retain(k, h);
            m.release(&x);
        }
        // Next round b is called first: a is needed later, so a goes.
        m.expect_calls(["b", "a"]);
        m.check_consistency();
        m.allocate(&[], 0, 3).unwrap();
        assert_eq!((m.cached_prefix(&ha), m.cached_prefix(&hb)), (0, 1));
    }

    /// Random admissions, growth, finishes and hints: a block that a live sequence holds is
    /// never handed out again, and the free set is always exactly the unheld blocks, in the
    /// order their current hints give.
    #[test]
    fn a_block_a_running_sequence_holds_is_never_evicted() {
        for policy in KvPolicy::ALL {
            for seed in 0..20 {
                random_run(policy, seed);
            }
        }
    }

    struct Live {
        key: String,
        hashes: Vec<BlockHash>,
        blocks: Vec<BlockId>,
        registered: usize,
    }

    fn random_run(policy: KvPolicy, seed: u64) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let num_blocks = 24;
        let mut m = BlockManager::with_policy(num_blocks, BS, true, policy);
        let mut live: Vec<Live> = Vec::new();
        let held = |live: &[Live]| {
            let mut count = vec![0u32; num_blocks];
            for s in live {
                for &b in &s.blocks {
                    count[b as usize] += 1;
                }
            }
            count
        };
        for _ in 0..400 {
            match rng.random_range(0..10) {
                0 => {
                    let mut keys: Vec<String> = (0..rng.random_range(0..10))
                        .map(|_| format!("k{}", rng.random_range(0..12)))
                        .collect();
                    keys.dedup();
                    m.expect_calls(&keys);
                }
                1..=4 => {
                    // A prompt: shared rules, then 0 to 4 blocks of the caller's own.
                    let caller = rng.random_range(0..12u32);
                    let mut tokens = vec![9; BS * rng.random_range(0..3)];
                    for i in 0..rng.random_range(0..5) {
                        tokens.extend(std::iter::repeat_n(caller * 16 + i, BS));
                    }
                    tokens.push(1);
                    let hashes = block_hashes(&tokens, BS);
                    let hits = m.cached_prefix(&hashes);
                    let total = tokens.len().div_ceil(BS);
                    let before = held(&live);
                    if let Some(blocks) = m.allocate(&hashes, hits, total) {
                        for &b in &blocks[hits..] {
                            assert_eq!(before[b as usize], 0, "block {b} handed out twice");
                        }
                        let registered = rng.random_range(hits..=hashes.len());
                        for i in hits..registered {
                            m.register(blocks[i], hashes[i]);
                        }
                        live.push(Live {
                            key: format!("k{caller}"),
                            hashes,
                            blocks,
                            registered,
                        });
                    }
                }
                5 if !live.is_empty() => {
                    // A running sequence grows by a block.
                    let i = rng.random_range(0..live.len());
                    let before = held(&live);
                    if let Some(more) = m.allocate(&[], 0, 1) {
                        assert_eq!(before[more[0] as usize], 0, "block handed out twice");
                        live[i].blocks.extend(more);
                    }
                }
                _ if !live.is_empty() => {
                    let s = live.swap_remove(rng.random_range(0..live.len()));
                    m.retain(&s.key, &s.hashes[..s.registered]);
                    m.release(&s.blocks);
                }
                _ => {}
            }
            let count = held(&live);
            for (b, block) in m.blocks.iter().enumerate() {
                assert_eq!(block.ref_count, count[b], "block {b}'s holders");
            }
            m.check_consistency();
        }
    }
}
