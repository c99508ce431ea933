//! The run store: a run's tables, checkpoints and commit markers in object storage.
//!
//! ```text
//!  stage attempt                          object store
//!  ─────────────                          ────────────
//!  StageWriter::write_table ──put──────►  turns/iteration=7/part-0-<attempt>-0.parquet   (invisible)
//!  StageWriter::write_file  ──put──────►  checkpoints/p/v000008.<attempt>/…              (invisible)
//!  StageWriter::finish ─► PendingCommit
//!  PendingCommit::commit ─put(Create)──►  _commits/iteration=7/rollout.json              (now all visible)
//! ```
//!
//! Contract, which every backend (local disk, memory, S3-compatible, GCS, Azure) meets
//! through `object_store`:
//! * **Atomic visibility.** A part is written whole under a name no other attempt uses,
//!   then the stage's marker is created with create-if-absent. Readers only read files a
//!   marker names, so a crash leaves orphans nothing reads, never half a table.
//! * **One winner per marker.** Two attempts racing on a stage both write their parts;
//!   exactly one creates the marker, the other gets [`Error::AlreadyCommitted`] and its
//!   parts stay invisible until `gc` removes them.
//! * **Verified reads.** The marker records each file's size and sha256; a file that no
//!   longer matches is reported as [`Error::Corrupt`] naming it, never read silently.

mod committed_view;
mod error;
mod gc;
pub mod layout;
mod location;
pub use location::absolute_path;
pub mod marker;
pub(crate) mod parquet_io;
mod prune;
pub mod running;
pub mod status;
mod writer;

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};

pub use committed_view::CommittedView;
pub use error::{Error, Result};
pub use gc::GcReport;
pub use layout::{Partition, Shard, Split, Stage, StageId};
pub use marker::{CheckpointRef, CommitMarker, FileEntry, InputRef, PolicyRef};
pub use prune::{PruneRecord, PruneReport};
pub use writer::{CommitInfo, PendingCommit, StageWriter};

use crate::schema::Table;
use crate::tables::Row;

/// How many objects are read or checked at once.
const CONCURRENCY: usize = 16;

/// One run, under one URL.
#[derive(Debug, Clone)]
pub struct RunStore {
    store: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
}

/// A commit marker as read from the store, with the hash downstream stages record.
#[derive(Debug, Clone)]
pub struct StoredMarker {
    pub path: String,
    pub sha256: String,
    pub marker: CommitMarker,
}

impl StoredMarker {
    pub fn input_ref(&self) -> InputRef {
        InputRef { marker: self.path.clone(), sha256: self.sha256.clone() }
    }
}

impl RunStore {
    /// Opens the run at `url` (a local path, `file://`, `memory://`, `s3://`, `gs://`,
    /// `az://`). Nothing is read or written yet.
    pub fn open(url: &str) -> Result<RunStore> {
        let location = location::resolve(url)?;
        Ok(RunStore { store: location.store, root: location.root, url: location.url })
    }

