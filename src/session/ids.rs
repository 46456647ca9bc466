//! A node's token ids, stored in as few bytes as they need.
//!
//! Nodes are most of what a proxy holds: every history token of every live rollout. Ids are
//! kept in 18 bits each when they fit (every vocabulary in use has at most 2^18 = 262,144
//! entries), else in three bytes, else four: each block takes the narrowest width all its ids
//! fit, so none is ever truncated. Each append is its own
//! exactly sized block, so a growing node never reallocates: no copy of its history per turn,
//! and no freed block left behind for the allocator to fragment around.

use std::ops::Range;

/// A half-open range of token positions the model sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First position.
    pub start: u32,
    /// One past the last position.
    pub end: u32,
}

/// Bits of an id in a narrow block.
const NARROW_BITS: usize = 18;

/// Ids below this fit in a narrow block.
const NARROW_LIMIT: u32 = 1 << NARROW_BITS;

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
    /// 18-bit ids, id `i` at bits `18 i ..` of the little-endian bit stream; exactly
    /// `ceil(18 n / 8)` bytes, so the length follows from the size.
    Narrow(Box<[u8]>),
    /// Little-endian 24-bit ids.
    Packed(Box<[u8]>),
    Wide(Box<[u32]>),
}

impl Block {
    fn new(ids: &[u32]) -> Self {
        let largest = ids.iter().copied().max().unwrap_or(0);
        if largest < NARROW_LIMIT {
            let mut bytes = vec![0u8; (ids.len() * NARROW_BITS).div_ceil(8)];
            for (i, &id) in ids.iter().enumerate() {
                let bit = i * NARROW_BITS;
                // At most 6 + 18 bits: three bytes from the id's first byte.
                let [a, b, c, _] = (id << (bit % 8)).to_le_bytes();
                let at = bit / 8;
                bytes[at] |= a;
                bytes[at + 1] |= b;
                bytes[at + 2] |= c;
            }
            Self::Narrow(bytes.into())
        } else if largest < PACKED_LIMIT {
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
            // The largest n with ceil(18 n / 8) bytes.
            Self::Narrow(bytes) => bytes.len() * 8 / NARROW_BITS,
            Self::Packed(bytes) => bytes.len() / 3,
            Self::Wide(ids) => ids.len(),
        }
    }

    fn copy_into(&self, range: Range<usize>, out: &mut Vec<u32>) {
        match self {
            Self::Narrow(bytes) => copy_narrow(bytes, range, out),
            Self::Packed(bytes) => out.extend(
                bytes[range.start * 3..range.end * 3]
                    .chunks_exact(3)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], 0])),
            ),
            Self::Wide(ids) => out.extend_from_slice(&ids[range]),
        }
    }
}

/// Unpacks the 18-bit ids at `range`: four at a time from each 9 bytes that hold four whole
/// ids (a node's history is copied into every prompt, so this is a turn's longest loop).
fn copy_narrow(bytes: &[u8], range: Range<usize>, out: &mut Vec<u32>) {
    let one = |i: usize| {
        let bit = i * NARROW_BITS;
        let at = bit / 8;
        let word = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], 0]);
        (word >> (bit % 8)) & (NARROW_LIMIT - 1)
    };
    let first_group = range.start.div_ceil(4).min(range.end / 4);
    let last_group = (range.end / 4).max(first_group);
    out.extend((range.start..(first_group * 4).max(range.start).min(range.end)).map(one));
    for group in bytes[first_group * 9..last_group * 9].chunks_exact(9) {
        let word = u64::from_le_bytes(group[..8].try_into().unwrap_or_default());
        let top = u64::from(group[8]) << 10;
        let mask = u64::from(NARROW_LIMIT - 1);
        out.extend([
            (word & mask) as u32,
            ((word >> 18) & mask) as u32,
            ((word >> 36) & mask) as u32,
            (((word >> 54) | top) & mask) as u32,
        ]);
    }
    out.extend(((last_group * 4).max(range.start)..range.end).map(one));
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
    fn each_block_takes_the_narrowest_width_its_ids_fit() {
        let mut ids = TokenIds::default();
        ids.extend(&[0, 151_643, PACKED_LIMIT - 1]);
        ids.extend(&[]);
        ids.extend(&[PACKED_LIMIT, 7]);
        ids.extend(&[9, NARROW_LIMIT - 1, 0]);
        assert!(matches!(&ids.blocks[0], Block::Packed(bytes) if bytes.len() == 9));
        assert!(matches!(ids.blocks[1], Block::Wide(_)));
        assert!(matches!(&ids.blocks[2], Block::Narrow(bytes) if bytes.len() == 7));
        assert_eq!(ids.len(), 8);
        let all = vec![
            0,
            151_643,
            PACKED_LIMIT - 1,
            PACKED_LIMIT,
            7,
            9,
            NARROW_LIMIT - 1,
            0,
        ];
        assert_eq!(ids.to_vec(0..8), all);
        // Ranges across and inside blocks.
        for (from, to) in [
            (1, 4),
            (2, 3),
            (3, 5),
            (4, 6),
            (5, 5),
            (0, 0),
            (6, 8),
            (7, 8),
        ] {
            assert_eq!(ids.to_vec(from..to), all[from..to], "{from}..{to}");
        }
    }

    #[test]
    fn narrow_blocks_of_every_length_read_back() {
        let spread = (0..200u32).map(|i| i.wrapping_mul(2_654_435_761) % NARROW_LIMIT);
        let all: Vec<u32> = [0, NARROW_LIMIT - 1].into_iter().chain(spread).collect();
        for len in 0..all.len() {
            let mut ids = TokenIds::default();
            ids.extend(&all[..len]);
            assert_eq!(ids.len(), len);
            assert_eq!(ids.to_vec(0..len), all[..len]);
            assert!(ids.blocks.iter().all(|b| matches!(b, Block::Narrow(_))));
            if len > 3 {
                assert_eq!(ids.to_vec(1..len - 2), all[1..len - 2]);
            }
        }
        // Every range of one block: ids read four at a time and one at a time around them.
        let mut ids = TokenIds::default();
        ids.extend(&all[..23]);
        for start in 0..23 {
            for end in start..=23 {
                assert_eq!(ids.to_vec(start..end), all[start..end], "{start}..{end}");
            }
        }
    }
}
