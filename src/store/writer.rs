//! Writing a stage attempt: `StageWriter` → `PendingCommit` → `CommitMarker`.

use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutPayload, WriteMultipart};

use crate::schema::Table;
use crate::store::layout::{self, Partition, StageId};
use crate::store::marker::{CheckpointRef, CommitMarker, FileEntry, InputRef, MARKER_FORMAT, PolicyRef};
use crate::store::{CONCURRENCY, Error, Result, RunStore, parquet_io, sha256_hex};

/// Objects above this size are uploaded in parts, so no single request carries them.
const MULTIPART_THRESHOLD: usize = 16 * 1024 * 1024;
const MULTIPART_CHUNK: usize = 8 * 1024 * 1024;

/// Writes one attempt's files under attempt-unique names; nothing it writes is visible
/// until [`PendingCommit::commit`] succeeds.
pub struct StageWriter<'a> {
    store: &'a RunStore,
    stage: StageId,
    attempt: String,
    started_at: DateTime<Utc>,
    files: Vec<FileEntry>,
    next_seq: u32,
}

/// What the marker records beyond the files: provenance of the attempt.
#[derive(Debug, Clone, Default)]
pub struct CommitInfo {
    pub run: String,
    pub inputs: Vec<InputRef>,
    pub policies_used: Vec<PolicyRef>,
    pub opponents_used: Vec<PolicyRef>,
    pub checkpoints: Vec<CheckpointRef>,
    pub seed: u64,
    pub config_sha256: String,
    pub model_seconds: f64,
    pub sandbox_seconds: f64,
    pub reused_from: Vec<InputRef>,
    pub skipped_tasks: Vec<String>,
    pub failed_episodes: Vec<String>,
}

/// A finished attempt whose files are all written and closed, ready to be made visible.
#[must_use = "the attempt's files stay invisible until it is committed"]
pub struct PendingCommit<'a> {
    store: &'a RunStore,
    stage: StageId,
    attempt: String,
    started_at: DateTime<Utc>,
    files: Vec<FileEntry>,
}

