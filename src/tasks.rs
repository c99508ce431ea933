//! The tasks a stage plays: a split of the committed `tasks` table, and the batch of
//! training tasks each iteration's rollout gets.
//!
//! Iteration k's batch is the k-th slice of B tasks of a per-epoch seeded shuffle of the
//! train split, so every task is seen once per epoch. A shard `i/n` keeps the tasks
//! whose position in the batch is i mod n.

use crate::config::RunConfig;
use crate::rng::{Key, epoch_permutation, stream};
use crate::store::{self, Partition, RunStore, Shard, Split, Stage, StageId, StoredMarker};
use crate::tables::TaskRow;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),

    #[error("{url} has no tasks yet: run prepare-data first")]
    NotPrepared { url: String },
}

/// The prepare-data marker and the tasks of `split`, in task-id order.
pub async fn read(store: &RunStore, split: Split) -> Result<(StoredMarker, Vec<TaskRow>), Error> {
    let prepared = store
        .marker(&StageId::run_level(Stage::PrepareData))
        .await?
        .ok_or(Error::NotPrepared { url: store.url().to_string() })?;
    let folder = format!("/{}/", Partition::Split(split).segment());
    let mut only_split = prepared.marker.clone();
    only_split.files.retain(|f| f.path.contains(&folder));
    let mut rows: Vec<TaskRow> = store.read_rows(&[&only_split]).await?;
    rows.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    Ok((prepared, rows))
}

/// The tasks of iteration k (or of one shard of it).
pub fn batch(train: &[TaskRow], config: &RunConfig, iteration: u32, shard: Option<Shard>) -> Vec<TaskRow> {
    let b = config.rollout.tasks_per_iteration as usize;
    let n = train.len();
    (0..b)
        .filter(|i| shard.is_none_or(|s| s.holds(*i)))
        .map(|i| {
            let position = iteration as usize * b + i;
            let epoch = (position / n) as u64;
            let order = epoch_permutation(n, stream(&[config.seed, Key::ROLLOUT, epoch]));
            train[order[position % n]].clone()
        })
        .collect()
}
