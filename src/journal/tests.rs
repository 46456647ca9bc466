//! The journal against damage, compaction and restarts.

use super::*;
use crate::generation::FinishReason;
use crate::session::{CommitRecord, RecordedChoice, SessionLog, Start, TurnLabels};
use crate::session::{SegmentCheck, SessionOptions};

fn turn(node: Option<usize>, seed: u32) -> CommitRecord {
    CommitRecord {
        start: node.map_or(Start::New { divergence: None }, |node| Start::Extend {
            node,
        }),
        new_prompt: (0..64).map(|i| i + seed).collect(),
        images: Vec::new(),
        history: Vec::new(),
        next_check: SegmentCheck {
            prefix_len: 1,
            prefix_hash: 2,
            generation_prompt: Some("<think>".into()),
        },
        labels: TurnLabels {
            api: crate::session::Api::Messages,
            tools_left_out: vec!["web_search".into()],
            nudge: None,
            // From seed 10 on, a call of the turn before came back changed.
            echoed_calls: match seed >= 10 {
                true => vec![crate::session::EchoChange {
                    id: "toolu_0".into(),
                    change: "defaults",
                    keys: vec!["+replace_all".into()],
                }],
                false => Vec::new(),
            },
        },
        track_tree: false,
        choices: vec![RecordedChoice {
            token_ids: vec![seed, seed + 1],
            logprobs: vec![-0.25, -0.5],
            finish_reason: FinishReason::Stop,
            stop: Some(crate::generation::StopMatch::Text("###".into())),
            weight_version: Some("v1".into()),
            // Seeds 7 (the newest section alone) and 13 (after all the others): the sample
            // spanned a weight update.
            weight_spans: match seed == 7 || seed == 13 {
                true => vec![
                    crate::generation::WeightSpan {
                        version: "v0".into(),
                        start: 0,
                        end: 1,
                    },
                    crate::generation::WeightSpan {
                        version: "v1".into(),
                        start: 1,
                        end: 2,
                    },
                ],
                false => Vec::new(),
            },
            // Seed 13: with the experts its positions were routed to.
            routed_experts: (seed == 13).then(|| crate::generation::RoutedExperts {
                from: 2,
                width: 4,
                layers: Some(2),
                ids: (0..8).collect(),
            }),
            cached_tokens: Some(3),
            approximate: false,
            end_token_text: Some("<|im_end|>".into()),
            tool_calls: vec![crate::session::IssuedToolCall {
                id: "toolu_0".into(),
                call_hash: 9,
                // From seed 9 on, healed from another format, keyed or not.
                healed_from: (seed >= 9).then_some("qwen3_coder"),
                // Seed 8 and 11 on: recognisable when handed back changed.
                echo: (seed == 8 || seed >= 11).then(|| crate::session::EchoKey {
                    canonical_hash: 5,
                    text_hash: 6,
                    default_keys: vec!["opts.verbose".into()],
                }),
            }],
            fingerprints: vec![1, 2],
            backend: "b".into(),
        }],
        // Every other turn keyed, so both forms are read back.
        key: seed
            .is_multiple_of(2)
            .then(|| crate::session::replies::TurnKey {
                key: format!("key-{seed}"),
                body_hash: u64::from(seed) * 31,
            }),
        // From seed 12 on, the conversation the turn was sampled after.
        conversation: (seed >= 12).then_some(crate::session::ConversationDigest {
            messages: seed as usize,
            digest: u64::from(seed) * 77,
        }),
    }
}

/// Every session's nodes, as text, by id: what a restart must reproduce.
fn snapshot(store: &SessionStore) -> Vec<(Uuid, String)> {
    let mut all: Vec<_> = store
        .list()
        .iter()
        .map(|s| {
            let state = s.state.try_lock().unwrap();
            let nodes: Vec<_> = state
                .nodes
                .iter()
                .map(|n| format!("{:?} {:?}", n.tokens(), n.turns))
                .collect();
            (s.id, nodes.join("|"))
        })
        .collect();
    all.sort();
    all
}

