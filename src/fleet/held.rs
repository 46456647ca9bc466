//! A turn's lease on its session, renewed while the turn runs and given back when it ends.

use super::store::{Lease, Store};
use super::{Applied, LEASE};
use crate::session::SessionHold;
use std::sync::Arc;

/// Renews `lease` until the returned hold is dropped, then gives it back (after which this
/// replica's changes of the session take leases of their own again).
pub(super) fn keep(store: Store, applied: Arc<Applied>, lease: Lease) -> SessionHold {
    let (let_go, dropped) = tokio::sync::oneshot::channel();
    tokio::spawn(renew_until(store, applied, lease, dropped));
    SessionHold::new(let_go)
}

async fn renew_until(
    store: Store,
    applied: Arc<Applied>,
    lease: Lease,
    mut dropped: tokio::sync::oneshot::Receiver<()>,
) {
    let mut tick = tokio::time::interval(LEASE / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let session = lease.id;
    loop {
        tokio::select! {
            _ = &mut dropped => break,
            _ = tick.tick() => match store.renew(&lease, LEASE).await {
                Ok(true) => {}
                // Another replica may have it now: this one's changes are fenced off.
                Ok(false) => {
                    tracing::warn!(%session, "a turn's lease on its session ran out");
                    break;
                }
                // Tried again at the next tick; the lease lasts three.
                Err(error) => tracing::warn!(%session, %error, "renewing a lease failed"),
            },
        }
    }
    let mut record = applied.record.lock().await;
    if record.held.as_ref() == Some(&lease) {
        record.held = None;
    }
    drop(record);
    let _ = store.release(&lease).await;
}
