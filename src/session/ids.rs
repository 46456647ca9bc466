//! A node's token ids, stored in as few bytes as they need.
//!
//! Nodes are most of what a proxy holds: every history token of every live rollout. Ids are
//! kept in three bytes each while they all fit (vocabularies in use have well under 2^24
//! entries), so a held token costs three bytes instead of four; an id that does not fit widens
//! the store to four bytes, so no id is ever truncated.

use std::ops::Range;

/// Ids below this fit in three bytes.
const PACKED_LIMIT: u32 = 1 << 24;

/// Token ids, three bytes each while every id fits, else four.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenIds {
    /// Little-endian 24-bit ids.
    Packed(Vec<u8>),
    Wide(Vec<u32>),
}

impl Default for TokenIds {
    fn default() -> Self {
        Self::Packed(Vec::new())
    }
}

impl TokenIds {
    pub fn len(&self) -> usize {
        match self {
            Self::Packed(bytes) => bytes.len() / 3,
            Self::Wide(ids) => ids.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for exactly `additional` more ids.
    pub fn reserve_exact(&mut self, additional: usize) {
        match self {
            Self::Packed(bytes) => bytes.reserve_exact(additional * 3),
            Self::Wide(ids) => ids.reserve_exact(additional),
        }
    }

    /// Appends `ids`.
    pub fn extend(&mut self, ids: &[u32]) {
        if let Self::Packed(bytes) = self {
            if ids.iter().all(|&id| id < PACKED_LIMIT) {
                bytes.extend(ids.iter().flat_map(|id| {
                    let [a, b, c, _] = id.to_le_bytes();
                    [a, b, c]
                }));
                return;
            }
            let mut wide = Vec::with_capacity(self.len() + ids.len());
            self.copy_into(0..self.len(), &mut wide);
            *self = Self::Wide(wide);
        }
        if let Self::Wide(wide) = self {
            wide.extend_from_slice(ids);
        }
    }

    /// Appends the ids at positions `range` to `out`.
    pub fn copy_into(&self, range: Range<usize>, out: &mut Vec<u32>) {
        match self {
            Self::Packed(bytes) => out.extend(
                bytes[range.start * 3..range.end * 3]
                    .chunks_exact(3)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], 0])),
            ),
            Self::Wide(ids) => out.extend_from_slice(&ids[range]),
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
    fn three_bytes_per_id_until_one_does_not_fit() {
        let mut ids = TokenIds::default();
        ids.extend(&[0, 151_643, PACKED_LIMIT - 1]);
        assert!(matches!(&ids, TokenIds::Packed(bytes) if bytes.len() == 9));
        assert_eq!(ids.to_vec(0..3), vec![0, 151_643, PACKED_LIMIT - 1]);
        ids.extend(&[PACKED_LIMIT, 7]);
        assert!(matches!(ids, TokenIds::Wide(_)));
        assert_eq!(ids.len(), 5);
        assert_eq!(
            ids.to_vec(1..5),
            vec![151_643, PACKED_LIMIT - 1, PACKED_LIMIT, 7]
        );
    }
}
