//! Fidelity telemetry: each turn that could not extend a node is kept with where it parted
//! from the closest node — the first token position at which the new prompt and that node
//! differ, and the ids on both sides of it — so a user can see why a rollout split
//! (`GET /{uuid}/divergences`). Computed when the turn is applied, so a restart that replays
//! the journal rebuilds the very same reports.

use super::{Divergence, Node};
use serde::Serialize;
use std::collections::VecDeque;

/// Reports kept per session; the oldest are dropped first.
const KEPT: usize = 64;
/// Ids shown before the first difference.
const BEFORE: usize = 8;
/// Ids shown from the first difference on.
const AFTER: usize = 24;

/// One turn that started a new node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DivergenceReport {
    /// The node the turn started.
    pub node: usize,
    /// Why, as recorded on that node.
    pub divergence: Divergence,
    /// The existing node sharing the longest prefix with the new prompt, if any.
    pub closest_node: Option<usize>,
    /// The first position where the new prompt and that node differ (their shared length).
    pub position: usize,
    /// Where the window below starts.
    pub window_start: usize,
    /// The closest node's ids around `position` (what the session had).
    pub expected: Vec<u32>,
    /// The new prompt's ids around `position` (what the request rendered to).
    pub received: Vec<u32>,
}

/// A session's reports, newest last.
#[derive(Debug, Default)]
pub struct Divergences(VecDeque<DivergenceReport>);

impl Divergences {
    /// Notes that `prompt` started node `node` for `divergence`, the session's earlier nodes
    /// being `nodes`.
    pub fn note(&mut self, node: usize, divergence: &Divergence, prompt: &[u32], nodes: &[Node]) {
        let mut ids = Vec::new();
        let mut closest: Option<(usize, usize, Vec<u32>)> = None;
        for (index, candidate) in nodes.iter().enumerate() {
            ids.clear();
            candidate.copy_tokens_into(&mut ids);
            let shared = ids.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            if closest.as_ref().is_none_or(|(_, best, _)| shared > *best) {
                closest = Some((index, shared, ids.clone()));
            }
        }
        let (closest_node, position, expected) = match closest {
            Some((index, shared, ids)) => (Some(index), shared, ids),
            None => (None, 0, Vec::new()),
        };
        let window_start = position.saturating_sub(BEFORE);
        let window = |ids: &[u32]| {
            ids[window_start.min(ids.len())..(position + AFTER).min(ids.len())].to_vec()
        };
        if self.0.len() == KEPT {
            self.0.pop_front();
        }
        self.0.push_back(DivergenceReport {
            node,
            divergence: divergence.clone(),
            closest_node,
            position,
            window_start,
            expected: window(&expected),
            received: window(prompt),
        });
    }

    /// The reports, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &DivergenceReport> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_points_at_the_first_difference_with_the_closest_node() {
        let mut far = Node::default();
        far.push_prompt(&[9, 9, 9]);
        let mut near = Node::default();
        near.push_prompt(&(0..40).collect::<Vec<u32>>());
        let mut prompt: Vec<u32> = (0..40).collect();
        prompt[20] = 1000;
        let divergence = Divergence {
            reason: "history_edited",
            detail: String::new(),
            from_node: Some(1),
            token_position: Some(20),
        };
        let mut reports = Divergences::default();
        reports.note(2, &divergence, &prompt, &[far, near]);
        let report = reports.iter().next().unwrap();
        assert_eq!((report.closest_node, report.position), (Some(1), 20));
        assert_eq!(report.window_start, 12);
        assert_eq!(report.expected, (12..40).collect::<Vec<u32>>());
        assert_eq!(report.received[8], 1000);
        assert_eq!(report.received.len(), 28);
    }
}
