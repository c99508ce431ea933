//! Pruning: deleting committed checkpoint files a run no longer needs, on the record.
//!
//! Every update commits a policy's weights and its AdamW state (twice the weights' size
//! in f32): ten iterations of a full-weight 135M model hold 16 GB, of an 8B model about a
//! terabyte. Most of it is never read again: the next update continues from the newest
//! version only. `policies::Retention` says what to keep; pruning deletes the rest.
//!
//! Markers stay immutable (later stages record their hashes). Instead a prune record,
//! `_pruned/<utc time>-<id>.json`, names every file it deletes and is written before the
//! first delete, so a prune that crashes halfway is finished by running it again, a read
//! of a pruned file says it was pruned (not that the run is damaged), and `verify` checks
//! everything else.

use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::store::{FileEntry, Result, RunStore, layout};

/// Bumped when the record's layout changes incompatibly.
const RECORD_FORMAT: u32 = 1;

/// What one prune deleted, as stored under `_pruned/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneRecord {
    pub format: u32,
    pub pruned_at: DateTime<Utc>,
    /// Why: the retention that doomed these files, in words.
    pub reason: String,
    pub files: Vec<FileEntry>,
}

/// What [`RunStore::prune`] deleted, or would delete with `dry_run`.
#[derive(Debug, Default)]
pub struct PruneReport {
    /// The record written, if anything was newly pruned.
    pub record: Option<String>,
    pub files: Vec<FileEntry>,
}

impl PruneReport {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

impl RunStore {
    /// Deletes committed files (`doomed`), recording them with `reason` first. Files an
    /// earlier prune recorded are deleted again if still there (a crashed prune).
    pub async fn prune(&self, doomed: &[FileEntry], reason: &str, dry_run: bool) -> Result<PruneReport> {
        let recorded = self.pruned().await?;
        let new: Vec<FileEntry> = doomed.iter().filter(|f| !recorded.contains_key(&f.path)).cloned().collect();
        if dry_run {
            return Ok(PruneReport { record: None, files: new });
        }
        let record = if new.is_empty() { None } else { Some(self.write_record(reason, &new).await?) };
        let deletes: Vec<_> = doomed.iter().map(|f| self.delete_if_present(&f.path)).collect();
        futures::stream::iter(deletes).buffer_unordered(super::CONCURRENCY).try_for_each(|()| async { Ok(()) }).await?;
        Ok(PruneReport { record, files: new })
    }

    async fn write_record(&self, reason: &str, files: &[FileEntry]) -> Result<String> {
        let now = Utc::now();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = format!("{}/{}-{}.json", layout::PRUNED_DIR, now.format("%Y%m%dT%H%M%S%.6fZ"), &id[..12]);
        let record =
            PruneRecord { format: RECORD_FORMAT, pruned_at: now, reason: reason.to_string(), files: files.to_vec() };
        let json = serde_json::to_vec_pretty(&record).expect("a prune record serialises");
        self.store
            .put_opts(&self.path(&path), Bytes::from(json).into(), object_store::PutMode::Create.into())
            .await
            .map_err(|e| self.object_error("create", &path, e))?;
        Ok(path)
    }

    /// Every pruned file, with the record that pruned it.
    pub async fn pruned(&self) -> Result<BTreeMap<String, String>> {
        let mut pruned = BTreeMap::new();
        for path in self.list_relative(layout::PRUNED_DIR).await? {
            let bytes = self.get(&path).await?.unwrap_or_default();
            let record: PruneRecord = serde_json::from_slice(&bytes).map_err(|e| super::Error::InvalidMarker {
                url: self.url.clone(),
                path: path.clone(),
                reason: e.to_string(),
            })?;
            for file in record.files {
                pruned.insert(file.path, path.clone());
            }
        }
        Ok(pruned)
    }

    /// The error for a committed file that is not there: pruned, or lost.
    pub(super) async fn missing(&self, entry: &FileEntry) -> super::Error {
        match self.pruned().await {
            Ok(pruned) => match pruned.get(&entry.path) {
                Some(record) => {
                    super::Error::Pruned { url: self.url.clone(), path: entry.path.clone(), record: record.clone() }
                }
                None => super::Error::MissingFile { url: self.url.clone(), path: entry.path.clone() },
            },
            Err(e) => e,
        }
    }
}
