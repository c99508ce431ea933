//! Looking into a run: one task's sampling tree (`petting show`), the selected
//! trajectories as chat transcripts (`petting export`) and a page of charts and tables
//! (`petting report`).

pub mod chart;
pub mod compare;
pub mod export;
pub mod panels;
pub mod report;
pub mod summary;
pub mod tree;

use std::collections::HashMap;

use crate::store::{self, RunStore, Stage};
use crate::tables::{SampleRow, TurnRow};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),

    #[error(
        "{url} has no committed rollout for iteration {iteration} (`petting status {url}` lists what is committed)"
    )]
    NoRollout { url: String, iteration: u32 },

    #[error("iteration {iteration} of {url} has no task {task:?}; its tasks include {examples}")]
    NoTask { url: String, iteration: u32, task: String, examples: String },

    #[error("cannot encode the transcripts: {0}")]
    Export(String),

    #[error(transparent)]
    Sql(#[from] crate::sql::Error),

    #[error(transparent)]
    Chart(#[from] chart::ChartError),

    #[error(transparent)]
    Config(#[from] crate::config::Error),

    #[error("cannot format a query result for the report: {0}")]
    Report(String),

    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

/// Every candidate of one task in one iteration, with the advantages the update used
/// (empty while the advantage stage is not committed).
#[derive(Debug, Clone)]
pub struct TaskTree {
    pub turns: Vec<TurnRow>,
    pub advantages: HashMap<String, f64>,
}

/// Every candidate of the committed rollout of `iteration`.
pub async fn iteration_turns(store: &RunStore, iteration: u32) -> Result<Vec<TurnRow>, Error> {
    let url = store.url().to_string();
    let rollout = store.committed(Stage::Rollout, Some(iteration)).await?.ok_or(Error::NoRollout { url, iteration })?;
    let markers: Vec<_> = rollout.iter().map(|m| &m.marker).collect();
    Ok(store.read_rows(&markers).await?)
}

/// Reads one task's candidates from the committed rollout of `iteration`.
pub async fn task_tree(store: &RunStore, iteration: u32, task: &str) -> Result<TaskTree, Error> {
    let url = store.url().to_string();
    let all = iteration_turns(store, iteration).await?;
    let turns: Vec<TurnRow> = all.iter().filter(|t| t.task_id == task).cloned().collect();
    if turns.is_empty() {
        let mut ids: Vec<&str> = all.iter().map(|t| t.task_id.as_str()).collect();
        ids.dedup();
        let examples = ids.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        return Err(Error::NoTask { url, iteration, task: task.to_string(), examples });
    }
    let mut advantages = HashMap::new();
    if let Some(advantage) = store.committed(Stage::Advantage, Some(iteration)).await? {
        let markers: Vec<_> = advantage.iter().map(|m| &m.marker).collect();
        let samples: Vec<SampleRow> = store.read_rows(&markers).await?;
        let ids: std::collections::HashSet<&str> = turns.iter().map(|t| t.candidate_id.as_str()).collect();
        advantages.extend(
            samples
                .into_iter()
                .filter(|s| ids.contains(s.candidate_id.as_str()))
                .map(|s| (s.candidate_id, s.advantage)),
        );
    }
    Ok(TaskTree { turns, advantages })
}
