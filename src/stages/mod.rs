//! The pipeline's stages. Each is a plain function that reads committed tables of a
//! run, writes its own, and commits them; no stage calls or imports another. What
//! several share lives here (reading inputs, committing, the error type) or in its own
//! module beside `stages` (`play` the episode engine, `policies` the checkpoints, `tasks`
//! the task batches).

pub mod advantage;
pub mod evaluate;
pub mod group;
pub mod league;
pub mod prepare_data;
pub mod replay;
pub mod rollout;
pub mod update;

use std::collections::BTreeMap;

use arrow::record_batch::RecordBatch;

use crate::algo::AlgorithmConfig;
use crate::algo::credit::{self, Step};
use crate::config::{self, RunConfig};
use crate::engine::{EngineKind, ServerSlot, StageEngine};
use crate::policies::{LoadedPolicies, Resident};
use crate::schema::Table;
use crate::sql::RunSql;
use crate::store::{self, CommitInfo, Partition, RunStore, Stage, StageId, StoredMarker};
use crate::tables::TurnRow;

/// What the stages of one process share: the policies kept in memory between them (each
/// version is loaded once), the vLLM server the process started for the run, if any,
/// and the ranks it joined, with which its updates run data-parallel.
#[derive(Debug, Default)]
pub struct Session {
    pub policies: Resident,
    pub server: ServerSlot,
    pub ranks: Option<std::sync::Arc<crate::ranks::Ranks>>,
}

impl Session {
    /// The engine a sampling stage plays `loaded` through, as its section's `engine` and
    /// `kv_cache_gib` say, with this process's vLLM server.
    async fn engine(
        &self,
        kind: EngineKind,
        kv_cache_gib: Option<f64>,
        store: &RunStore,
        config: &RunConfig,
        loaded: &mut LoadedPolicies,
    ) -> Result<StageEngine, Error> {
        let (vllm, run_name) = (config.vllm.as_ref(), config.run_name());
        Ok(StageEngine::prepare(kind, kv_cache_gib, vllm, &run_name, store, loaded, &self.server).await?)
    }
}

