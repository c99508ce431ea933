//! Where a run stands against its schedule, from its store alone: what `petting status`
//! opens with and the dashboard's run list shows.

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::config::RunConfig;
use crate::store::running::Running;
use crate::store::status::{StageState, StageStatus};
use crate::store::{Stage, StageId, StoredMarker};

/// Where a run stands: its iterations and stages committed against its schedule, the
/// last commit, the stages running now (by their fresh running files), the next stage
/// and, while stages are left, when it would end at the pace of its commits so far.
pub struct Headline {
    pub iterations: u32,
    pub iterations_done: u32,
    pub stages: usize,
    pub stages_done: usize,
    pub last: Option<(StageId, DateTime<Utc>)>,
    pub next: Option<StageId>,
    /// Stages (shards apart) some process is running now.
    pub running: Vec<StageId>,
    pub eta_seconds: Option<f64>,
}

impl Headline {
    pub fn of(config: &RunConfig, statuses: &[StageStatus], markers: &[StoredMarker], running: &[Running]) -> Headline {
        let committed = |id: &StageId| statuses.iter().any(|s| is_of(s, id) && s.state == StageState::Committed);
        let schedule = super::schedule(config);
        let updates_done = schedule
            .iter()
            .filter(|id| id.stage == Stage::Update && id.iteration.is_some())
            .filter(|id| committed(id))
            .count() as u32;
        let iterations_done = config.first_iteration() + updates_done;
        let last = markers.iter().max_by_key(|m| m.marker.finished_at);
        let first = markers.iter().map(|m| m.marker.started_at).min();
        let left = config.iterations.saturating_sub(iterations_done);
        let eta_seconds = match (first, last) {
            (Some(first), Some(last)) if updates_done > 0 && left > 0 => {
                let span = (last.marker.finished_at - first).num_milliseconds() as f64 / 1e3;
                Some(span / f64::from(updates_done) * f64::from(left))
            }
            _ => None,
        };
        Headline {
            iterations: config.iterations,
            iterations_done,
            stages: schedule.len(),
            stages_done: schedule.iter().filter(|id| committed(id)).count(),
            last: last.map(|m| (StageId { shard: None, ..m.marker.stage_id() }, m.marker.finished_at)),
            next: schedule.into_iter().find(|id| !committed(id)),
            running: running_stages(running),
            eta_seconds,
        }
    }

    /// `complete`, `running` (some stage is), or `incomplete` (stopped, or between stages).
    pub fn state(&self) -> &'static str {
        match (self.next, self.running.is_empty()) {
            (None, _) => "complete",
            (Some(_), false) => "running",
            (Some(_), true) => "incomplete",
        }
    }

    pub fn as_json(&self) -> serde_json::Value {
        json!({
            "state": self.state(),
            "iterations": self.iterations,
            "iterations_done": self.iterations_done,
            "stages": self.stages,
            "stages_done": self.stages_done,
            "last": self.last.as_ref().map(|(id, at)| json!({"stage": id.to_string(), "finished_at": at.to_rfc3339()})),
            "next": self.next.map(|id| id.to_string()),
            "running": self.running.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "eta_seconds": self.eta_seconds,
        })
    }
}

/// Whether `status` is the stage `id` (all of its shards).
pub fn is_of(status: &StageStatus, id: &StageId) -> bool {
    status.stage == id.stage && status.iteration == id.iteration
}

/// The stages of `running`, each once however many of its shards run.
fn running_stages(running: &[Running]) -> Vec<StageId> {
    let mut stages: Vec<StageId> = running.iter().map(|r| StageId { shard: None, ..r.stage_id() }).collect();
    stages.sort();
    stages.dedup();
    stages
}
