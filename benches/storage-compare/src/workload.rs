//! The workload of `benches/journal.rs`, made deterministic so that every process of a run
//! (the writer, the restart, the deletion) agrees on which sessions exist.

#[path = "../../../tests/common/records.rs"]
mod records;

use records::synthetic_turn;
use rollout_proxy::journal::Entry;
use rollout_proxy::session::{CommitRecord, SessionOptions};
use uuid::Uuid;

/// How many sessions, of how many tokens, in how many turns.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub sessions: usize,
    pub tokens: usize,
    pub turns: usize,
}

impl Workload {
    /// Tokens each turn adds; one in eight of them sampled.
    fn per_turn(&self) -> usize {
        self.tokens / self.turns
    }

    /// Tokens the sessions hold once every turn is written.
    pub fn held_tokens(&self) -> usize {
        self.sessions * self.turns * self.per_turn()
    }

    /// Session `s`'s id: random-looking (like the proxy's v4 ids, so keyed stores insert in
    /// random order) but the same in every process.
    pub fn id(s: usize) -> Uuid {
        let mut x = s as u64;
        let mut next = || {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let bytes = (u128::from(next()) << 64 | u128::from(next())).to_le_bytes();
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }

    /// The entry that creates session `s`.
    pub fn created(s: usize) -> Entry {
        Entry::Created {
            id: Self::id(s),
            options: SessionOptions::default(),
            created_at: 0.0,
        }
    }

    /// Turn `t` of session `s`, exactly as `benches/journal.rs` builds it.
    pub fn turn(&self, s: usize, t: usize) -> CommitRecord {
        let sampled = self.per_turn() / 8;
        let seed = (s * self.turns + t) as u32;
        synthetic_turn(
            (t > 0).then_some(0),
            self.per_turn() - sampled,
            sampled,
            seed,
        )
    }
}

/// A record's key in the keyed stores: the session's id, then the entry's sequence number
/// (0 = the creation, 1.. = the turns), big-endian so that byte order is (session, seq) order.
pub fn key(id: Uuid, seq: u32) -> [u8; 20] {
    let mut key = [0; 20];
    key[..16].copy_from_slice(id.as_bytes());
    key[16..].copy_from_slice(&seq.to_be_bytes());
    key
}
