//! The ids of pieces the fast road has already run through the BPE model.
//!
//! The model keeps its own cache of merged words, but hands every piece back as tokens that
//! each carry their text (a string allocated per token). A turn's new text is mostly pieces
//! seen before (role markers, tool names, JSON punctuation, common words), so their ids are
//! kept here and the model is asked only about new ones. Short chunks of text with other
//! characters, which take the library's whole road, are kept here too.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock, RwLockReadGuard};

/// Pieces kept; once full, new pieces go to the model every time (as a piece longer than
/// the model's own cache allows does).
const CAPACITY: usize = 10_000;

/// A piece of ASCII text (before byte-level mapping), or a whole chunk of text with other
/// characters (they cannot collide: a piece holds no byte above 127), and its ids.
pub(super) type Piece = (Box<[u8]>, Box<[u32]>);

/// Piece → its ids. A turn looks up every piece of its new text here, so the hash is
/// foldhash (randomly seeded per map, so crafted text cannot aim at one bucket) rather than
/// SipHash, which cost a quarter of a short text's encoding.
pub(super) type Words = HashMap<Box<[u8]>, Box<[u32]>, foldhash::fast::RandomState>;

/// Ids of known pieces, shared by every thread that encodes with one tokenizer.
#[derive(Default)]
pub(super) struct WordCache(RwLock<Words>);

impl std::fmt::Debug for WordCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WordCache({} pieces)", self.known().len())
    }
}

impl WordCache {
    /// The known pieces, read-locked while one text is encoded.
    pub fn known(&self) -> RwLockReadGuard<'_, Words> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the pieces a text had to ask the model about, while there is room.
    pub fn remember(&self, new: Vec<Piece>) {
        let mut words = self.0.write().unwrap_or_else(PoisonError::into_inner);
        for (piece, ids) in new {
            if words.len() >= CAPACITY {
                break;
            }
            words.insert(piece, ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_pieces_up_to_its_capacity() {
        let cache = WordCache::default();
        let pieces =
            (0..CAPACITY + 5).map(|i| (i.to_string().into_bytes().into(), vec![i as u32].into()));
        cache.remember(pieces.collect());
        let known = cache.known();
        assert_eq!(known.len(), CAPACITY);
        assert_eq!(
            known.get(b"42".as_slice()).map(|ids| &ids[..]),
            Some(&[42][..])
        );
    }
}
