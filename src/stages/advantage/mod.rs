//! advantage: each kept candidate's advantage, routed to its policy as `samples`.
//!
//! A group estimator (`Algorithm::advantage_sql`, the twin of `Algorithm::advantages`)
//! runs as window functions over the candidate's group; groups without signal (one
//! member, all rewards equal) get zero. PPO's runs as GAE over every episode with its
//! critic's values (gae.rs).

mod gae;

use crate::algo::AlgorithmConfig;
use crate::config::RunConfig;
use crate::schema::Table;
use crate::store::{CommitMarker, RunStore, Stage, StageId};

use super::{Error, Session, commit_query, inputs, scored_sql, verify_inputs};

pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    session: &Session,
) -> Result<CommitMarker, Error> {
    if let Some(critic) = config.critic.as_ref().filter(|_| config.algorithm.name.needs_critic()) {
        return gae::run(store, config, critic, iteration, session).await;
    }
    let stage = StageId::at(Stage::Advantage, iteration);
    let mut read = inputs(store, stage, Stage::Rollout, iteration).await?;
    read.extend(inputs(store, stage, Stage::Group, iteration).await?);
    verify_inputs(store, &read).await?;
    commit_query(store, stage, Table::Samples, &query(&config.algorithm, iteration), config, &read).await
}

fn query(algorithm: &AlgorithmConfig, iteration: u32) -> String {
    let advantage = algorithm.name.advantage_sql(algorithm.std_epsilon);
    format!(
        "WITH scored AS ({scored}),
         windowed AS (
           SELECT candidate_id, group_id, agent, policy, policy_version, reward,
                  cardinality(response_tokens) AS response_token_count,
                  count(*) OVER g AS g_size, avg(reward) OVER g AS g_mean,
                  coalesce(stddev_samp(reward) OVER g, 0.0) AS g_std,
                  sum(reward) OVER g AS g_sum, max(reward) OVER g AS g_max, min(reward) OVER g AS g_min
           FROM scored WINDOW g AS (PARTITION BY group_id)),
         kept AS (SELECT group_id FROM groups WHERE iteration = {iteration} AND kept)
         SELECT candidate_id, w.group_id, agent, policy, policy_version, reward AS mixed_reward,
                CASE WHEN g_size < 2 OR g_min = g_max THEN 0.0 ELSE {advantage} END AS advantage,
                response_token_count, CAST(NULL AS DOUBLE) AS value, CAST(NULL AS DOUBLE) AS value_target,
                NULL AS token_values, NULL AS token_value_targets, NULL AS token_advantages
         FROM windowed w JOIN kept ON w.group_id = kept.group_id
         ORDER BY candidate_id",
        scored = scored_sql(algorithm, iteration),
    )
}
