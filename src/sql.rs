//! SQL over a run: a DataFusion session with every committed table registered.
//!
//! Stored tables (tasks, turns, groups, samples, updates, evals) are ordinary hive
//! partitioned listing tables, read through [`CommittedView`], so `iteration` (and
//! `split` for tasks) is a column and predicates on it skip whole files, while files no
//! commit marker names are never seen. `commits` and `checkpoints` are built from the
//! markers themselves.
//!
//! A session only reads: statements that write or define anything (`COPY … TO`,
//! `INSERT`, `CREATE [EXTERNAL] TABLE`, `CREATE VIEW`, `SET`, …) are refused before
//! they are planned, so a query can neither write into a run's committed folders nor
//! read files outside them.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext};

use crate::schema::Table;
use crate::store::{self, CommittedView, RunStore, StoredMarker};
use crate::tables::{self, CheckpointRow, CommitRow};

/// The object store URL the committed view is registered under.
const VIEW_URL: &str = "petting://run/";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),

    #[error("{message}")]
    Query { query: String, message: String },

    #[error("cannot register table {table}: {source}")]
    Register { table: Table, source: Box<DataFusionError> },
}

/// A SQL session over one run's committed tables.
pub struct RunSql {
    ctx: SessionContext,
}

impl RunSql {
    /// Reads the run's commit markers and registers its tables.
    pub async fn open(store: &RunStore) -> Result<RunSql, Error> {
        RunSql::open_with(store, SessionConfig::new().with_information_schema(true)).await
    }

    /// A session for stages: one partition, so aggregates add rows in file order and
    /// re-running a stage reproduces its tables bit for bit.
    pub async fn open_deterministic(store: &RunStore) -> Result<RunSql, Error> {
        RunSql::open_with(store, SessionConfig::new().with_target_partitions(1)).await
    }

    async fn open_with(store: &RunStore, config: SessionConfig) -> Result<RunSql, Error> {
        let markers = store.ensure_exists().await?;
        let ctx = SessionContext::new_with_config(config);
        let view_url = url::Url::parse(VIEW_URL).expect("a valid URL");
        ctx.register_object_store(&view_url, Arc::new(CommittedView::new(store, &markers)));
        for table in Table::ALL.into_iter().filter(|t| t.is_stored()) {
            let register = |source| Error::Register { table, source: Box::new(source) };
            ctx.register_table(table.name(), listing_table(table).map_err(register)?).map_err(register)?;
        }
        let commits = memory_table(&commit_rows(&markers))?;
        let register = |source| Error::Register { table: Table::Commits, source: Box::new(source) };
        ctx.register_table(Table::Commits.name(), commits).map_err(register)?;
        let checkpoints = memory_table(&checkpoint_rows(&markers, &store.pruned().await?))?;
        let register = |source| Error::Register { table: Table::Checkpoints, source: Box::new(source) };
        ctx.register_table(Table::Checkpoints.name(), checkpoints).map_err(register)?;
        Ok(RunSql { ctx })
    }

    /// Runs one statement and collects its result.
    pub async fn query(&self, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>), Error> {
        let frame = self.plan(sql).await?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let batches = frame.collect().await.map_err(|e| query_error(sql, e))?;
        Ok((schema, batches))
    }

    /// Runs one statement, its result streamed batch by batch as it is computed.
    pub async fn stream(&self, sql: &str) -> Result<(SchemaRef, SendableRecordBatchStream), Error> {
        let frame = self.plan(sql).await?;
        let schema: SchemaRef = Arc::new(frame.schema().as_arrow().clone());
        let stream = frame.execute_stream().await.map_err(|e| query_error(sql, e))?;
        Ok((schema, stream))
    }

    /// Plans a statement that only reads.
    async fn plan(&self, sql: &str) -> Result<DataFrame, Error> {
        let read_only = SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
        self.ctx.sql_with_options(sql, read_only).await.map_err(|e| query_error(sql, e))
    }

    /// The DataFusion session, for callers that want plans or streams.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }
}

