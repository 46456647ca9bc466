//! Sessions shared by a fleet of proxies through Redis or Valkey (`serve --store redis://…`,
//! issue 33; the store's primitives are here, the serving is not wired to them yet).
//!
//! The store is the record; a replica keeps the sessions it serves in memory. Each session is
//! one list of journal entries, the frames `--data-dir` writes ([`crate::journal::codec`]), so
//! loading a session is replaying them. A change is appended only by the replica holding the
//! session's lease, and only at the length that replica last saw: the lease keeps two replicas
//! from running a session's turns at once, and its fencing token with the expected length
//! keeps a replica whose lease ran out (a pause, a partition) from writing after another took
//! over. A replica that is refused reloads the session from the store before it answers again.
//!
//! Keys (`PREFIX` below): `{id}` is the session's uuid, braced so that one session's keys hash
//! to one slot.
//! - `rp:{id}:log`: the session's entries, oldest first.
//! - `rp:{id}:lease`: `holder:token` while a replica holds the session, with an expiry.
//! - `rp:{id}:fence`: the last token handed out for the session (tokens only grow).
//! - `rp:sessions`: every session, scored by creation time.

mod store;