    /// A run at `root` of an existing object store (tests, decorated stores).
    pub fn from_object_store(store: Arc<dyn ObjectStore>, root: &str, url: &str) -> RunStore {
        RunStore { store, root: Path::from(root), url: url.to_string() }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The runs at or under `url`, down to `depth` folders below it: every folder that
    /// holds commit markers (a run appears once its first stage commits), sorted by URL.
    /// A run's own folders are not searched.
    pub async fn runs_under(url: &str, depth: usize) -> Result<Vec<RunStore>> {
        let top = RunStore::open(url)?;
        let mut found = Vec::new();
        let mut pending = vec![(top.root.clone(), 0)];
        while let Some((dir, level)) = pending.pop() {
            let prefix = (!dir.as_ref().is_empty()).then_some(&dir);
            let listing = match top.store.list_with_delimiter(prefix).await {
                Ok(listing) => listing,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(top.object_error("list", dir.as_ref(), e)),
            };
            if listing.common_prefixes.iter().any(|p| p.filename() == Some(layout::COMMITS_DIR)) {
                found.push(top.below(&dir));
            } else if level < depth {
                pending.extend(listing.common_prefixes.into_iter().map(|p| (p, level + 1)));
            }
        }
        found.sort_by(|a, b| a.url.cmp(&b.url));
        Ok(found)
    }

    /// The URL of the store whose commit markers lie in a folder above this one's, if any.
    pub async fn enclosing_store(&self) -> Result<Option<String>> {
        let parts: Vec<_> = self.root.parts().collect();
        for depth in (0..parts.len()).rev() {
            let above: Path = parts[..depth].iter().cloned().collect();
            let commits = above.join(layout::COMMITS_DIR);
            let listing = match self.store.list_with_delimiter(Some(&commits)).await {
                Ok(listing) => listing,
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(self.object_error("list", commits.as_ref(), e)),
            };
            if !listing.objects.is_empty() || !listing.common_prefixes.is_empty() {
                return Ok(Some(self.ancestor_url(parts.len() - depth)));
            }
        }
        Ok(None)
    }

    /// The URL of the folder `levels` above this store's.
    fn ancestor_url(&self, levels: usize) -> String {
        let mut url = self.url.trim_end_matches('/');
        for _ in 0..levels {
            url = url.rsplit_once('/').map_or(url, |(head, _)| head);
        }
        if url.ends_with("//") { format!("{url}/") } else { url.to_string() }
    }

    /// The URL of the folder `relative` under this store.
    fn child_url(&self, relative: &str) -> String {
        format!("{}/{relative}", self.url.trim_end_matches('/'))
    }

    /// The run at `dir`, a folder under this one's root.
    fn below(&self, dir: &Path) -> RunStore {
        let relative = self.relative(dir);
        let url = match relative.as_str() {
            "" => self.url.clone(),
            relative => format!("{}/{relative}", self.url.trim_end_matches('/')),
        };
        RunStore { store: self.store.clone(), root: dir.clone(), url }
    }

    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Object path of a path relative to the run.
    fn path(&self, relative: &str) -> Path {
        if self.root.as_ref().is_empty() {
            Path::from(relative)
        } else {
            Path::from(format!("{}/{relative}", self.root))
        }
    }

    /// Path relative to the run of an object path under it.
    fn relative(&self, path: &Path) -> String {
        let parts: Vec<_> =
            path.prefix_match(&self.root).map(|p| p.map(|s| s.as_ref().to_string()).collect()).unwrap_or_default();
        parts.join("/")
    }

    fn object_error(&self, operation: &'static str, relative: &str, source: object_store::Error) -> Error {
        Error::ObjectStore { operation, url: self.url.clone(), path: relative.to_string(), source: Box::new(source) }
    }

    /// Starts an attempt at a stage. Its files stay invisible until it commits.
    pub fn begin(&self, stage: StageId) -> StageWriter<'_> {
        StageWriter::new(self, stage)
    }