/// Why a stage could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),

    #[error(transparent)]
    Sql(#[from] crate::sql::Error),

    #[error(transparent)]
    Config(#[from] config::Error),

    #[error("{stage} needs {needs} of iteration {iteration} committed first")]
    NotReady { stage: StageId, needs: Stage, iteration: u32 },

    #[error(transparent)]
    PrepareData(#[from] prepare_data::Error),

    #[error(transparent)]
    Update(Box<update::Error>),

    #[error(transparent)]
    Model(#[from] crate::model::Error),

    #[error(transparent)]
    Env(#[from] crate::envs::Error),

    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::Error),

    #[error(transparent)]
    Play(#[from] crate::play::Error),

    #[error(transparent)]
    Engine(#[from] crate::engine::Error),

    #[error(transparent)]
    Policy(#[from] crate::policies::Error),

    #[error(transparent)]
    CriticModel(#[from] crate::critic::model::Error),

    #[error("cannot encode the {table} table: {source}")]
    Encode { table: Table, source: serde_arrow::Error },

    #[error(transparent)]
    Tasks(#[from] crate::tasks::Error),

    #[error(
        "{stage} cannot run: {existing} is already committed with another shard count; \
         run the missing shards with that count"
    )]
    ShardLayout { stage: StageId, existing: String },

    #[error("agents.{role}.league: {reason}")]
    League { role: crate::workflows::Agent, reason: String },

    #[error("cannot replay iteration {iteration} of {from}: {reason}")]
    Replay { from: String, iteration: u32, reason: String },

    #[error("{stage} produced rows that do not fit schemas/{table}.json: {detail}")]
    Conform { stage: StageId, table: Table, detail: String },

    #[error(
        "{stage}: {candidate} has {column} {value}, not a finite number within ±{limit} (limits.reward); \
         the environment or its reward function gave it, and nothing of the stage was committed"
    )]
    Reward { stage: StageId, candidate: String, column: &'static str, value: f64, limit: f64 },

    #[error(
        "{stage} computed {column} = {value} for {key}, which is not a finite number; nothing was \
         committed (are the rewards of its iteration finite? petting sql RUN \"select candidate_id, \
         local_reward, team_reward from turns where iteration = ...\")"
    )]
    NotFinite { stage: StageId, column: String, value: f64, key: String },

    #[error("out of memory in {stage}{}: try {knob} ({detail})", policy.as_ref().map(|p| format!(", policy {p}")).unwrap_or_default())]
    OutOfMemory { stage: StageId, policy: Option<String>, knob: String, detail: String },
}

impl From<update::Error> for Error {
    fn from(refusal: update::Error) -> Error {
        Error::Update(Box::new(refusal))
    }
}

impl Error {
    /// This error with a model that ran out of memory reported as the stage's, with the
    /// config knob that helps.
    pub(crate) fn out_of_memory_in(self, stage: StageId, policy: Option<&str>, knob: &str) -> Error {
        let oom = match &self {
            Error::Model(e)
            | Error::Engine(crate::engine::Error::Model(e))
            | Error::Play(crate::play::Error::Engine(crate::engine::Error::Model(e))) => e,
            Error::Policy(crate::policies::Error::Model(e)) => e,
            _ => return self,
        };
        match oom {
            crate::model::Error::OutOfMemory { during, detail } => Error::OutOfMemory {
                stage,
                policy: policy.map(str::to_owned),
                knob: knob.to_string(),
                detail: format!("while {during}: {detail}"),
            },
            _ => self,
        }
    }
}

/// The markers of `needs` in `iteration`, or the error saying `stage` must wait for them.
/// A stage that is already committed is refused here, before any work: its commit
/// would lose anyway, leaving only orphans.
async fn inputs(store: &RunStore, stage: StageId, needs: Stage, iteration: u32) -> Result<Vec<StoredMarker>, Error> {
    refuse_if_committed(store, stage).await?;
    store.committed(needs, Some(iteration)).await?.ok_or(Error::NotReady { stage, needs, iteration })
}

/// Refuses a stage that is already committed, before any work: its commit would lose
/// anyway, leaving only orphans. A stage that ran sharded is committed once all its
/// shards are, and is run again only with the same shard count: mixing layouts would
/// commit its rows twice.
async fn refuse_if_committed(store: &RunStore, stage: StageId) -> Result<(), Error> {
    let markers = store.markers().await?;
    let already = markers.iter().any(|m| m.marker.stage_id() == stage)
        || store::committed_among(&markers, stage.stage, stage.iteration).is_some();
    if already {
        return Err(store::Error::AlreadyCommitted { url: store.url().to_string(), stage }.into());
    }
    let count = |id: StageId| id.shard.map_or(1, |s| s.count);
    let other_layout = markers
        .iter()
        .find(|m| m.marker.stage == stage.stage && m.marker.iteration == stage.iteration)
        .filter(|m| count(m.marker.stage_id()) != count(stage));
    if let Some(existing) = other_layout {
        return Err(Error::ShardLayout { stage, existing: existing.path.clone() });
    }
    Ok(())
}

/// Checks every file of the input markers against its size and sha256: SQL reads
/// through the committed view, which checks sizes only.
async fn verify_inputs(store: &RunStore, markers: &[StoredMarker]) -> Result<(), Error> {
    for entry in markers.iter().flat_map(|m| &m.marker.files) {
        store.read_file(entry).await?;
    }
    Ok(())
}

/// The separate critic model of `critic.model`, checked to tokenize as policy `name` of
/// `markers` does at `version`; none where the heads sit on the policy's own trunk.
fn separate_critic_model(
    critic: &crate::critic::CriticConfig,
    markers: &[StoredMarker],
    policy: &crate::policies::PolicyConfig,
    name: &str,
    version: u32,
) -> Result<Option<crate::model::LanguageModel>, Error> {
    let Some(folder) = &critic.model else { return Ok(None) };
    let tokenizer = crate::policies::tokenizer_sha256(markers, policy, name, version)?;
    Ok(Some(crate::critic::model::load(folder, &policy.load_options(), name, tokenizer.as_deref())?))
}

/// The trunk the critic heads of policy `name` read: the separate critic model where
/// there is one (no adapter), else the policy in memory with its adapter.
fn critic_trunk<'a>(
    separate: &'a mut Option<crate::model::LanguageModel>,
    loaded: &'a mut LoadedPolicies,
    name: &str,
) -> (&'a mut crate::model::LanguageModel, Option<&'a str>) {
    match separate {
        Some(model) => (model, None),
        None => loaded.model(name).expect("the policy is in memory"),
    }
}

/// Runs `query` over the run and commits its result as `table` of `stage`.
async fn commit_query(
    store: &RunStore,
    stage: StageId,
    table: Table,
    query: &str,
    config: &RunConfig,
    inputs: &[StoredMarker],
) -> Result<store::CommitMarker, Error> {
    let sql = RunSql::open_deterministic(store).await?;
    let (_, batches) = sql.query(query).await?;
    let conformed = batches
        .iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| crate::tables::conform(b, table))
        .collect::<Result<Vec<RecordBatch>, _>>()
        .map_err(|e| Error::Conform { stage, table, detail: e.to_string() })?;
    for batch in &conformed {
        check_finite(stage, batch)?;
    }
    let mut writer = store.begin(stage);
    let iteration = stage.iteration.expect("a per-iteration stage");
    writer.write_table(table, Partition::Iteration(iteration), &conformed).await?;
    let info = CommitInfo { inputs: inputs.iter().map(StoredMarker::input_ref).collect(), ..run_info(config) };
    Ok(writer.finish().commit(info).await?)
}

/// An error naming the first value of a float column of `batch` that is NaN or
/// infinite: a group's mean or a sample's advantage computed from such a value would be
/// trained on from then on.
fn check_finite(stage: StageId, batch: &RecordBatch) -> Result<(), Error> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{DataType, Float64Type};
    let key = |row: usize| {
        ["candidate_id", "group_id"]
            .iter()
            .find_map(|name| batch.column_by_name(name)?.as_string_opt::<i32>().map(|c| c.value(row).to_string()))
            .unwrap_or_else(|| format!("row {row}"))
    };
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.data_type() != &DataType::Float64 {
            continue;
        }
        let values = column.as_primitive::<Float64Type>();
        let bad = (0..values.len()).find(|&i| values.is_valid(i) && !values.value(i).is_finite());
        if let Some(row) = bad {
            let value = values.value(row);
            return Err(Error::NotFinite { stage, column: field.name().clone(), value, key: key(row) });
        }
    }
    Ok(())
}

