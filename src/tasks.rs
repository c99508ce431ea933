//! The tasks a stage plays: a split of the committed `tasks` table, and the batch of
//! training tasks each iteration's rollout gets.
//!
//! Iteration k's batch is the k-th slice of B tasks of a per-epoch seeded shuffle of the
//! train split, so every task is seen once per epoch. A shard `i/n` keeps the tasks
//! whose position in the batch is i mod n.

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

/// The tasks of iteration k (or of one shard of it): `tasks_per_iteration` of them
/// (`rollout.tasks_per_iteration`), shuffled by the run's seed.
pub fn batch(
    train: &[TaskRow],
    tasks_per_iteration: u32,
    seed: u64,
    iteration: u32,
    shard: Option<Shard>,
) -> Vec<TaskRow> {
    batch_indices(train.len(), tasks_per_iteration as usize, seed, iteration)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| shard.is_none_or(|s| s.holds(*i)))
        .map(|(_, t)| train[t].clone())
        .collect()
}

/// Indices into the train split of iteration k's batch of `b` of `n` tasks: positions
/// k·b .. (k+1)·b of the epochs' orders laid end to end.
///
/// A batch that starts near the end of one epoch and ends in the next would hold a task
/// twice if both parts drew it (two rollouts of one task, with one task id, in one
/// iteration). So each epoch's order is its seeded permutation with, where a batch
/// straddles its start, the tasks that batch already holds moved back to just after the
/// batch: no batch holds a task twice, and every epoch still plays each task once.
fn batch_indices(n: usize, b: usize, seed: u64, iteration: u32) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let first = iteration as usize * b;
    let mut orders: Vec<Vec<usize>> = Vec::new();
    let last_epoch = (first + b - 1) / n;
    for epoch in 0..=last_epoch {
        let order = epoch_permutation(n, stream(&[seed, Key::ROLLOUT, epoch as u64]));
        let order = match orders.last() {
            Some(previous) => without_straddled(order, previous, n, b, epoch),
            None => order,
        };
        orders.push(order);
    }
    (first..first + b).map(|position| orders[position / n][position % n]).collect()
}

/// `order` (of epoch `epoch`) with the tasks that the batch straddling its start took
/// from the end of `previous` moved back to just after that batch.
fn without_straddled(order: Vec<usize>, previous: &[usize], n: usize, b: usize, epoch: usize) -> Vec<usize> {
    let start = epoch * n;
    let from_previous = start % b;
    let here = (b - from_previous).min(n);
    if from_previous == 0 || from_previous >= n {
        return order;
    }
    let taken: Vec<usize> = previous[n - from_previous..].to_vec();
    let (mut head, mut moved, mut rest) = (Vec::with_capacity(n), Vec::new(), Vec::new());
    for task in order {
        if head.len() < here && !taken.contains(&task) {
            head.push(task);
        } else if head.len() < here {
            moved.push(task);
        } else {
            rest.push(task);
        }
    }
    head.extend(moved);
    head.extend(rest);
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_that_straddles_two_epochs_holds_each_task_once() {
        // 82 tasks, 8 a batch (pipelines/code.yaml): iteration 10 takes 2 tasks from the
        // end of epoch 0 and 6 from the start of epoch 1.
        for seed in 0..50 {
            for iteration in 0..40 {
                let batch = batch_indices(82, 8, seed, iteration);
                let mut unique = batch.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(unique.len(), 8, "seed {seed}, iteration {iteration}: {batch:?}");
            }
        }
    }

    #[test]
    fn every_epoch_plays_each_task_once() {
        // 5 tasks, 3 a batch: the epochs are positions 0-4, 5-9, 10-14 of iterations 0-4.
        for seed in 0..50 {
            let positions: Vec<usize> = (0..5).flat_map(|k| batch_indices(5, 3, seed, k)).collect();
            for epoch in positions.chunks(5) {
                let mut sorted = epoch.to_vec();
                sorted.sort();
                assert_eq!(sorted, [0, 1, 2, 3, 4], "seed {seed}: {positions:?}");
            }
            for batch in positions.chunks(3) {
                assert!(batch[0] != batch[1] && batch[1] != batch[2] && batch[0] != batch[2], "{positions:?}");
            }
        }
    }

    #[test]
    fn batches_inside_an_epoch_are_its_permutation() {
        let order = epoch_permutation(10, stream(&[7, Key::ROLLOUT, 0]));
        assert_eq!(batch_indices(10, 4, 7, 0), order[..4]);
        assert_eq!(batch_indices(10, 4, 7, 1), order[4..8]);
        // A whole-split batch never straddles.
        assert_eq!(batch_indices(10, 10, 7, 0), order);
    }
}