    /// A writer into another process's attempt `attempt` of `stage`: see
    /// [`StageWriter::joining`].
    pub fn join_attempt(&self, stage: StageId, attempt: String) -> StageWriter<'_> {
        StageWriter::joining(self, stage, attempt)
    }

    /// Creates `run.yaml` if the run has none; returns the stored text either way.
    pub async fn init_config(&self, yaml: &str) -> Result<String> {
        let path = self.path(layout::RUN_CONFIG);
        let put = self
            .store
            .put_opts(&path, Bytes::from(yaml.to_string()).into(), object_store::PutMode::Create.into())
            .await;
        match put {
            Ok(_) => Ok(yaml.to_string()),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(self.run_config().await?.unwrap_or_default()),
            Err(e) => Err(self.object_error("create", layout::RUN_CONFIG, e)),
        }
    }

    /// Resuming with a changed config: keeps the current `run.yaml` under
    /// `_config_history/<utc time>-<its sha256 prefix>.yaml`, then makes `yaml` the run's
    /// config. Every marker records the config hash it ran with. Returns the kept path.
    pub async fn record_config_change(&self, yaml: &str, previous_sha256: &str) -> Result<String> {
        let previous = self.run_config().await?.unwrap_or_default();
        let kept = self.keep_in_history(&format!("{}.yaml", &previous_sha256[..12]), previous).await?;
        self.store
            .put(&self.path(layout::RUN_CONFIG), Bytes::from(yaml.to_string()).into())
            .await
            .map_err(|e| self.object_error("write", layout::RUN_CONFIG, e))?;
        Ok(kept)
    }

    /// Keeps `text`, a frozen file a resume replaces, as
    /// `_config_history/<utc time>-<name>`; returns that path.
    async fn keep_in_history(&self, name: &str, text: String) -> Result<String> {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ");
        let kept = format!("{}/{stamp}-{name}", layout::CONFIG_HISTORY_DIR);
        self.store
            .put_opts(&self.path(&kept), Bytes::from(text).into(), object_store::PutMode::Create.into())
            .await
            .map_err(|e| self.object_error("create", &kept, e))?;
        Ok(kept)
    }

    /// The frozen digests of the environment's files (`environment.json`), if any.
    pub async fn environment_files(&self) -> Result<Option<String>> {
        Ok(self.get(layout::ENVIRONMENT_FILES).await?.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Freezes `json` as the environment's files; the ones it replaces, if any, are kept
    /// under `_config_history/` as a changed run.yaml is.
    pub async fn freeze_environment_files(&self, json: &str) -> Result<()> {
        if let Some(previous) = self.environment_files().await? {
            self.keep_in_history(layout::ENVIRONMENT_FILES, previous).await?;
        }
        self.store
            .put(&self.path(layout::ENVIRONMENT_FILES), Bytes::from(json.to_string()).into())
            .await
            .map_err(|e| self.object_error("write", layout::ENVIRONMENT_FILES, e))?;
        Ok(())
    }

    /// Writes, whole, a file of the run's that no stage commits and gc never collects (a
    /// tracker's, under [`layout::TENSORBOARD_DIR`]).
    pub async fn put_file(&self, relative: &str, bytes: Vec<u8>) -> Result<()> {
        debug_assert!(!layout::is_attempt_output(relative), "{relative} would be taken for a stage's output");
        self.store
            .put(&self.path(relative), Bytes::from(bytes).into())
            .await
            .map_err(|e| self.object_error("write", relative, e))?;
        Ok(())
    }

    /// Creates, whole, a file of the run's that no stage commits and gc never collects,
    /// unless it exists: whether this call created it.
    pub async fn create_file(&self, relative: &str, bytes: Vec<u8>) -> Result<bool> {
        debug_assert!(!layout::is_attempt_output(relative), "{relative} would be taken for a stage's output");
        let path = self.path(relative);
        match self.store.put_opts(&path, Bytes::from(bytes).into(), object_store::PutMode::Create.into()).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.object_error("create", relative, e)),
        }
    }

    /// A file [`RunStore::put_file`] or [`RunStore::create_file`] wrote, if it exists.
    pub async fn get_file(&self, relative: &str) -> Result<Option<Bytes>> {
        self.get(relative).await
    }

    /// The files under `relative_dir` that [`RunStore::put_file`] wrote, as paths relative
    /// to the run, in order.
    pub async fn list_files(&self, relative_dir: &str) -> Result<Vec<String>> {
        let mut files = self.list_relative(relative_dir).await?;
        files.sort();
        Ok(files)
    }

    /// The run's frozen `run.yaml`, if it has one.
    pub async fn run_config(&self) -> Result<Option<String>> {
        match self.get(layout::RUN_CONFIG).await? {
            Some(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            None => Ok(None),
        }
    }

    async fn get(&self, relative: &str) -> Result<Option<Bytes>> {
        let result = self.store.get(&self.path(relative)).await;
        match result {
            Ok(got) => Ok(Some(got.bytes().await.map_err(|e| self.object_error("read", relative, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.object_error("read", relative, e)),
        }
    }

    /// The marker of one stage commit, if it exists.
    pub async fn marker(&self, id: &StageId) -> Result<Option<StoredMarker>> {
        let path = id.marker_path();
        match self.get(&path).await? {
            Some(bytes) => Ok(Some(self.parse_marker(path, &bytes)?)),
            None => Ok(None),
        }
    }

    fn parse_marker(&self, path: String, bytes: &[u8]) -> Result<StoredMarker> {
        let invalid = |reason: String| Error::InvalidMarker { url: self.url.clone(), path: path.clone(), reason };
        let marker: CommitMarker = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if marker.format != marker::MARKER_FORMAT {
            return Err(invalid(format!("format {} is not {}", marker.format, marker::MARKER_FORMAT)));
        }
        let (stage, iteration, shard) =
            StageId::from_marker_path(&path).ok_or_else(|| invalid("not a marker path".into()))?;
        if (stage, iteration, shard) != (marker.stage, marker.iteration, marker.shard.map(|s| s.index)) {
            return Err(invalid(format!("it describes {}, not the stage its path names", marker.stage_id())));
        }
        Ok(StoredMarker { sha256: sha256_hex(bytes), path, marker })
    }

    /// The markers of a stage of one iteration once it is committed: its one marker, or
    /// every shard's marker when it ran sharded and all shards are in. None otherwise.
    pub async fn committed(&self, stage: Stage, iteration: Option<u32>) -> Result<Option<Vec<StoredMarker>>> {
        let whole = match iteration {
            Some(k) => StageId::at(stage, k),
            None => StageId::run_level(stage),
        };
        if let Some(marker) = self.marker(&whole).await? {
            return Ok(Some(vec![marker]));
        }
        Ok(committed_among(&self.markers().await?, stage, iteration))
    }

    /// The paths, relative to the run, of every file under `dir`.
    /// The files under `dir`, relative to the run; none where `dir` does not exist.
    async fn list_relative(&self, dir: &str) -> Result<Vec<String>> {
        let metas: Vec<_> = match self.store.list(Some(&self.path(dir))).try_collect().await {
            Ok(metas) => metas,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(self.object_error("list", dir, e)),
        };
        Ok(metas.iter().map(|m| self.relative(&m.location)).collect())
    }

    async fn delete_if_present(&self, relative: &str) -> Result<()> {
        match self.store.delete(&self.path(relative)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.object_error("delete", relative, e)),
        }
    }

    /// Every commit marker of the run, sorted by stage order.
    pub async fn markers(&self) -> Result<Vec<StoredMarker>> {
        let paths = self.list_relative(layout::COMMITS_DIR).await?;
        let reads: Vec<_> = paths.into_iter().map(|path| self.read_marker(path)).collect();
        let mut markers: Vec<StoredMarker> =
            futures::stream::iter(reads).buffer_unordered(CONCURRENCY).try_collect().await?;
        markers.sort_by_key(|m| (m.marker.iteration.map_or(-1, i64::from), m.marker.stage, m.marker.shard));
        Ok(markers)
    }

    async fn read_marker(&self, path: String) -> Result<StoredMarker> {
        let bytes =
            self.get(&path).await?.ok_or_else(|| Error::MissingFile { url: self.url.clone(), path: path.clone() })?;
        self.parse_marker(path, &bytes)
    }

    /// Fails with [`Error::RunNotFound`] when the URL holds neither a config nor a marker.
    pub async fn ensure_exists(&self) -> Result<Vec<StoredMarker>> {
        let markers = self.markers().await?;
        if markers.is_empty() && self.run_config().await?.is_none() {
            return Err(Error::RunNotFound { url: self.url.clone() });
        }
        Ok(markers)
    }

    /// Reads a committed file whole and checks it against its marker entry.
    pub async fn read_file(&self, entry: &FileEntry) -> Result<Bytes> {
        let Some(bytes) = self.get(&entry.path).await? else {
            return Err(self.missing(entry).await);
        };
        self.check(entry, bytes.len() as u64, || sha256_hex(&bytes))?;
        Ok(bytes)
    }

    fn check(&self, entry: &FileEntry, bytes: u64, sha256: impl FnOnce() -> String) -> Result<()> {
        let corrupt = |expected: String, actual: String| Error::Corrupt {
            url: self.url.clone(),
            path: entry.path.clone(),
            expected,
            actual,
        };
        if bytes != entry.bytes {
            return Err(corrupt(format!("{} bytes", entry.bytes), format!("{bytes} bytes")));
        }
        let actual = sha256();
        if actual != entry.sha256 {
            return Err(corrupt(format!("sha256 {}", entry.sha256), format!("sha256 {actual}")));
        }
        Ok(())
    }

    /// Reads every part of `table` the given markers name, verified, as batches with the
    /// table's file schema.
    pub async fn read_table(&self, markers: &[&CommitMarker], table: Table) -> Result<Vec<RecordBatch>> {
        let reads: Vec<_> =
            markers.iter().flat_map(|m| m.files_of(table)).map(|entry| self.read_parquet(entry)).collect();
        let files: Vec<Vec<RecordBatch>> = futures::stream::iter(reads).buffered(CONCURRENCY).try_collect().await?;
        Ok(files.into_iter().flatten().collect())
    }

    async fn read_parquet(&self, entry: &FileEntry) -> Result<Vec<RecordBatch>> {
        let bytes = self.read_file(entry).await?;
        parquet_io::decode(bytes).map_err(|source| Error::Parquet {
            url: self.url.clone(),
            path: entry.path.clone(),
            source: Box::new(source),
        })
    }

    /// Reads a table's committed rows as typed rows.
    pub async fn read_rows<R: Row>(&self, markers: &[&CommitMarker]) -> Result<Vec<R>> {
        let batches = self.read_table(markers, R::TABLE).await?;
        let mut rows = Vec::new();
        for batch in &batches {
            let part = crate::tables::from_batch::<R>(batch)
                .map_err(|e| Error::SchemaMismatch { table: R::TABLE, detail: e.to_string() })?;
            rows.extend(part);
        }
        Ok(rows)
    }

    /// Checks every committed file's size and sha256, except those a prune deleted.
    /// Returns how many files were checked and how many were pruned.
    pub async fn verify(&self) -> Result<(usize, usize)> {
        let markers = self.markers().await?;
        let pruned = self.pruned().await?;
        let entries: Vec<&FileEntry> = markers.iter().flat_map(|m| &m.marker.files).collect();
        let (gone, present): (Vec<&FileEntry>, Vec<&FileEntry>) =
            entries.into_iter().partition(|entry| pruned.contains_key(&entry.path));
        self.check_files(&present).await?;
        Ok((present.len(), gone.len()))
    }

    /// Checks the size and sha256 of every committed table part (not checkpoints) when
    /// they add up to at most `limit` bytes: what SQL reads, verified where that is cheap.
    /// Returns the bytes checked, or None (nothing read) over the limit.
    pub async fn verify_tables_within(&self, limit: u64) -> Result<Option<u64>> {
        let markers = self.markers().await?;
        let parts: Vec<&FileEntry> =
            markers.iter().flat_map(|m| &m.marker.files).filter(|f| f.table.is_some()).collect();
        let bytes: u64 = parts.iter().map(|f| f.bytes).sum();
        if bytes > limit {
            return Ok(None);
        }
        self.check_files(&parts).await?;
        Ok(Some(bytes))
    }

    /// Reads each file whole and checks its size and sha256 against its entry.
    async fn check_files(&self, entries: &[&FileEntry]) -> Result<()> {
        let reads: Vec<_> = entries.iter().map(|entry| self.read_file(entry)).collect();
        futures::stream::iter(reads).buffer_unordered(CONCURRENCY).try_for_each(|_| async { Ok(()) }).await
    }

    /// Deletes files no commit marker names (the leftovers of crashed or losing
    /// attempts) once they are older than `grace`, so a stage still writing is spared.
    pub async fn gc(&self, grace: std::time::Duration, dry_run: bool) -> Result<GcReport> {
        gc::collect(self, grace, dry_run).await
    }
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The markers among `markers` that make `stage` of `iteration` committed: its one
/// marker, or every shard's marker when it ran sharded and all shards are in.
pub fn committed_among(markers: &[StoredMarker], stage: Stage, iteration: Option<u32>) -> Option<Vec<StoredMarker>> {
    let of_stage: Vec<&StoredMarker> =
        markers.iter().filter(|m| m.marker.stage == stage && m.marker.iteration == iteration).collect();
    if let Some(whole) = of_stage.iter().find(|m| m.marker.shard.is_none()) {
        return Some(vec![(*whole).clone()]);
    }
    let count = of_stage.first()?.marker.shard?.count as usize;
    (of_stage.len() == count).then(|| of_stage.into_iter().cloned().collect())
}