impl<'a> StageWriter<'a> {
    pub(crate) fn new(store: &'a RunStore, stage: StageId) -> StageWriter<'a> {
        StageWriter {
            store,
            stage,
            attempt: uuid::Uuid::new_v4().simple().to_string(),
            started_at: Utc::now(),
            files: Vec::new(),
            next_seq: 0,
        }
    }

    /// A writer into attempt `attempt` of `stage`, begun by another process (rank 0 of
    /// an update in pools), which commits it with the files this one wrote
    /// ([`StageWriter::into_files`], [`StageWriter::adopt`]).
    pub(crate) fn joining(store: &'a RunStore, stage: StageId, attempt: String) -> StageWriter<'a> {
        StageWriter { attempt, ..StageWriter::new(store, stage) }
    }

    /// The files written so far, for the process that commits the attempt.
    pub fn into_files(self) -> Vec<FileEntry> {
        self.files
    }

    /// Counts `files`, written into this attempt by a joining writer, as this writer's.
    pub fn adopt(&mut self, files: Vec<FileEntry>) {
        for file in &files {
            assert!(file.path.contains(&self.attempt), "{} does not carry attempt {}", file.path, self.attempt);
        }
        self.files.extend(files);
    }

    /// The id every file of this attempt carries (checkpoint folders include it).
    pub fn attempt(&self) -> &str {
        &self.attempt
    }

    pub fn stage(&self) -> StageId {
        self.stage
    }

    /// Writes one Parquet part of `table`. Every batch must have the table's file schema.
    pub async fn write_table(&mut self, table: Table, partition: Partition, batches: &[RecordBatch]) -> Result<()> {
        let schema = table.file_schema();
        if let Some(batch) = batches.iter().find(|b| b.schema() != schema) {
            return Err(Error::SchemaMismatch { table, detail: schema_difference(&schema, &batch.schema()) });
        }
        let path = layout::part_path(table, &partition, self.stage.shard_index(), &self.attempt, self.next_seq);
        self.next_seq += 1;
        let encoded = parquet_io::encode(schema, batches).map_err(|source| Error::Parquet {
            url: self.store.url.clone(),
            path: path.clone(),
            source: Box::new(source),
        })?;
        let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
        self.put(path, Bytes::from(encoded), Some(table), Some(rows)).await
    }

    /// Writes any other file of the attempt, such as a checkpoint's weights, at `path`
    /// relative to the run. The path must carry the attempt id.
    pub async fn write_file(&mut self, path: String, bytes: Bytes) -> Result<()> {
        assert!(path.contains(&self.attempt), "{path} does not carry attempt {}", self.attempt);
        self.put(path, bytes, None, None).await
    }

    /// Writes the local file `local` at `path` (which must carry the attempt id), read
    /// and hashed in chunks on its way up, so a file of many gigabytes (a checkpoint
    /// shard) is never held in memory. Returns its sha256.
    pub async fn write_local_file(&mut self, path: String, local: &std::path::Path) -> Result<String> {
        use sha2::{Digest, Sha256};
        use tokio::io::AsyncReadExt;
        assert!(path.contains(&self.attempt), "{path} does not carry attempt {}", self.attempt);
        let read_error = |e: std::io::Error| Error::LocalFile { path: local.display().to_string(), source: e };
        let mut file = tokio::fs::File::open(local).await.map_err(read_error)?;
        let len = file.metadata().await.map_err(read_error)?.len();
        if len as usize <= MULTIPART_THRESHOLD {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).await.map_err(read_error)?;
            let sha256 = sha256_hex(&bytes);
            self.put(path, Bytes::from(bytes), None, None).await?;
            return Ok(sha256);
        }
        let location = self.store.path(&path);
        let upload = self.store.object_store().put_multipart(&location).await;
        let upload = upload.map_err(|e| self.store.object_error("write", &path, e))?;
        let mut upload = WriteMultipart::new_with_chunk_size(upload, MULTIPART_CHUNK);
        let mut hasher = Sha256::new();
        let mut chunk = vec![0u8; MULTIPART_CHUNK];
        loop {
            let n = file.read(&mut chunk).await.map_err(read_error)?;
            if n == 0 {
                break;
            }
            hasher.update(&chunk[..n]);
            upload.wait_for_capacity(CONCURRENCY).await.map_err(|e| self.store.object_error("write", &path, e))?;
            upload.write(&chunk[..n]);
        }
        upload.finish().await.map_err(|e| self.store.object_error("write", &path, e))?;
        let sha256 = hex::encode(hasher.finalize());
        self.files.push(FileEntry { path, bytes: len, sha256: sha256.clone(), table: None, rows: None });
        Ok(sha256)
    }

    async fn put(&mut self, path: String, bytes: Bytes, table: Option<Table>, rows: Option<u64>) -> Result<()> {
        let entry = FileEntry { path, bytes: bytes.len() as u64, sha256: sha256_hex(&bytes), table, rows };
        let location = self.store.path(&entry.path);
        let object = self.store.object_store();
        let written = if bytes.len() <= MULTIPART_THRESHOLD {
            object.put(&location, PutPayload::from_bytes(bytes)).await.map(drop)
        } else {
            match object.put_multipart(&location).await {
                Ok(upload) => {
                    let mut upload = WriteMultipart::new_with_chunk_size(upload, MULTIPART_CHUNK);
                    upload.put(bytes);
                    upload.finish().await.map(drop)
                }
                Err(e) => Err(e),
            }
        };
        written.map_err(|e| self.store.object_error("write", &entry.path, e))?;
        self.files.push(entry);
        Ok(())
    }

    /// Ends the attempt: every file it wrote is closed.
    pub fn finish(self) -> PendingCommit<'a> {
        PendingCommit {
            store: self.store,
            stage: self.stage,
            attempt: self.attempt,
            started_at: self.started_at,
            files: self.files,
        }
    }
}

