//! Experiment trackers: each committed stage's metrics, sent where researchers already
//! look (`tracking:` in the run file). The metrics come from SQL over the stage's own
//! table, so a chart in a tracker is a query a reader can rerun with `petting sql`;
//! their names are the same for every tracker.
//!
//! A tracker observes and never decides: one that fails is a warning, and the run goes on.

mod crc;
pub mod mlflow;
mod protobuf;
pub mod tensorboard;
pub mod wandb;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use arrow::array::{Array, AsArray};
use arrow::datatypes::Float64Type;
use serde::{Deserialize, Serialize};

use crate::algo::mixed_reward_sql;
use crate::sql::RunSql;
use crate::store::layout::TENSORBOARD_DIR;
use crate::store::{CommitMarker, RunStore, Stage, StageId};

/// Where each stage's metrics go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrackingConfig {
    /// Write TensorBoard event files under the store's `_tensorboard/` folder, one per
    /// committed stage (`tensorboard --logdir <store>` reads them, also while the run runs).
    #[serde(default)]
    pub tensorboard: bool,
    /// Log to an MLflow tracking server: one MLflow run per petting run, its config as
    /// parameters, each committed stage's metrics at the stage's iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<mlflow::MlflowConfig>,
    /// Write a W&B offline run under the store's `_wandb/` folder, rewritten at each
    /// committed stage; `wandb sync <store>/_wandb/offline-run-*` uploads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wandb: Option<wandb::WandbConfig>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Sql(#[from] crate::sql::Error),

    #[error(transparent)]
    Store(#[from] crate::store::Error),

    #[error("a metric query returned {0}, not (name text, value double)")]
    Shape(String),

    #[error(transparent)]
    Mlflow(#[from] mlflow::Error),

    #[error(transparent)]
    Wandb(#[from] wandb::Error),
}

/// The run whose stages a tracker receives.
#[derive(Debug, Clone)]
pub struct TrackedRun {
    /// MLflow's run name, and its experiment's unless one is set.
    pub name: String,
    /// The run's settings by dotted key, MLflow's parameters.
    pub settings: BTreeMap<String, String>,
    /// The α the rollout's reward metric mixes team and agent rewards with.
    pub alpha: f64,
}

/// Sends the metrics of stage `id` of `run`, just committed as `marker`, to every tracker
/// of `tracking`. Its step is the stage's iteration (0 for the run-level stages);
/// `run_done` says it was the run's last stage.
pub async fn stage_committed(
    store: &RunStore,
    tracking: &TrackingConfig,
    run: &TrackedRun,
    id: StageId,
    marker: &CommitMarker,
    run_done: bool,
) -> Result<(), Error> {
    let mut metrics = match metrics_query(run.alpha, id) {
        Some(query) => named_values(&RunSql::open(store).await?, &query).await?,
        None => Vec::new(),
    };
    let run_level = if id.iteration.is_none() { "run_" } else { "" };
    metrics.push((format!("time/{run_level}{}_seconds", id.stage), marker.seconds()));
    let step = i64::from(id.iteration.unwrap_or(0));
    if tracking.tensorboard {
        let wall_time = marker.finished_at.timestamp_micros() as f64 / 1e6;
        let mut file = tensorboard::EventFile::new(wall_time);
        file.scalars(wall_time, step, &metrics);
        let name = format!(
            "{TENSORBOARD_DIR}/events.out.tfevents.{:010}.petting-{}-{}",
            marker.finished_at.timestamp(),
            id.stage,
            id.iteration.map_or("run".to_string(), |k| k.to_string())
        );
        store.put_file(&name, file.bytes().to_vec()).await?;
    }
    if let Some(settings) = &tracking.wandb {
        let finished_ms = marker.finished_at.timestamp_millis();
        wandb::stage_committed(store, settings, run, id, (step, finished_ms), &metrics, run_done).await?;
    }
    if let Some(settings) = &tracking.mlflow {
        let server = mlflow::Mlflow::new(settings);
        let run_id = server.run_id(store, settings.experiment.as_deref(), run).await?;
        let finished_ms = marker.finished_at.timestamp_millis();
        server.log_metrics(&run_id, step, finished_ms, &metrics).await?;
        if run_done {
            server.finish(&run_id, finished_ms).await?;
        }
    }
    Ok(())
}

/// The query of a stage's metrics, rows of (name, value): the mean reward per agent,
/// training success, team reward and reply length of a rollout; the optimiser's
/// statistics per policy and mode of an update; held-out success per mode of an
/// evaluation. None for the stages whose rows are bookkeeping (prepare-data, group,
/// advantage).
pub fn metrics_query(alpha: f64, id: StageId) -> Option<String> {
    let at = match id.iteration {
        Some(k) => format!("iteration = {k}"),
        None => "iteration IS NULL".to_string(),
    };
    match id.stage {
        Stage::Rollout => {
            let reward = mixed_reward_sql(alpha);
            Some(format!(
                "SELECT 'rollout/reward/' || agent AS name, avg({reward}) AS value FROM turns WHERE {at} GROUP BY agent \
                 UNION ALL SELECT 'rollout/success', avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) FROM turns WHERE {at} AND done \
                 UNION ALL SELECT 'rollout/team_reward', avg(team_reward) FROM turns WHERE {at} AND done \
                 UNION ALL SELECT 'rollout/response_tokens', avg(CAST(cardinality(response_tokens) AS DOUBLE)) FROM turns WHERE {at}"
            ))
        }
        Stage::Update => {
            // The warm start's and the critic's rows fill the PPO-only columns with zeros.
            let mut query = String::new();
            for (column, aggregate) in [
                ("loss", "avg"),
                ("clip_fraction", "avg"),
                ("approx_kl", "avg"),
                ("entropy", "avg"),
                ("grad_norm", "avg"),
                ("learning_rate", "max"),
                ("logprob_drift_max", "max"),
                ("mismatch_fraction", "avg"),
            ] {
                if !query.is_empty() {
                    query.push_str(" UNION ALL ");
                }
                let _ = write!(
                    query,
                    "SELECT mode || '/' || policy || '/{column}' AS name, {aggregate}(CAST({column} AS DOUBLE)) AS value \
                     FROM updates WHERE {at} AND (mode = 'ppo' OR '{column}' IN ('loss', 'grad_norm', 'learning_rate')) \
                     GROUP BY mode, policy HAVING count({column}) > 0"
                );
            }
            Some(query)
        }
        Stage::Evaluate => Some(format!(
            "SELECT 'evaluate/success/' || mode AS name, avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS value \
             FROM evals WHERE {at} GROUP BY mode"
        )),
        Stage::PrepareData | Stage::Group | Stage::Advantage => None,
    }
}

/// The rows of a (name, value) query, in name order, nulls left out.
async fn named_values(sql: &RunSql, query: &str) -> Result<Vec<(String, f64)>, Error> {
    let (_, batches) = sql.query(query).await?;
    let mut out = Vec::new();
    for batch in &batches {
        let (Some(names), Some(values)) =
            (batch.column(0).as_string_opt::<i32>(), batch.column(1).as_primitive_opt::<Float64Type>())
        else {
            return Err(Error::Shape(format!("{:?}", batch.schema())));
        };
        for row in 0..batch.num_rows() {
            if names.is_valid(row) && values.is_valid(row) {
                out.push((names.value(row).to_string(), values.value(row)));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}
