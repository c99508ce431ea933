//! Garbage collection: delete what no commit marker names.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use crate::store::{Result, RunStore, layout};

/// What `gc` deleted, or would delete with `dry_run`.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Relative path and size of each orphan removed.
    pub deleted: Vec<(String, u64)>,
    /// Orphans younger than the grace period, left for a stage that may still commit them.
    pub spared: Vec<String>,
}

pub(super) async fn collect(store: &RunStore, grace: Duration, dry_run: bool) -> Result<GcReport> {
    // A marker that cannot be read aborts here: its files are never taken for orphans.
    let markers = store.markers().await?;
    let committed: HashSet<&str> =
        markers.iter().flat_map(|m| m.marker.files.iter().map(|f| f.path.as_str())).collect();
    let cutoff = Utc::now() - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);

    let root = store.root().clone();
    let objects: Vec<_> =
        store.object_store().list(Some(&root)).try_collect().await.map_err(|e| store.object_error("list", "", e))?;
    let mut report = GcReport::default();
    let mut doomed = Vec::new();
    for meta in objects {
        let relative = store.relative(&meta.location);
        let is_marker = relative.starts_with(&format!("{}/", layout::COMMITS_DIR))
            || relative.starts_with(&format!("{}/", layout::CONFIG_HISTORY_DIR))
            || relative.starts_with(&format!("{}/", layout::PRUNED_DIR))
            || relative.starts_with(&format!("{}/", layout::LOGS_DIR));
        if is_marker || relative == layout::RUN_CONFIG || committed.contains(relative.as_str()) {
            continue;
        }
        if meta.last_modified > cutoff {
            report.spared.push(relative);
        } else {
            report.deleted.push((relative, meta.size));
            doomed.push(meta.location);
        }
    }
    if !dry_run {
        let deletes: Vec<_> = doomed.iter().map(|location| delete(store, location)).collect();
        futures::stream::iter(deletes).buffer_unordered(super::CONCURRENCY).try_for_each(|()| async { Ok(()) }).await?;
    }
    report.deleted.sort();
    report.spared.sort();
    Ok(report)
}

/// Deletes one orphan; one already gone (another gc) is fine.
async fn delete(store: &RunStore, location: &object_store::path::Path) -> Result<()> {
    match store.object_store().delete(location).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(store.object_error("delete", &store.relative(location), e)),
    }
}