#[test]
fn entries_read_back_as_written() {
    for seed in [7, 8, 9, 10, 11, 12, 13] {
        let entry = Entry::Committed {
            id: Uuid::new_v4(),
            record: Box::new(turn(Some(2), seed)),
        };
        let mut bytes = Vec::new();
        codec::encode(&entry, &mut bytes);
        assert_eq!(codec::decode(&bytes).unwrap(), entry);
        assert!(codec::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}

#[test]
fn sessions_read_back_with_and_without_an_adapter() {
    let adapters = [None, Some(std::sync::Arc::from("math-lora"))];
    for (adapter, routed_experts) in adapters
        .iter()
        .flat_map(|a| [(a.clone(), false), (a.clone(), true)])
    {
        let entry = Entry::Created {
            id: Uuid::new_v4(),
            options: SessionOptions {
                adapter,
                routed_experts,
                ..Default::default()
            },
            created_at: 1.5,
        };
        let mut bytes = Vec::new();
        codec::encode(&entry, &mut bytes);
        assert_eq!(codec::decode(&bytes).unwrap(), entry);
    }
}

#[test]
fn compacting_at_run_time_keeps_every_live_session_and_appends_after_it() {
    // Under the build's folder, like the integration tests' files.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp")
        .join(format!("journal-{}", Uuid::new_v4()));
    let store = SessionStore::default();
    let (journal, _) = Journal::open(&dir, &store).unwrap();
    let mut kept = Vec::new();
    for i in 0..40u32 {
        let session = store.create(SessionOptions::default()).unwrap();
        journal
            .append(&Entry::Created {
                id: session.id,
                options: session.options.clone(),
                created_at: session.created_at,
            })
            .unwrap();
        for t in 0..3 {
            let record = turn((t > 0).then_some(0), i * 10 + t);
            futures::executor::block_on(journal.committed(session.id, &record)).unwrap();
            session.apply(&mut session.state.try_lock().unwrap(), &record);
        }
        if i % 4 == 0 {
            kept.push(session.id);
        } else {
            journal.append(&Entry::Deleted { id: session.id }).unwrap();
            store.remove(&session.id.to_string());
        }
    }
    let before = journal.size();
    journal.compact().unwrap();
    assert!(journal.size() * 3 < before, "{before} → {}", journal.size());
    // Appends go on into the compacted file.
    let last = store.get(&kept[0].to_string()).unwrap();
    let record = turn(Some(0), 999);
    futures::executor::block_on(journal.committed(last.id, &record)).unwrap();
    last.apply(&mut last.state.try_lock().unwrap(), &record);
    drop(journal);

    let restored = SessionStore::default();
    let (_, replayed) = Journal::open(&dir, &restored).unwrap();
    assert_eq!(replayed.sessions, kept.len());
    assert_eq!(snapshot(&restored), snapshot(&store));
    // Keyed turns come back under their keys.
    let committed = |store: &SessionStore, key: &str| {
        let session = store.get(&kept[0].to_string()).unwrap();
        session.replies.committed(key)
    };
    for key in ["key-0", "key-2"] {
        assert!(committed(&restored, key).is_some(), "{key}");
        assert_eq!(committed(&restored, key), committed(&store, key));
    }
    assert!(
        committed(&restored, "key-1").is_none(),
        "unkeyed turns have no key"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scratch folder under the build's.
fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp")
        .join(format!("{name}-{}", Uuid::new_v4()))
}

/// A journal of a few sessions with turns, one deleted: its bytes and its entries.
fn written_journal() -> (Vec<u8>, Vec<Entry>) {
    let dir = scratch("journal-source");
    let store = SessionStore::default();
    let (journal, _) = Journal::open(&dir, &store).unwrap();
    let mut entries = Vec::new();
    for i in 0..6u32 {
        let id = Uuid::new_v4();
        entries.push(Entry::Created {
            id,
            options: SessionOptions::default(),
            created_at: f64::from(i),
        });
        for t in 0..3 {
            let mut record = turn((t > 0).then_some(0), i * 10 + t);
            // As a real turn's: the node's earlier turns, each checked.
            record.history = (0..t as usize)
                .map(|completion| crate::session::HistoryEntry {
                    completion,
                    before: record.next_check.clone(),
                })
                .collect();
            entries.push(Entry::Committed {
                id,
                record: Box::new(record),
            });
        }
        if i == 2 {
            entries.push(Entry::Deleted { id });
        }
    }
    for entry in &entries {
        journal.append(entry).unwrap();
    }
    drop(journal);
    let bytes = std::fs::read(dir.join("journal")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (bytes, entries)
}

/// Each frame's byte range in a whole journal.
fn frame_ranges(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut at = MAGIC.len();
    let mut ranges = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        ranges.push((at, at + HEADER + len));
        at += HEADER + len;
    }
    ranges
}

/// One session's nodes as text (`None`: not there).
fn session_text(store: &SessionStore, id: Uuid) -> Option<String> {
    snapshot(store)
        .into_iter()
        .find(|(known, _)| *known == id)
        .map(|(_, text)| text)
}

/// The session's nodes after each prefix of its own entries: `[0]` before any, then after
/// each one.
fn states_of(entries: &[Entry], id: Uuid) -> Vec<Option<String>> {
    let store = SessionStore::default();
    let mut replayed = Replayed::default();
    let mut states = vec![None];
    for entry in entries.iter().filter(|e| e.session() == id) {
        restore(&store, entry.clone(), &mut replayed);
        states.push(session_text(&store, id));
    }
    states
}

/// Random cuts and flipped bytes: every record before the damage is kept; every session no
/// damage touched comes back whole (records after the damage included); a session whose
/// record was lost comes back as it stood just before that record (its deletion, when
/// whole, still applies), never as a state it never had.
#[test]
fn replay_keeps_every_whole_frame_and_invents_none() {
    use rand::{Rng, SeedableRng};
    let (bytes, entries) = written_journal();
    let ranges = frame_ranges(&bytes);
    assert_eq!(ranges.len(), entries.len());
    let mut ids: Vec<Uuid> = entries.iter().map(Entry::session).collect();
    ids.dedup();
    let states: Vec<Vec<Option<String>>> = ids.iter().map(|&id| states_of(&entries, id)).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(30);
    for case in 0..300 {
        let mut damaged = bytes.clone();
        // Which frames the damage leaves whole.
        let intact: Vec<bool> = match case % 3 {
            // A crash mid-write: the file cut anywhere after its magic.
            0 => {
                let cut = rng.random_range(MAGIC.len()..bytes.len());
                damaged.truncate(cut);
                ranges.iter().map(|&(_, end)| end <= cut).collect()
            }
            // One flipped byte, or a few in a row, anywhere in the frames.
            _ => {
                let at = rng.random_range(MAGIC.len()..bytes.len());
                let span = match case % 3 {
                    1 => 1,
                    _ => rng.random_range(1..=24).min(bytes.len() - at),
                };
                for byte in &mut damaged[at..at + span] {
                    *byte ^= rng.random_range(1..=255u8);
                }
                ranges
                    .iter()
                    .map(|&(start, end)| end <= at || start >= at + span)
                    .collect()
            }
        };
        let dir = scratch("journal-damaged");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("journal"), &damaged).unwrap();
        let restored = SessionStore::default();
        let (journal, replayed) = Journal::open(&dir, &restored).unwrap();
        for (id, states) in ids.iter().zip(&states) {
            let own: Vec<(&Entry, bool)> = entries
                .iter()
                .zip(&intact)
                .filter(|(entry, _)| entry.session() == *id)
                .map(|(entry, whole)| (entry, *whole))
                .collect();
            let expected = match own.iter().position(|(_, whole)| !whole) {
                None => states.last().unwrap().clone(),
                Some(_)
                    if own
                        .iter()
                        .any(|(e, whole)| *whole && matches!(e, Entry::Deleted { .. })) =>
                {
                    None
                }
                Some(lost) => states[lost].clone(),
            };
            assert_eq!(
                session_text(&restored, *id),
                expected,
                "case {case}, session {id}"
            );
        }
        assert_eq!(restored.len(), snapshot(&restored).len());
        // Damage with whole frames after it is kept aside, never deleted; a cut is a torn
        // tail, dropped.
        let after_damage = intact
            .iter()
            .skip_while(|whole| **whole)
            .any(|whole| *whole);
        if after_damage {
            assert!(replayed.damage.is_some(), "case {case}");
        }
        if case % 3 == 0 {
            assert!(replayed.damage.is_none(), "case {case}");
        }
        // A cut between two frames leaves a shorter journal, nothing to notice.
        let cut_between = case % 3 == 0 && ranges.iter().any(|&(_, end)| end == damaged.len());
        let lost = intact.iter().any(|whole| !whole) && !cut_between;
        assert_eq!(
            replayed.damage.is_some() || replayed.dropped_bytes > 0,
            lost,
            "case {case}"
        );
        if let Some(damage) = &replayed.damage {
            assert_eq!(std::fs::read(&damage.copy).unwrap(), damaged, "case {case}");
        }
        // Appends go on after the repair, and a second start finds the journal clean.
        let session = restored.create(SessionOptions::default()).unwrap();
        futures::executor::block_on(journal.created(&session)).unwrap();
        drop(journal);
        let again = SessionStore::default();
        let (_, replayed) = Journal::open(&dir, &again).unwrap();
        assert!(
            replayed.damage.is_none() && replayed.dropped_bytes == 0,
            "case {case}"
        );
        assert_eq!(snapshot(&again), snapshot(&restored), "case {case}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_length_beyond_the_file_is_a_torn_tail() {
    let dir = scratch("journal-lengths");
    std::fs::create_dir_all(&dir).unwrap();
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[0xFF; 16]);
    std::fs::write(dir.join("journal"), &bytes).unwrap();
    let store = SessionStore::default();
    let (_, replayed) = Journal::open(&dir, &store).unwrap();
    assert_eq!(
        replayed.dropped_bytes, 16,
        "a torn tail: nothing follows it"
    );
    assert_eq!(store.len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Found by fuzzing: a session deleted and then created again (a damaged journal can say
/// so) must come back from the compacted journal as replay restored it.
#[test]
fn a_session_written_again_after_its_deletion_survives_compaction() {
    let dir = scratch("journal-revived");
    let store = SessionStore::default();
    let (journal, _) = Journal::open(&dir, &store).unwrap();
    let id = Uuid::new_v4();
    let created = Entry::Created {
        id,
        options: SessionOptions::default(),
        created_at: 1.0,
    };
    for entry in [
        created.clone(),
        Entry::Deleted { id },
        created,
        Entry::Committed {
            id,
            record: Box::new(turn(None, 3)),
        },
    ] {
        journal.append(&entry).unwrap();
    }
    drop(journal);
    let restored = SessionStore::default();
    let (journal, _) = Journal::open(&dir, &restored).unwrap();
    journal.compact().unwrap();
    drop(journal);
    let again = SessionStore::default();
    Journal::open(&dir, &again).unwrap();
    assert_eq!(restored.len(), 1);
    assert_eq!(snapshot(&again), snapshot(&restored));
    let _ = std::fs::remove_dir_all(&dir);
}
