//! Reading the `tasks` table of a split.

use crate::store::{Partition, RunStore, Split, Stage, StageId, StoredMarker};
use crate::tables::TaskRow;

use super::Error;

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
