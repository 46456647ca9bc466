//! Journal replay on arbitrary frames (the seeds are journals the durability tests wrote):
//! never panics nor allocates more than the file holds, and a start after it finds the journal
//! repaired: clean, with the same sessions.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rollout_proxy::journal::Journal;
use rollout_proxy::session::SessionStore;

fuzz_target!(|frames: &[u8]| {
    let dir = std::env::temp_dir().join(format!("journal-replay-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut file = b"RPJRNL01".to_vec();
    file.extend_from_slice(frames);
    std::fs::write(dir.join("journal"), file).unwrap();
    let store = SessionStore::default();
    // A frame whose checksum holds but does not decode is a journal of another format: refused.
    let Ok((journal, _)) = Journal::open(&dir, &store) else {
        return;
    };
    drop(journal);
    let again = SessionStore::default();
    let (_, replayed) = Journal::open(&dir, &again).expect("a repaired journal opens");
    assert!(replayed.damage.is_none() && replayed.dropped_bytes == 0);
    assert_eq!(again.len(), store.len());
});
