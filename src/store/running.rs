//! Which stages are running now. Commit markers say only what is done, so a process
//! running a stage keeps a file of its own fresh, `_running/<stage>.json`, rewriting its
//! heartbeat every [`HEARTBEAT`] until the stage commits or fails and the file goes. A
//! file whose heartbeat is older than [`STALE`] was left by a process that died: its stage
//! is not running.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::layout::{RUNNING_DIR, Stage, StageId};
use super::{Result, RunStore};

pub const HEARTBEAT: Duration = Duration::from_secs(10);
pub const STALE: Duration = Duration::from_secs(45);

/// What `_running/<stage>.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub stage: Stage,
    pub iteration: Option<u32>,
    /// (index, count) of a sharded stage.
    pub shard: Option<(u32, u32)>,
    pub host: String,
    pub pid: u32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
}

impl Running {
    pub fn stage_id(&self) -> StageId {
        let id = StageId { stage: self.stage, iteration: self.iteration, shard: None };
        match self.shard {
            Some((index, count)) => id.with_shard(index, count),
            None => id,
        }
    }

    /// Whether the process that runs it was alive at `now` by its heartbeat.
    pub fn is_fresh(&self, now: DateTime<Utc>) -> bool {
        (now - self.heartbeat_at).to_std().map_or(true, |age| age <= STALE)
    }
}

fn file_of(id: &StageId) -> String {
    let at = id.iteration.map_or("run".to_string(), |k| k.to_string());
    match id.shard {
        Some(shard) => format!("{RUNNING_DIR}/{}-{at}-shard{}of{}.json", id.stage, shard.index, shard.count),
        None => format!("{RUNNING_DIR}/{}-{at}.json", id.stage),
    }
}

impl RunStore {
    /// Writes (or refreshes) the running file of stage `id`, begun at `started_at`.
    pub async fn mark_running(&self, id: &StageId, started_at: DateTime<Utc>) -> Result<()> {
        let running = Running {
            stage: id.stage,
            iteration: id.iteration,
            shard: id.shard.map(|s| (s.index, s.count)),
            host: hostname(),
            pid: std::process::id(),
            started_at,
            heartbeat_at: Utc::now(),
        };
        self.put_file(&file_of(id), serde_json::to_vec_pretty(&running).expect("serialises")).await
    }

    /// Removes the running file of stage `id`.
    pub async fn clear_running(&self, id: &StageId) -> Result<()> {
        self.delete_if_present(&file_of(id)).await
    }

    /// The stages whose running file is fresh: running now, in some process.
    pub async fn running(&self) -> Result<Vec<Running>> {
        let now = Utc::now();
        let mut running = Vec::new();
        for path in self.list_relative(RUNNING_DIR).await? {
            // A file just gone (its stage committed) or unreadable is no stage running.
            let Ok(Some(bytes)) = self.get(&path).await else { continue };
            if let Ok(file) = serde_json::from_slice::<Running>(&bytes)
                && file.is_fresh(now)
            {
                running.push(file);
            }
        }
        running.sort_by_key(|r| r.stage_id());
        Ok(running)
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_older_than_stale_is_a_dead_process() {
        let now = Utc::now();
        let at = |seconds_ago: i64| Running {
            stage: Stage::Rollout,
            iteration: Some(3),
            shard: None,
            host: "h".into(),
            pid: 1,
            started_at: now,
            heartbeat_at: now - chrono::Duration::seconds(seconds_ago),
        };
        assert!(at(0).is_fresh(now));
        assert!(at(STALE.as_secs() as i64).is_fresh(now));
        assert!(!at(STALE.as_secs() as i64 + 1).is_fresh(now));
        // A clock a little ahead on the writer's machine is still alive.
        assert!(at(-5).is_fresh(now));
    }

    #[test]
    fn each_stage_and_shard_has_its_own_file() {
        assert_eq!(file_of(&StageId::at(Stage::Rollout, 3)), "_running/rollout-3.json");
        assert_eq!(file_of(&StageId::run_level(Stage::Update)), "_running/update-run.json");
        assert_eq!(file_of(&StageId::at(Stage::Rollout, 3).with_shard(1, 4)), "_running/rollout-3-shard1of4.json");
    }
}
