//! group: which candidates are compared with each other, and each group's statistics.
//!
//! Reads the iteration's `turns`, scores each candidate with the mixed reward
//! r = alpha * r_team + r_local, groups them as the algorithm does (by task, agent and
//! turn for AT-GRPO and the CoMLRL estimators, by task for GRPO and Dr.GRPO), and writes
//! `groups` with size, mean, unbiased std, the degenerate flag and whether the
//! configured filters keep it.

use crate::algo::AlgorithmConfig;
use crate::config::RunConfig;
use crate::schema::Table;
use crate::store::{CommitMarker, RunStore, Stage, StageId};

use super::{Error, commit_query, inputs, scored_sql, sql_float, verify_inputs};

pub async fn run(store: &RunStore, config: &RunConfig, iteration: u32) -> Result<CommitMarker, Error> {
    let stage = StageId::at(Stage::Group, iteration);
    let rollout = inputs(store, stage, Stage::Rollout, iteration).await?;
    verify_inputs(store, &rollout).await?;
    commit_query(store, stage, Table::Groups, &query(&config.algorithm, iteration), config, &rollout).await
}

fn query(algorithm: &AlgorithmConfig, iteration: u32) -> String {
    let (agent, turn) = algorithm.name.grouping().agent_turn_sql();
    let filter = &algorithm.filter;
    // Filters as in algo::advantage::kept_groups: degenerate groups first, then the
    // lowest-mean fraction of the rest, ties broken by group id.
    format!(
        "WITH scored AS ({scored}),
         stats AS (
           SELECT group_id, min(task_id) AS task_id, {agent} AS agent, {turn} AS turn,
                  count(*) AS size, avg(reward) AS mean, coalesce(stddev_samp(reward), 0.0) AS std,
                  count(*) < 2 OR min(reward) = max(reward) AS degenerate
           FROM scored GROUP BY group_id),
         candidates AS (
           SELECT *, NOT ({drop_degenerate} AND degenerate) AS candidate FROM stats),
         ranked AS (
           SELECT *, row_number() OVER (PARTITION BY candidate ORDER BY mean, group_id) AS position,
                  sum(CASE WHEN candidate THEN 1 ELSE 0 END) OVER () AS candidate_count
           FROM candidates)
         SELECT group_id, task_id, agent, turn, size, mean, std, degenerate,
                candidate AND position > floor(candidate_count * {fraction}) AS kept
         FROM ranked ORDER BY group_id",
        scored = scored_sql(algorithm, iteration),
        drop_degenerate = filter.drop_degenerate,
        fraction = sql_float(filter.drop_lowest_mean_fraction),
    )
}
