//! Garbage collection: delete what no commit marker names.
//!
//! A run store is known by its commit markers, never by a file name: a folder without
//! markers is refused whole. Only files shaped as a stage attempt's output
//! ([`layout::is_attempt_output`]) can be orphans; anything else in the folder (a run
//! file, a dataset, a program) is not the store's and is never touched. A store that
//! holds another store, or lies inside one, is refused, as the two would claim the
//! same folders.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use crate::store::{Error, Result, RunStore, layout};

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
    if markers.is_empty() {
        return Err(Error::NotAStore { url: store.url().to_string() });
    }
    if let Some(outer) = store.enclosing_store().await? {
        return Err(Error::NestedStore { outer, inner: store.url().to_string() });
    }
    let committed: HashSet<&str> =
        markers.iter().flat_map(|m| m.marker.files.iter().map(|f| f.path.as_str())).collect();
    let cutoff = Utc::now() - chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);

    let root = store.root().clone();
    let objects: Vec<_> =
        store.object_store().list(Some(&root)).try_collect().await.map_err(|e| store.object_error("list", "", e))?;
    let mut report = GcReport::default();
    let mut doomed = Vec::new();
    if let Some(inner) =
        objects.iter().find_map(|meta| nested_store(&store.relative(&meta.location)).map(str::to_string))
    {
        return Err(Error::NestedStore { outer: store.url().to_string(), inner: store.child_url(&inner) });
    }
    for meta in objects {
        let relative = store.relative(&meta.location);
        if !layout::is_attempt_output(&relative) || committed.contains(relative.as_str()) {
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

/// The folder, relative to a store, of another store that holds the object at
/// `relative`: the part before a `_commits` folder below the store's own.
fn nested_store(relative: &str) -> Option<&str> {
    let at = relative.find(&format!("/{}/", layout::COMMITS_DIR))?;
    Some(&relative[..at])
}

/// Deletes one orphan; one already gone (another gc) is fine.
async fn delete(store: &RunStore, location: &object_store::path::Path) -> Result<()> {
    match store.object_store().delete(location).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(store.object_error("delete", &store.relative(location), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commits_folder_below_the_root_is_a_nested_store() {
        assert_eq!(nested_store("runs/a/_commits/prepare-data.json"), Some("runs/a"));
        assert_eq!(nested_store("x/_commits/iteration=0/rollout.json"), Some("x"));
        assert_eq!(nested_store("_commits/prepare-data.json"), None);
        assert_eq!(nested_store("turns/iteration=0/part-0-a-0.parquet"), None);
    }
}
