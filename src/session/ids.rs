//! A node's token ids, stored in as few bytes as they need.
//!
//! Nodes are most of what a proxy holds: every history token of every live rollout. Ids are
//! kept in three bytes each (vocabularies in use have well under 2^24 entries; a block with a
//! larger id keeps four bytes per id, so none is ever truncated). Each append is its own
//! exactly sized block, so a growing node never reallocates: no copy of its history per turn,
//! and no freed block left behind for the allocator to fragment around.

use std::ops::Range;

/// Ids below this fit in three bytes.
const PACKED_LIMIT: u32 = 1 << 24;

/// Token ids, appended block by block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenIds {
    blocks: Vec<Block>,
    len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Block {
    /// Little-endian 24-bit ids.
    Packed(Box<[u8]>),
    Wide(Box<[u32]>),
}

impl Block {
    fn new(ids: &[u32]) -> Self {
        if ids.iter().all(|&id| id < PACKED_LIMIT) {
            Self::Packed(
                ids.iter()
                    .flat_map(|id| {
                        let [a, b, c, _] = id.to_le_bytes();
                        [a, b, c]
                    })
                    .collect(),
            )
        } else {
            Self::Wide(ids.into())
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Packed(bytes) => bytes.len() / 3,
            Self::Wide(ids) => ids.len(),
        }
    }

    fn copy_into(&self, range: Range<usize>, out: &mut Vec<u32>) {
        match self {
            Self::Packed(bytes) => out.extend(
                bytes[range.start * 3..range.end * 3]
                    .chunks_exact(3)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], 0])),
            ),
            Self::Wide(ids) => out.extend_from_slice(&ids[range]),
        }
    }
}

impl TokenIds {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `ids`.
    pub fn extend(&mut self, ids: &[u32]) {
        if !ids.is_empty() {
            self.blocks.push(Block::new(ids));
            self.len += ids.len();
        }
    }

    /// Appends the ids at positions `range` to `out`.
    pub fn copy_into(&self, range: Range<usize>, out: &mut Vec<u32>) {
        out.reserve(range.len());
        let mut start = 0;
        for block in &self.blocks {
            let end = start + block.len();
            if end > range.start && start < range.end {
                let from = range.start.max(start) - start;
                let to = range.end.min(end) - start;
                block.copy_into(from..to, out);
            }
            if end >= range.end {
                break;
            }
            start = end;
        }
    }

    /// The ids at positions `range`.
    pub fn to_vec(&self, range: Range<usize>) -> Vec<u32> {
        let mut out = Vec::with_capacity(range.len());
        self.copy_into(range, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_bytes_per_id_unless_one_does_not_fit() {
        let mut ids = TokenIds::default();
        ids.extend(&[0, 151_643, PACKED_LIMIT - 1]);
        ids.extend(&[]);
        ids.extend(&[PACKED_LIMIT, 7]);
        ids.extend(&[9]);
        assert!(matches!(&ids.blocks[0], Block::Packed(bytes) if bytes.len() == 9));
        assert!(matches!(ids.blocks[1], Block::Wide(_)));
        assert_eq!(ids.len(), 6);
        let all = vec![0, 151_643, PACKED_LIMIT - 1, PACKED_LIMIT, 7, 9];
        assert_eq!(ids.to_vec(0..6), all);
        // Ranges across and inside blocks.
        for (from, to) in [(1, 4), (2, 3), (3, 5), (4, 6), (5, 5), (0, 0)] {
            assert_eq!(ids.to_vec(from..to), all[from..to], "{from}..{to}");
        }
    }
}
