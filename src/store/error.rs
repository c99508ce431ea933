use crate::schema::Table;
use crate::store::layout::StageId;

/// Everything that can go wrong reading or writing a run store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "unsupported run URL {url:?}: {reason}; use a local path, file:///path, memory://, \
         s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
    )]
    UnsupportedUrl { url: String, reason: String },

    #[error("cannot open run {url:?}: {reason}")]
    NoCredentials { url: String, reason: String },

    #[error("cannot set up object storage for {url}: {source}")]
    Configure { url: String, source: Box<object_store::Error> },

    #[error("{operation} {path} in {url} failed: {source}")]
    ObjectStore { operation: &'static str, url: String, path: String, source: Box<object_store::Error> },

    #[error("{stage} is already committed in {url}: another writer won the race; this attempt's files stay invisible")]
    AlreadyCommitted { url: String, stage: StageId },

    #[error(
        "{path} in {url} is corrupt: its commit marker says {expected}, the file has {actual}; \
         the file was truncated or overwritten after it was committed"
    )]
    Corrupt { url: String, path: String, expected: String, actual: String },

    #[error("{path} in {url} is named by a commit marker but does not exist; it was deleted after it was committed")]
    MissingFile { url: String, path: String },

    #[error(
        "{path} in {url} was pruned (recorded in {record}): the run no longer keeps it; \
         fork or resume from a version whose checkpoint was kept (petting sql: select version, pruned_bytes from checkpoints)"
    )]
    Pruned { url: String, path: String, record: String },

    #[error("commit marker {path} in {url} cannot be read: {reason}")]
    InvalidMarker { url: String, path: String, reason: String },

    #[error(
        "cannot commit {stage}: {path} was written by this attempt but is gone from {url} (was `petting gc` run during the stage?)"
    )]
    LostBeforeCommit { url: String, stage: StageId, path: String },

    #[error("batch for table {table} does not match schemas/{table}.json: {detail}")]
    SchemaMismatch { table: Table, detail: String },

    #[error("Parquet file {path} in {url}: {source}")]
    Parquet { url: String, path: String, source: Box<parquet::errors::ParquetError> },

    #[error("no run at {url}: it has no run.yaml and no commit markers")]
    RunNotFound { url: String },

    #[error(
        "{url} is not a run store: it has no commit markers ({commits}/), so nothing in it is a stage's \
         output; gc deletes only uncommitted files of a store, under its table and checkpoint folders",
        commits = crate::store::layout::COMMITS_DIR
    )]
    NotAStore { url: String },

    #[error(
        "{inner} is a run store inside the run store {outer}: a store's folders belong to it alone, \
         so stores are never nested; move one of them out (or give gc the inner one)"
    )]
    NestedStore { outer: String, inner: String },

    #[error("cannot read {path} to store it: {source}")]
    LocalFile { path: String, source: std::io::Error },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
