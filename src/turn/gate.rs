//! The RL control plane's hold on new turns: while the proxy is paused (around a weight
//! update) a turn that has not reached the backend yet waits — or, in `reject` mode, is
//! refused — and turns already sampling finish. The gate also holds the weight version the
//! trainer announced, recorded on turns whose backend reports none.

use super::TurnError;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::watch;

/// What paused turns do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// Wait until the proxy resumes (streams are kept alive meanwhile).
    Wait,
    /// Be refused at once (429 with `Retry-After`).
    Reject,
}

/// What turns already at a backend do while paused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InFlight {
    /// They finish (a trainer waits for `turns_at_backend` to reach 0).
    #[default]
    Finish,
    /// Each backend that can freezes them where they are, their KV cache kept, until the
    /// resume: the weights can change under them (their samples then span both versions).
    Keep,
}

/// A pause in force.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Pause {
    /// What new turns do.
    pub mode: PauseMode,
    /// What turns at a backend do.
    pub in_flight: InFlight,
    /// Why, as the operator said.
    pub reason: Option<String>,
    /// Since when, seconds since the epoch.
    pub since: f64,
}

/// The gate every turn passes before it reaches a backend.
#[derive(Debug)]
pub struct Gate {
    pause: watch::Sender<Option<Pause>>,
    weight_version: Mutex<Option<String>>,
    /// Turns past the gate: at a backend (what a trainer waits for before swapping weights).
    at_backend: std::sync::Arc<AtomicUsize>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            pause: watch::Sender::new(None),
            weight_version: Mutex::new(None),
            at_backend: Default::default(),
        }
    }
}

/// A turn past the gate, at a backend until dropped.
#[derive(Debug)]
pub struct AtBackend(std::sync::Arc<AtomicUsize>);

impl Drop for AtBackend {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    /// Pauses new turns, replacing a pause in force; returns that one.
    pub fn pause(&self, pause: Pause) -> Option<Pause> {
        self.pause.send_replace(Some(pause))
    }

    /// Lets turns through again; returns the pause that was in force.
    pub fn resume(&self) -> Option<Pause> {
        self.pause.send_replace(None)
    }

    /// The pause in force, if any.
    pub fn paused(&self) -> Option<Pause> {
        self.pause.borrow().clone()
    }

    /// Turns at a backend now (past the gate).
    pub fn turns_at_backend(&self) -> usize {
        self.at_backend.load(Ordering::Acquire)
    }

    /// Returns once turns may go on: at once when not paused, after the resume when paused
    /// in `wait` mode; an error when paused in `reject` mode. The turn counts as at a backend
    /// while the guard lives.
    pub async fn pass(&self) -> Result<AtBackend, TurnError> {
        let mut watching = self.pause.subscribe();
        loop {
            match &*watching.borrow_and_update() {
                None => {
                    self.at_backend.fetch_add(1, Ordering::AcqRel);
                    return Ok(AtBackend(self.at_backend.clone()));
                }
                Some(pause) if pause.mode == PauseMode::Reject => {
                    return Err(TurnError::Paused {
                        reason: pause.reason.clone(),
                    });
                }
                Some(_) => {}
            }
            // The sender lives as long as the gate, which outlives every turn.
            let _ = watching.changed().await;
        }
    }

    /// Sets the weight version turns are recorded with when their backend reports none.
    pub fn set_weight_version(&self, version: Option<String>) {
        *self.weight_version.lock().expect("weight version lock") = version;
    }

    /// The weight version the trainer announced last.
    pub fn weight_version(&self) -> Option<String> {
        self.weight_version
            .lock()
            .expect("weight version lock")
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pause(mode: PauseMode) -> Pause {
        Pause {
            mode,
            in_flight: InFlight::Finish,
            reason: Some("weights".into()),
            since: 0.0,
        }
    }

    #[tokio::test]
    async fn turns_wait_while_paused_and_go_on_when_resumed() {
        let gate = std::sync::Arc::new(Gate::default());
        gate.pass().await.unwrap();
        gate.pause(pause(PauseMode::Wait));
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.pass().await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "held while paused");
        assert_eq!(
            gate.turns_at_backend(),
            0,
            "a held turn is not at a backend"
        );
        assert_eq!(gate.resume(), Some(pause(PauseMode::Wait)));
        let passed = waiting.await.unwrap().unwrap();
        assert_eq!(gate.turns_at_backend(), 1);
        drop(passed);
        assert_eq!(gate.turns_at_backend(), 0);
    }

    #[tokio::test]
    async fn a_reject_pause_refuses_and_a_switch_to_reject_refuses_the_waiting() {
        let gate = std::sync::Arc::new(Gate::default());
        gate.pause(pause(PauseMode::Wait));
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.pass().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        gate.pause(pause(PauseMode::Reject));
        assert!(matches!(
            waiting.await.unwrap(),
            Err(TurnError::Paused { .. })
        ));
        assert!(gate.pass().await.is_err());
    }
}
