//! The journal's entries in a compact binary form: little-endian integers and floats,
//! length-prefixed strings and lists. Every entry starts with its kind and its session's id,
//! so compaction can sort frames by session without decoding them.

use crate::session::{CommitRecord, HistoryMode, SegmentCheck, SessionOptions};
use crate::tools::ToolFormat;
use std::sync::Arc;
use uuid::Uuid;

mod record;

/// One journal entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A session was created.
    Created {
        /// Its id.
        id: Uuid,
        /// Its options.
        options: SessionOptions,
        /// Its creation time, seconds since the epoch.
        created_at: f64,
    },
    /// A turn was committed.
    Committed {
        /// The session.
        id: Uuid,
        /// The turn (boxed: the other entries are small).
        record: Box<CommitRecord>,
    },
    /// A turn's nudge label changed after its commit.
    Relabelled {
        /// The session.
        id: Uuid,
        /// The node whose last turn is relabelled.
        node: usize,
        /// The new label.
        label: &'static str,
    },
    /// A session was deleted or expired.
    Deleted {
        /// The session.
        id: Uuid,
    },
    /// A turn's reply was kept under its `Idempotency-Key`.
    Replied {
        /// The session.
        id: Uuid,
        /// The key.
        key: String,
        /// Hash of the request body the key was used with.
        body_hash: u64,
        /// The reply's status.
        status: u16,
        /// The reply's content type.
        content_type: String,
        /// The reply, whole.
        body: Vec<u8>,
    },
    /// The rollout's reward was given.
    Rewarded {
        /// The session.
        id: Uuid,
        /// The reward.
        reward: f64,
        /// Its metadata, as JSON.
        metadata: String,
        /// When, seconds since the epoch.
        rewarded_at: f64,
    },
    /// A Responses API reply was stored on the session (for `previous_response_id`).
    Stored {
        /// The session.
        id: Uuid,
        /// The response's id.
        response_id: String,
        /// The response it continued, whose conversation `items` follow on (older journals
        /// have none and the whole conversation in `items`).
        previous: Option<String>,
        /// The items the response added (its input items, then its output), as JSON.
        items: String,
        /// The response object, as JSON.
        body: String,
    },
}

impl Entry {
    /// `session`'s creation.
    pub fn created(session: &crate::session::Session) -> Self {
        Entry::Created {
            id: session.id,
            options: session.options.clone(),
            created_at: session.created_at,
        }
    }

    /// `node`'s last turn in `session` relabelled `label`.
    pub fn relabelled(session: Uuid, node: usize, label: &'static str) -> Self {
        Entry::Relabelled {
            id: session,
            node,
            label,
        }
    }

    /// A kept reply of `session` under `key`; `None` when the slot holds no reply.
    pub fn replied(
        session: Uuid,
        key: &str,
        slot: &crate::session::replies::KeySlot,
    ) -> Option<Self> {
        let reply = slot.reply.as_ref()?;
        Some(Entry::Replied {
            id: session,
            key: key.to_string(),
            body_hash: slot.body_hash,
            status: reply.status,
            content_type: reply.content_type.clone(),
            body: reply.body.to_vec(),
        })
    }

    /// `session`'s reward.
    pub fn rewarded(session: Uuid, reward: &crate::session::Reward) -> Self {
        Entry::Rewarded {
            id: session,
            reward: reward.reward,
            metadata: serde_json::to_string(&reward.metadata).unwrap_or_default(),
            rewarded_at: reward.rewarded_at,
        }
    }

    /// A Responses reply stored on `session` under `response_id`.
    pub fn stored(
        session: Uuid,
        response_id: &str,
        response: &crate::session::responses::StoredResponse,
    ) -> Self {
        let previous = response.previous.as_ref();
        Entry::Stored {
            id: session,
            response_id: response_id.to_string(),
            previous: previous.and_then(|p| p.body["id"].as_str().map(str::to_string)),
            items: serde_json::to_string(&response.items).unwrap_or_default(),
            body: response.body.to_string(),
        }
    }

    /// The session it is about.
    pub fn session(&self) -> Uuid {
        match self {
            Self::Created { id, .. }
            | Self::Committed { id, .. }
            | Self::Relabelled { id, .. }
            | Self::Deleted { id }
            | Self::Replied { id, .. }
            | Self::Rewarded { id, .. }
            | Self::Stored { id, .. } => *id,
        }
    }
}