impl PendingCommit<'_> {
    pub fn files(&self) -> &[FileEntry] {
        &self.files
    }

    /// Makes the attempt's files visible by creating the stage's marker, if no other
    /// attempt has. Losing that race is [`Error::AlreadyCommitted`].
    pub async fn commit(self, info: CommitInfo) -> Result<CommitMarker> {
        self.check_files_still_there().await?;
        let marker = CommitMarker {
            format: MARKER_FORMAT,
            run: info.run,
            stage: self.stage.stage,
            iteration: self.stage.iteration,
            shard: self.stage.shard,
            attempt: self.attempt,
            files: self.files,
            inputs: info.inputs,
            policies_used: info.policies_used,
            opponents_used: info.opponents_used,
            checkpoints: info.checkpoints,
            seed: info.seed,
            config_sha256: info.config_sha256,
            model_seconds: info.model_seconds,
            sandbox_seconds: info.sandbox_seconds,
            reused_from: info.reused_from,
            skipped_tasks: info.skipped_tasks,
            failed_episodes: info.failed_episodes,
            code_version: crate::CODE_VERSION.to_string(),
            started_at: self.started_at,
            finished_at: Utc::now(),
        };
        let json = serde_json::to_vec_pretty(&marker).expect("a marker always serialises");
        let relative = self.stage.marker_path();
        let created = self
            .store
            .object_store()
            .put_opts(&self.store.path(&relative), PutPayload::from(json), PutMode::Create.into())
            .await;
        match created {
            Ok(_) => Ok(marker),
            Err(object_store::Error::AlreadyExists { .. }) => match self.store.marker(&self.stage).await? {
                // Our own create, retried after its response was lost (a dropped connection).
                Some(existing) if existing.marker.attempt == marker.attempt => Ok(marker),
                _ => Err(Error::AlreadyCommitted { url: self.store.url.clone(), stage: self.stage }),
            },
            Err(e) => Err(self.store.object_error("create", &relative, e)),
        }
    }

    /// A marker must never name a file that is not there, e.g. one `gc` removed while
    /// the stage ran longer than its grace period.
    async fn check_files_still_there(&self) -> Result<()> {
        // Collected first: a lazy map would put a higher-ranked closure in the future's type,
        // which then is not `Send` for `tokio::spawn`.
        let checks: Vec<_> = self.files.iter().map(|entry| self.check_file(entry)).collect();
        futures::stream::iter(checks).buffer_unordered(CONCURRENCY).try_for_each(|()| async { Ok(()) }).await
    }

    async fn check_file(&self, entry: &FileEntry) -> Result<()> {
        let lost =
            || Error::LostBeforeCommit { url: self.store.url.clone(), stage: self.stage, path: entry.path.clone() };
        match self.store.object_store().head(&self.store.path(&entry.path)).await {
            Ok(meta) if meta.size == entry.bytes => Ok(()),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Err(lost()),
            Err(e) => Err(self.store.object_error("check", &entry.path, e)),
        }
    }
}

fn schema_difference(expected: &arrow::datatypes::Schema, actual: &arrow::datatypes::Schema) -> String {
    for field in expected.fields() {
        match actual.field_with_name(field.name()) {
            Err(_) => return format!("column {} is missing", field.name()),
            Ok(got) if got.data_type() != field.data_type() => {
                return format!("column {} is {}, expected {}", field.name(), got.data_type(), field.data_type());
            }
            Ok(got) if got.is_nullable() != field.is_nullable() => {
                return format!(
                    "column {} has nullable={}, expected {}",
                    field.name(),
                    got.is_nullable(),
                    field.is_nullable()
                );
            }
            Ok(_) => {}
        }
    }
    if let Some(extra) = actual.fields().iter().find(|f| expected.field_with_name(f.name()).is_err()) {
        return format!("column {} is not in the schema", extra.name());
    }
    "columns are out of order".to_string()
}