/// What every marker of a run records about the run itself; stages add their inputs,
/// policies and checkpoints.
fn run_info(config: &RunConfig) -> CommitInfo {
    CommitInfo { run: config.run_name(), seed: config.seed, config_sha256: config.sha256(), ..CommitInfo::default() }
}

/// Writes `rows` as the stage's part of their table for its iteration, then commits.
async fn commit_rows<R: crate::tables::Row>(
    writer: store::StageWriter<'_>,
    rows: &[R],
    info: CommitInfo,
) -> Result<store::CommitMarker, Error> {
    commit_parts(writer, &[rows], info).await
}

/// Commits a rollout's rows, one part per agent (a stable partition: each agent's rows
/// keep their order), so predicates on `agent`, and on `policy` when roles have their
/// own, skip whole files.
async fn commit_by_agent(
    writer: store::StageWriter<'_>,
    rows: Vec<TurnRow>,
    info: CommitInfo,
) -> Result<store::CommitMarker, Error> {
    let mut agents: Vec<&str> = rows.iter().map(|r| r.agent.as_str()).collect();
    agents.sort_unstable();
    agents.dedup();
    let by_agent: Vec<Vec<TurnRow>> =
        agents.iter().map(|a| rows.iter().filter(|r| r.agent == *a).cloned().collect()).collect();
    let parts: Vec<&[TurnRow]> = by_agent.iter().map(Vec::as_slice).collect();
    commit_parts(writer, &parts, info).await
}