/// An entry that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("journal entry unreadable: {0}")]
pub struct Corrupt(pub &'static str);

/// The strings the proxy writes into `&'static str` fields; a string of another version is
/// kept too (leaked once per distinct unknown string, never per entry of a known one).
const KNOWN: &[&str] = &[
    "kept",
    "discarded",
    "kept_retry_discarded",
    "history_edited",
    "template_rewrites_history",
    "template_altered_sampled_turn",
    "unmatched_assistant_message",
    "formatting",
    "defaults",
    "new_conversation",
    "",
];

fn intern(text: &str) -> &'static str {
    KNOWN
        .iter()
        .find(|known| **known == text)
        .copied()
        .unwrap_or_else(|| Box::leak(text.to_string().into_boxed_str()))
}

/// Encodes `entry` at the end of `out`.
pub fn encode(entry: &Entry, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    match entry {
        Entry::Created {
            id,
            options,
            created_at,
        } => {
            w.u8(1);
            w.id(id);
            w.f64(*created_at);
            w.str(options.tool_parser.name());
            w.bool(options.track_tree);
            w.opt_str(options.base_url.as_deref());
            w.u8(match options.history {
                HistoryMode::Sampled => 0,
                HistoryMode::Template => 1,
            });
            w.bool(options.reasoning);
            // Last, each after the one before (an empty adapter name stands for none): a
            // session created before adapters or routed experts were journaled reads as
            // without them.
            if options.adapter.is_some() || options.routed_experts {
                w.str(options.adapter.as_deref().unwrap_or(""));
            }
            if options.routed_experts {
                w.bool(true);
            }
        }
        Entry::Committed { id, record } => encode_commit(*id, record, w.0),
        Entry::Relabelled { id, node, label } => {
            w.u8(3);
            w.id(id);
            w.u32(*node as u32);
            w.str(label);
        }
        Entry::Deleted { id } => {
            w.u8(4);
            w.id(id);
        }
        Entry::Replied {
            id,
            key,
            body_hash,
            status,
            content_type,
            body,
        } => {
            w.u8(6);
            w.id(id);
            w.str(key);
            w.u64(*body_hash);
            w.u32(u32::from(*status));
            w.str(content_type);
            w.u32(body.len() as u32);
            w.0.extend_from_slice(body);
        }
        Entry::Rewarded {
            id,
            reward,
            metadata,
            rewarded_at,
        } => {
            w.u8(7);
            w.id(id);
            w.f64(*reward);
            w.str(metadata);
            w.f64(*rewarded_at);
        }
        Entry::Stored {
            id,
            response_id,
            previous,
            items,
            body,
        } => {
            w.u8(5);
            w.id(id);
            w.str(response_id);
            w.str(items);
            w.str(body);
            // Last, so that entries written before it was added still read.
            w.opt_str(previous.as_deref());
        }
    }
}

/// Encodes a committed turn of session `id` (without owning the record).
pub fn encode_commit(id: Uuid, record: &CommitRecord, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    w.u8(2);
    w.id(&id);
    w.record(record);
}

/// The session id of an encoded entry (bytes 1..17).
pub fn session_of(payload: &[u8]) -> Option<Uuid> {
    Uuid::from_slice(payload.get(1..17)?).ok()
}

/// Whether an encoded entry is a deletion.
pub fn is_deletion(payload: &[u8]) -> bool {
    payload.first() == Some(&4)
}

