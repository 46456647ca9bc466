//! The trainer's control of the whole fleet through any one replica: `/pause`, `/resume` and
//! `/weight_version` are kept in the store and followed by every replica within a tick, and
//! each replica reports its turns there, so that `/health` on any replica shows the fleet's.
//!
//! Keys:
//! - `rp:control`: a hash; `pause` (the pause in force, JSON) and `weight_version`, each
//!   absent when there is none.
//! - `rp:replicas`: a hash; each replica's last report (JSON), stamped with the store's clock;
//!   a report older than two seconds (a replica killed or cut off) no longer counts.

use super::{Fleet, StoreError};
use crate::turn::Pipeline;
use crate::turn::gate::{Gate, Pause};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How often a replica reads the control and reports its turns.
const TICK: Duration = Duration::from_millis(200);
/// How long a replica's report counts after it was made: a replica that stopped reporting
/// (killed, cut off) is no longer part of the fleet's numbers.
const REPORT_LIFE: Duration = Duration::from_secs(2);

/// What a replica reports each tick.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    turns_under_way: usize,
    turns_at_backend: usize,
    /// When the pause it follows began (the pause's `since`), when paused.
    paused_since: Option<f64>,
}

/// The fleet's numbers, for `/health` and `/pause`'s reply.
#[derive(Debug, Clone, Serialize)]
pub struct FleetHealth {
    /// Replicas that reported within the last two seconds.
    pub replicas: usize,
    /// Of those, the ones that follow the pause in force (all of them when not paused): once
    /// every replica follows it and `turns_at_backend` is 0, no turn is at a backend.
    pub replicas_paused: usize,
    /// Turns under way on every replica.
    pub turns_under_way: usize,
    /// Turns at a backend from every replica, and one more for each replica that does not
    /// follow the pause in force yet (it may still start one): a trainer waits for 0.
    pub turns_at_backend: usize,
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serializes")
}

impl Fleet {
    /// Pauses the fleet (and this replica at once); returns the pause this replica had.
    pub async fn pause(&self, gate: &Gate, pause: Pause) -> Result<Option<Pause>, StoreError> {
        let _one_change = self.control.lock().await;
        self.store
            .set_control("pause", Some(&to_json(&pause)))
            .await?;
        Ok(gate.pause(pause))
    }

    /// Resumes the fleet (and this replica at once); returns the pause this replica had.
    pub async fn resume(&self, gate: &Gate) -> Result<Option<Pause>, StoreError> {
        let _one_change = self.control.lock().await;
        self.store.set_control("pause", None).await?;
        Ok(gate.resume())
    }

    /// Announces the weight version to the fleet (and this replica at once).
    pub async fn set_weight_version(
        &self,
        gate: &Gate,
        version: Option<String>,
    ) -> Result<(), StoreError> {
        let _one_change = self.control.lock().await;
        self.store
            .set_control("weight_version", version.as_deref())
            .await?;
        gate.set_weight_version(version);
        Ok(())
    }

    /// The fleet's numbers, from every replica's last report, against the pause the store
    /// has (which a replica asked right after another was paused may not follow yet).
    pub async fn health(&self) -> Result<FleetHealth, StoreError> {
        let (pause, _) = self.store.control().await?;
        let pause: Option<Pause> = pause.and_then(|p| serde_json::from_str(&p).ok());
        let reports: Vec<Report> = self
            .store
            .reports(REPORT_LIFE)
            .await?
            .iter()
            .filter_map(|report| serde_json::from_str(report).ok())
            .collect();
        let since = pause.map(|pause| pause.since);
        let replicas_paused = reports
            .iter()
            .filter(|r| since.is_none() || r.paused_since == since)
            .count();
        let at_backend: usize = reports.iter().map(|r| r.turns_at_backend).sum();
        Ok(FleetHealth {
            replicas: reports.len(),
            replicas_paused,
            turns_under_way: reports.iter().map(|r| r.turns_under_way).sum(),
            turns_at_backend: at_backend + (reports.len() - replicas_paused),
        })
    }

    /// Follows the fleet's control and reports this replica's turns, every tick, for as long
    /// as the replica runs.
    pub async fn follow(self: std::sync::Arc<Self>, pipeline: Pipeline) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(error) = self.follow_once(&pipeline).await {
                tracing::warn!(%error, "the fleet's control could not be read");
            }
        }
    }

    async fn follow_once(&self, pipeline: &Pipeline) -> Result<(), StoreError> {
        let gate = &pipeline.gate;
        {
            let _one_change = self.control.lock().await;
            let (pause, version) = self.store.control().await?;
            let pause: Option<Pause> = pause.and_then(|p| serde_json::from_str(&p).ok());
            if pause != gate.paused() {
                tracing::info!(paused = pause.is_some(), "following the fleet's pause");
                match pause {
                    Some(pause) => drop(gate.pause(pause)),
                    None => drop(gate.resume()),
                }
            }
            if version != gate.weight_version() {
                gate.set_weight_version(version);
            }
        }
        // Made after the pause is followed: a report that says so counts no turn started since.
        let report = Report {
            turns_under_way: pipeline.turns_under_way(),
            turns_at_backend: gate.turns_at_backend(),
            paused_since: gate.paused().map(|pause| pause.since),
        };
        self.store.report(&to_json(&report)).await
    }
}