fn listing_table(table: Table) -> datafusion::error::Result<Arc<ListingTable>> {
    let def = table.definition();
    let partitions = def.partition_columns().map(|c| (c.name.clone(), c.data_type.clone())).collect();
    let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
        .with_file_extension(".parquet")
        .with_table_partition_cols(partitions);
    let url = ListingTableUrl::parse(format!("{VIEW_URL}{}/", table.name()))?;
    let config = ListingTableConfig::new(url).with_listing_options(options).with_schema(def.file_schema());
    Ok(Arc::new(ListingTable::try_new(config)?))
}

fn memory_table<R: tables::Row>(rows: &[R]) -> Result<Arc<MemTable>, Error> {
    let register = |source| Error::Register { table: R::TABLE, source: Box::new(source) };
    let batch = tables::to_batch(rows).map_err(|e| register(DataFusionError::External(Box::new(e))))?;
    Ok(Arc::new(MemTable::try_new(R::TABLE.file_schema(), vec![vec![batch]]).map_err(register)?))
}

fn commit_rows(markers: &[StoredMarker]) -> Vec<CommitRow> {
    markers
        .iter()
        .map(|m| {
            let c = &m.marker;
            CommitRow {
                stage: c.stage.name().to_string(),
                iteration: c.iteration.map(i64::from),
                shard: c.shard.map(|s| s.index),
                shards: c.shard.map(|s| s.count),
                marker: m.path.clone(),
                marker_sha256: m.sha256.clone(),
                attempt: c.attempt.clone(),
                files: c.files.len() as u32,
                rows: c.rows(),
                bytes: c.bytes(),
                seed: c.seed,
                config_sha256: c.config_sha256.clone(),
                code_version: c.code_version.clone(),
                started_at: c.started_at.timestamp_micros(),
                finished_at: c.finished_at.timestamp_micros(),
                seconds: c.seconds(),
                model_seconds: c.model_seconds,
                sandbox_seconds: c.sandbox_seconds,
                reused_from: (!c.reused_from.is_empty())
                    .then(|| c.reused_from.iter().map(|r| r.marker.as_str()).collect::<Vec<_>>().join(" ")),
                skipped_tasks: (!c.skipped_tasks.is_empty()).then(|| c.skipped_tasks.join(" ")),
                failed_episodes: (!c.failed_episodes.is_empty()).then(|| c.failed_episodes.join("\n")),
            }
        })
        .collect()
}

fn checkpoint_rows(markers: &[StoredMarker], pruned: &BTreeMap<String, String>) -> Vec<CheckpointRow> {
    let mut rows = Vec::new();
    for m in markers {
        for checkpoint in &m.marker.checkpoints {
            let prefix = format!("{}/", checkpoint.dir);
            let files = m.marker.files.iter().filter(|f| f.path.starts_with(&prefix));
            rows.push(CheckpointRow {
                policy: checkpoint.policy.clone(),
                version: checkpoint.version,
                parent_version: checkpoint.parent_version,
                iteration: m.marker.iteration.map(i64::from),
                stage: m.marker.stage.name().to_string(),
                path: checkpoint.dir.clone(),
                weights_sha256: checkpoint.weights_sha256.clone(),
                optimizer_sha256: m
                    .marker
                    .files
                    .iter()
                    .find(|f| f.path.strip_prefix(&prefix) == Some(crate::model::OPTIMIZER_FILE))
                    .map(|f| f.sha256.clone()),
                bytes: files.clone().map(|f| f.bytes).sum(),
                pruned_bytes: files.filter(|f| pruned.contains_key(&f.path)).map(|f| f.bytes).sum(),
            });
        }
    }
    rows
}

fn query_error(sql: &str, error: DataFusionError) -> Error {
    Error::Query { query: sql.to_string(), message: describe(error) }
}

/// DataFusion's message, with the run's tables named when a table is unknown, and what
/// to do instead when a statement would write.
fn describe(error: DataFusionError) -> String {
    let message = error.to_string();
    let writes = ["DDL not supported", "DML not supported", "Statement not supported"];
    if writes.iter().any(|w| message.contains(w)) {
        return format!(
            "{message}: petting sql only reads the run's committed tables; to keep a result, \
             give --format csv|json|parquet --output FILE"
        );
    }
    let unknown_table = message.contains("table '") && message.contains("not found");
    if unknown_table {
        let names: Vec<&str> = Table::ALL.iter().map(|t| t.name()).collect();
        return format!("{message}; the run's tables are {}", names.join(", "));
    }
    message
}
