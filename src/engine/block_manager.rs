//! Bookkeeping of the KV cache's blocks, with prefix caching.
//!
//! A full block is named by the hash of its tokens chained with its parent's hash (as vLLM
//! and nano-vllm do), so equal prefixes get equal names. Once computed, a block is
//! registered under its name and any later sequence whose prompt starts the same way takes
//! it instead of recomputing it: the shared rules of hundreds of agents are computed once.
//! Blocks nobody holds stay in the cache, in least-recently-freed order, and are evicted
//! only when a fresh block is needed.

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};

pub type BlockId = u32;

/// A block's content name: 128 bits of SHA-256 over (parent name, tokens), so that two
/// different prefixes never share a name in practice.
pub type BlockHash = u128;

/// The names of the full blocks of `tokens`, in order.
#[cfg(test)]
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut hashes = Vec::new();
    extend_hashes(&mut hashes, tokens, block_size);
    hashes
}

/// Appends to `hashes` the names of the full blocks of `tokens` it does not have yet.
pub fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let mut h = Sha256::new();
        h.update(hashes.last().copied().unwrap_or(0).to_le_bytes());
        for t in &tokens[i * block_size..(i + 1) * block_size] {
            h.update(t.to_le_bytes());
        }
        let digest = h.finalize();
        hashes.push(u128::from_le_bytes(
            digest[..16].try_into().expect("invariant: 32-byte digest"),
        ));
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    /// The name it is registered under, while registered.
    hash: Option<BlockHash>,
    /// Its place in the free queue, while free.
    freed_at: Option<u64>,
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
    /// Free blocks by the time they were freed: the first is evicted first.
    free: BTreeMap<u64, BlockId>,
    clock: u64,
    /// Computed blocks by name.
    cached: HashMap<BlockHash, BlockId>,
    caching: bool,
    stats: CacheStats,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, caching: bool) -> Self {
        let mut m = Self {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            free: BTreeMap::new(),
            clock: 0,
            cached: HashMap::new(),
            caching,
            stats: CacheStats::default(),
        };
        for b in 0..num_blocks as BlockId {
            m.push_free(b);
        }
        m
    }

    fn push_free(&mut self, b: BlockId) {
        self.clock += 1;
        self.free.insert(self.clock, b);
        self.blocks[b as usize].freed_at = Some(self.clock);
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn caching(&self) -> bool {
        self.caching
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// How many leading blocks named by `hashes` are cached and computed.
    pub fn cached_prefix(&self, hashes: &[BlockHash]) -> usize {
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
    pub fn allocate(
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
            if let Some(at) = block.freed_at.take() {
                self.free.remove(&at);
            }
            block.ref_count += 1;
        }
        let mut blocks = shared;
        for _ in 0..fresh {
            let (_, b) = self.free.pop_first().expect("invariant: counted above");
            let block = &mut self.blocks[b as usize];
            block.freed_at = None;
            block.ref_count = 1;
            if let Some(old) = block.hash.take() {
                self.cached.remove(&old);
                self.stats.evictions += 1;
            }
            blocks.push(b);
        }
        Some(blocks)
    }

    /// Counts an admission's lookup in the hit rate.
    pub fn record_lookup(&mut self, prompt_tokens: usize, hit_tokens: usize) {
        self.stats.queried_tokens += prompt_tokens as u64;
        self.stats.hit_tokens += hit_tokens as u64;
    }

    /// Registers computed block `b` under `hash` so that later sequences can share it. A
    /// name already registered (another sequence computed the same content meanwhile) keeps
    /// its block; `b` then stays private and is freed as usual.
    pub fn register(&mut self, b: BlockId, hash: BlockHash) {
        if !self.caching
            || self.blocks[b as usize].hash.is_some()
            || self.cached.contains_key(&hash)
        {
            return;
        }
        self.cached.insert(hash, b);
        self.blocks[b as usize].hash = Some(hash);
    }

    /// Lets go of `blocks`; those nobody holds any more become free, registered ones staying
    /// findable until evicted.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
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
