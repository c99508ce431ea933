//! The lines `petting pipeline run` prints: one per iteration (mixed reward per agent, clip
//! fraction, drift, held-out success, seconds per stage) and one for the whole run.

use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::algo::mixed_reward_sql;
use crate::sql::RunSql;
use crate::store::RunStore;

use super::Error;

/// One line for iteration `k`.
pub async fn iteration(store: &RunStore, alpha: f64, k: u32) -> Result<String, Error> {
    let sql = RunSql::open(store).await?;
    let reward = mixed_reward_sql(alpha);
    let rewards = scalar(
        &sql,
        &format!(
            "select string_agg(agent || ' ' || round(r, 3), ', ' order by agent) from \
             (select agent, avg({reward}) as r from turns where iteration = {k} group by agent)"
        ),
    )
    .await?;
    let update = scalar(
        &sql,
        &format!(
            "select 'clip ' || round(avg(clip_fraction), 3) || ', drift ' || round(max(logprob_drift_max), 4) \
             from updates where iteration = {k} and mode = 'ppo'"
        ),
    )
    .await?;
    let eval = scalar(
        &sql,
        &format!(
            "select string_agg(mode || ' ' || round(s * 100, 1) || '%', ', ' order by mode) from \
             (select mode, avg(case when success then 1.0 else 0.0 end) as s from evals where iteration = {k} group by mode)"
        ),
    )
    .await?;
    let timing = scalar(
        &sql,
        &format!(
            "select string_agg(stage || ' ' || round(seconds, 1) || 's', ', ' order by finished_at) \
             from commits where iteration = {k}"
        ),
    )
    .await?;
    let eval = if eval.is_empty() { String::new() } else { format!(" | eval v{k}: {eval}") };
    Ok(format!("iteration {k}: reward a turn (α·team + local) {rewards} | {update}{eval} | {timing}"))
}

/// Held-out success per mode and version, and where the time went.
pub async fn run(store: &RunStore) -> Result<String, Error> {
    let sql = RunSql::open(store).await?;
    let curve = scalar(
        &sql,
        "select string_agg(mode || ': ' || curve, '; ' order by mode) from \
         (select mode, string_agg('v' || iteration || ' ' || round(s * 100, 1) || '%', ', ' order by iteration) as curve \
          from (select mode, iteration, avg(case when success then 1.0 else 0.0 end) as s from evals \
                group by mode, iteration) group by mode)",
    )
    .await?;
    let time = scalar(
        &sql,
        "select round(sum(seconds)) || ' s in stages: model ' || round(100 * sum(model_seconds) / sum(seconds), 1) \
         || '%, sandbox ' || round(100 * sum(sandbox_seconds) / sum(seconds), 1) || '%, the rest ' \
         || round(100 * (1 - sum(model_seconds + sandbox_seconds) / sum(seconds)), 1) || '%' from commits",
    )
    .await?;
    Ok(format!("held-out success: {curve}\n{time}"))
}

/// The first cell of a one-row query, as text ("" when there is none).
async fn scalar(sql: &RunSql, query: &str) -> Result<String, Error> {
    let (_, batches) = sql.query(query).await?;
    let Some(batch) = batches.iter().find(|b| b.num_rows() > 0) else { return Ok(String::new()) };
    let formatter = ArrayFormatter::try_new(batch.column(0).as_ref(), &FormatOptions::default())
        .map_err(|e| Error::Report(e.to_string()))?;
    Ok(formatter.value(0).to_string())
}
