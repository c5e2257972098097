//! A block's content name, chained from its parent's, as the prefix cache keys blocks.

use sha2::{Digest, Sha256};

/// A block's content name: 128 bits of SHA-256 over (parent name, tokens), so that two
/// different prefixes never share a name in practice.
pub(crate) type BlockHash = u128;

/// The names of the full blocks of `tokens`, in order.
#[cfg(test)]
pub(crate) fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut hashes = Vec::new();
    extend_hashes(&mut hashes, tokens, block_size);
    hashes
}

/// Appends to `hashes` the names of the full blocks of `tokens` it does not have yet.
pub(crate) fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
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