/// Writes each non-empty slice of rows as its own part file and commits. A stage with
/// no rows at all (an empty shard) writes one empty part, so its table still exists.
async fn commit_parts<R: crate::tables::Row>(
    mut writer: store::StageWriter<'_>,
    parts: &[&[R]],
    info: CommitInfo,
) -> Result<store::CommitMarker, Error> {
    let stage = writer.stage();
    let iteration = stage.iteration.expect("a per-iteration stage");
    let mut parts: Vec<&[R]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        parts.push(&[]);
    }
    for rows in parts {
        let batch = crate::tables::to_batch(rows).map_err(|e| Error::Conform {
            stage,
            table: R::TABLE,
            detail: e.to_string(),
        })?;
        writer.write_table(R::TABLE, Partition::Iteration(iteration), &[batch]).await?;
    }
    Ok(writer.finish().commit(info).await?)
}

/// A float as a SQL literal that keeps every bit.
fn sql_float(value: f64) -> String {
    format!("CAST({value:?} AS DOUBLE)")
}

/// Each candidate of the iteration with its group (`group_id`) and mixed reward
/// (`reward`): what group and advantage compute over.
fn scored_sql(algorithm: &AlgorithmConfig, iteration: u32) -> String {
    let key = algorithm.name.grouping().key_sql();
    let reward = algorithm.reward_sql();
    // A frozen agent's turns are stored, never grouped or trained.
    format!(
        "SELECT *, {key} AS group_id, {reward} AS reward FROM turns \
         WHERE iteration = {iteration} AND trainable IS NOT FALSE"
    )
}

/// Sets each row's `credited_reward` as `algorithm` credits it, each episode (task,
/// episode) its own trajectory in play order (node order).
fn credit(rows: &mut [TurnRow], algorithm: &AlgorithmConfig) {
    let mut episodes: BTreeMap<(&str, u32), Vec<usize>> = BTreeMap::new();
    for (i, row) in rows.iter().enumerate() {
        episodes.entry((row.task_id.as_str(), row.episode)).or_default().push(i);
    }
    let mut credited = vec![0.0; rows.len()];
    for mut episode in episodes.into_values() {
        episode.sort_by_key(|&i| rows[i].node_id);
        let steps: Vec<Step> = episode
            .iter()
            .map(|&i| Step {
                agent: &rows[i].agent,
                local_reward: rows[i].local_reward,
                team_reward: rows[i].team_reward,
            })
            .collect();
        let values = credit::credited(algorithm.credit, algorithm.alpha, algorithm.gamma, &steps);
        for (&i, value) in episode.iter().zip(values) {
            credited[i] = value;
        }
    }
    for (row, value) in rows.iter_mut().zip(credited) {
        row.credited_reward = Some(value);
    }
}

/// `<task_id>/e<episode>: <reason>` of each failed episode, the reason's first line.
fn failed_episodes(tasks: &[crate::tables::TaskRow], finished: &[crate::play::Finished]) -> Vec<String> {
    let failed = finished.iter().filter_map(|f| Some((f, f.failure.as_deref()?)));
    failed
        .map(|(f, reason)| {
            let reason = reason.lines().next().unwrap_or_default();
            format!("{}/e{}: {reason}", tasks[f.task_index].task_id, f.episode)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_out_of_memory_is_reported_with_the_stage_the_policy_and_the_knob() {
        let oom = || crate::model::Error::OutOfMemory { during: "training on 8 sequences".into(), detail: "no".into() };
        let stage = StageId::at(Stage::Update, 3);
        let message = Error::from(crate::play::Error::Engine(crate::engine::Error::Model(oom())))
            .out_of_memory_in(stage, Some("shared"), "a smaller update.micro_batch_tokens")
            .to_string();
        assert_eq!(
            message,
            "out of memory in update of iteration 3, policy shared: try a smaller update.micro_batch_tokens \
             (while training on 8 sequences: no)"
        );
        let other = Error::NotReady { stage, needs: Stage::Advantage, iteration: 3 }.out_of_memory_in(stage, None, "k");
        assert!(matches!(other, Error::NotReady { .. }), "other errors pass through");
    }
}