/// Decodes one entry.
pub fn decode(payload: &[u8]) -> Result<Entry, Corrupt> {
    let mut r = Reader { bytes: payload };
    let kind = r.u8()?;
    let id = r.id()?;
    let entry = match kind {
        1 => {
            let created_at = r.f64()?;
            let tool_parser =
                ToolFormat::named(&r.string()?).map_err(|_| Corrupt("tool parser"))?;
            let track_tree = r.bool()?;
            let base_url = r.opt_string()?;
            let history = match r.u8()? {
                0 => HistoryMode::Sampled,
                1 => HistoryMode::Template,
                _ => return Err(Corrupt("history mode")),
            };
            let reasoning = r.bool()?;
            let adapter = match r.bytes.is_empty() {
                true => None,
                false => Some(r.string()?).filter(|a| !a.is_empty()).map(Arc::from),
            };
            let routed_experts = !r.bytes.is_empty() && r.bool()?;
            Entry::Created {
                id,
                options: SessionOptions {
                    tool_parser,
                    track_tree,
                    base_url,
                    history,
                    reasoning,
                    adapter,
                    routed_experts,
                },
                created_at,
            }
        }
        2 => Entry::Committed {
            id,
            record: Box::new(r.record()?),
        },
        3 => Entry::Relabelled {
            id,
            node: r.u32()? as usize,
            label: intern(&r.string()?),
        },
        4 => Entry::Deleted { id },
        5 => Entry::Stored {
            id,
            response_id: r.string()?,
            items: r.string()?,
            body: r.string()?,
            previous: match r.bytes.is_empty() {
                true => None,
                false => r.opt_string()?,
            },
        },
        6 => Entry::Replied {
            id,
            key: r.string()?,
            body_hash: r.u64()?,
            status: u16::try_from(r.u32()?).map_err(|_| Corrupt("status"))?,
            content_type: r.string()?,
            body: {
                let n = r.len(1)?;
                r.take(n)?.to_vec()
            },
        },
        7 => Entry::Rewarded {
            id,
            reward: r.f64()?,
            metadata: r.string()?,
            rewarded_at: r.f64()?,
        },
        _ => return Err(Corrupt("kind")),
    };
    if !r.bytes.is_empty() {
        return Err(Corrupt("trailing bytes"));
    }
    Ok(entry)
}

struct Writer<'o>(&'o mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn id(&mut self, id: &Uuid) {
        self.0.extend_from_slice(id.as_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn opt_str(&mut self, s: Option<&str>) {
        self.bool(s.is_some());
        if let Some(s) = s {
            self.str(s);
        }
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        self.bool(v.is_some());
        if let Some(v) = v {
            self.u32(v);
        }
    }
    fn ids(&mut self, ids: &[u32]) {
        self.u32(ids.len() as u32);
        self.0.reserve(4 * ids.len());
        ids.iter().for_each(|&id| self.u32(id));
    }
    fn check(&mut self, check: &SegmentCheck) {
        self.u32(check.prefix_len);
        self.u64(check.prefix_hash);
        self.opt_str(check.generation_prompt.as_deref());
    }
    fn strings(&mut self, list: &[String]) {
        self.u32(list.len() as u32);
        list.iter().for_each(|s| self.str(s));
    }
}

struct Reader<'b> {
    bytes: &'b [u8],
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], Corrupt> {
        if self.bytes.len() < n {
            return Err(Corrupt("truncated"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Corrupt> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, Corrupt> {
        Ok(self.array::<1>()?[0])
    }
    fn bool(&mut self) -> Result<bool, Corrupt> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Corrupt("bool")),
        }
    }
    fn u32(&mut self) -> Result<u32, Corrupt> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, Corrupt> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn f64(&mut self) -> Result<f64, Corrupt> {
        Ok(f64::from_le_bytes(self.array()?))
    }
    fn id(&mut self) -> Result<Uuid, Corrupt> {
        Ok(Uuid::from_bytes(self.array()?))
    }
    /// A length that must fit in what is left, `unit` bytes per item.
    fn len(&mut self, unit: usize) -> Result<usize, Corrupt> {
        let n = self.u32()? as usize;
        if n.saturating_mul(unit) > self.bytes.len() {
            return Err(Corrupt("length"));
        }
        Ok(n)
    }
    fn string(&mut self) -> Result<String, Corrupt> {
        let n = self.len(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| Corrupt("utf-8"))
    }
    fn strings(&mut self) -> Result<Vec<String>, Corrupt> {
        (0..self.len(4)?).map(|_| self.string()).collect()
    }
    fn opt_string(&mut self) -> Result<Option<String>, Corrupt> {
        Ok(match self.bool()? {
            true => Some(self.string()?),
            false => None,
        })
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, Corrupt> {
        Ok(match self.bool()? {
            true => Some(self.u32()?),
            false => None,
        })
    }
    fn ids(&mut self) -> Result<Vec<u32>, Corrupt> {
        let n = self.len(4)?;
        let bytes = self.take(4 * n)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
    fn check(&mut self) -> Result<SegmentCheck, Corrupt> {
        Ok(SegmentCheck {
            prefix_len: self.u32()?,
            prefix_hash: self.u64()?,
            generation_prompt: self.opt_string()?.map(Arc::from),
        })
    }
}
