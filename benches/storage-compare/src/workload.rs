//! The workload of `benches/journal.rs`, made deterministic so that every process of a run
//! (the writer, the restart, the deletion) agrees on which sessions exist.

use rollout_proxy::generation::FinishReason;
use rollout_proxy::journal::Entry;
use rollout_proxy::session::{CommitRecord, RecordedChoice, SegmentCheck, Start, TurnLabels};
use rollout_proxy::session::{SessionOptions, SessionStore};
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
        let prompt = self.per_turn() - sampled;
        let seed = (s * self.turns + t) as u32;
        CommitRecord {
            start: match t {
                0 => Start::New { divergence: None },
                _ => Start::Extend { node: 0 },
            },
            new_prompt: (0..prompt as u32)
                .map(|i| (i * 7 + seed) % 150_000)
                .collect(),
            history: Vec::new(),
            next_check: SegmentCheck {
                prefix_len: 40,
                prefix_hash: u64::from(seed),
                generation_prompt: None,
            },
            labels: TurnLabels {
                api: "chat.completions",
                ..TurnLabels::default()
            },
            track_tree: false,
            choices: vec![RecordedChoice {
                token_ids: (0..sampled as u32)
                    .map(|i| (i * 13 + seed) % 150_000)
                    .collect(),
                logprobs: (0..sampled).map(|i| -0.01 * i as f32).collect(),
                finish_reason: FinishReason::Stop,
                stop: None,
                weight_version: None,
                cached_tokens: Some(prompt as u32),
                approximate: false,
                end_token_text: Some("<|im_end|>".into()),
                tool_calls: Vec::new(),
                fingerprints: vec![u64::from(seed)],
                backend: "http://gpu1:30000".into(),
            }],
            key: None,
        }
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

/// Sessions and turns restored.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub sessions: usize,
    pub turns: usize,
}

/// Applies one decoded entry to `store`, as the journal's replay does for the two kinds of
/// entry this workload writes (its own `restore` is private).
pub fn restore(store: &SessionStore, entry: Entry, restored: &mut Restored) {
    match entry {
        Entry::Created {
            id,
            options,
            created_at,
        } => {
            store.restore(id, options, created_at);
            restored.sessions += 1;
        }
        Entry::Committed { id, record } => {
            let session = store
                .get(&id.to_string())
                .expect("created before its turns");
            let mut state = session.state.try_lock().expect("nothing else runs");
            rollout_proxy::session::apply(&mut state, &record);
            session.set_num_nodes(state.nodes.len());
            restored.turns += 1;
        }
        other => panic!("this workload writes no {other:?}"),
    }
}
