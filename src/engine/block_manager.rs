//! Bookkeeping of the KV cache's blocks: which are free, and how many sequences hold each.
//! A block held by several sequences (a shared prefix) is freed when the last one lets go.

use std::collections::VecDeque;

pub type BlockId = u32;

#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    ref_counts: Vec<u32>,
    free: VecDeque<BlockId>,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            ref_counts: vec![0; num_blocks],
            free: (0..num_blocks as BlockId).collect(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    pub fn can_allocate(&self, n: usize) -> bool {
        n <= self.free.len()
    }

    /// `n` fresh blocks, each held once; `None` (and nothing taken) if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if !self.can_allocate(n) {
            return None;
        }
        let blocks: Vec<BlockId> = self.free.drain(..n).collect();
        for &b in &blocks {
            self.ref_counts[b as usize] = 1;
        }
        Some(blocks)
    }

    /// Lets go of `blocks`; those nobody holds any more become free.
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            let count = &mut self.ref_counts[b as usize];
            debug_assert!(*count > 0, "releasing free block {b}");
            *count -= 1;
            if *count == 0 {
                self.free.push_back(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_blocks_are_free_again() {
        let mut m = BlockManager::new(4, 16);
        let a = m.allocate(3).unwrap();
        assert_eq!(m.num_free(), 1);
        m.release(&a);
        assert_eq!(m.num_free(), 4);
        assert!(m.allocate(5).is_none());
        assert_eq!(m.num_free(), 4, "a failed allocation takes nothing");
    }
}
