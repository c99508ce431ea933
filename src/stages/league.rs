//! The opponents a league's roles (`agents.<role>.league`) play in one stage: for each
//! task and league role, the past version of its policy drawn by the role's rule from
//! the versions committed before the stage (never one committed later: a draw is refused
//! before anything is sampled), and the results the trained roles had against each.

use std::collections::{BTreeMap, HashMap};

use arrow::array::AsArray;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Float64Type, Int64Type};

use crate::config::RunConfig;
use crate::policies::{self, LeagueRule, LoadedPolicies, Record, past_member};
use crate::rng::{Key, text_key};
use crate::sql::RunSql;
use crate::store::RunStore;
use crate::tables::TaskRow;
use crate::workflows::Agent;

use super::Error;

/// (task index, role) -> (policy, version) the role plays in that task.
pub type Opponents = BTreeMap<(usize, Agent), (String, u32)>;

/// Draws every league role's version for each task of iteration `iteration`'s batch.
pub async fn draw(store: &RunStore, config: &RunConfig, iteration: u32, tasks: &[TaskRow]) -> Result<Opponents, Error> {
    let mut opponents = Opponents::new();
    let markers = store.markers().await?;
    let current = config.sampled_version(iteration);
    for (&role, agent) in &config.agents {
        let Some(rule) = agent.league.map(|l| l.rule()) else { continue };
        let stored = policies::stored_versions(&markers, &agent.policy);
        let records = match rule {
            LeagueRule::TowardLosses(_) => records(store, role, iteration).await?,
            _ => BTreeMap::new(),
        };
        for (index, task) in tasks.iter().enumerate() {
            let keys = [config.seed, Key::LEAGUE, iteration as u64, text_key(&task.task_id), text_key(role.as_str())];
            let version = rule.draw(current, &stored, &records, &keys).ok_or_else(|| Error::League {
                role,
                reason: format!(
                    "{rule:?} has no version of policy {} stored when version {current} samples (stored: {stored:?})",
                    agent.policy
                ),
            })?;
            opponents.insert((index, role), (agent.policy.clone(), version));
        }
    }
    Ok(opponents)
}

/// The same version `version` of each league role's policy in every one of `tasks` tasks.
pub fn at_version(config: &RunConfig, tasks: usize, version: u32) -> Opponents {
    let roles = config.agents.iter().filter(|(_, a)| a.league.is_some());
    roles.flat_map(|(&role, a)| (0..tasks).map(move |t| ((t, role), (a.policy.clone(), version)))).collect()
}

/// Loads the opponents' versions beside the current ones; returns the member each
/// (task, role) plays with, for `Setup::league`.
pub async fn load(
    store: &RunStore,
    config: &RunConfig,
    opponents: &Opponents,
    loaded: &mut LoadedPolicies,
) -> Result<HashMap<(usize, Agent), String>, Error> {
    let versions: std::collections::BTreeSet<(String, u32)> = opponents.values().cloned().collect();
    policies::load_past(store, &config.policies, versions, loaded).await?;
    Ok(opponents.iter().map(|(&key, (policy, version))| (key, past_member(policy, *version))).collect())
}

/// The trained roles' record against each version `role` played in the rollouts before
/// iteration `iteration`: per episode, its final step's team reward from their side (one
/// minus the league role's own, where the league role moved last: a zero-sum game).
async fn records(store: &RunStore, role: Agent, iteration: u32) -> Result<BTreeMap<u32, Record>, Error> {
    let sql = RunSql::open_deterministic(store).await?;
    let (_, batches) = sql.query(&records_sql(role.as_str(), iteration)).await?;
    let mut records = BTreeMap::new();
    for batch in batches {
        let column = |i: usize, to: &DataType| cast(batch.column(i), to).expect("counts and sums cast");
        let (versions, games, scores) =
            (column(0, &DataType::Int64), column(1, &DataType::Int64), column(2, &DataType::Float64));
        let (versions, games, scores) = (
            versions.as_primitive::<Int64Type>(),
            games.as_primitive::<Int64Type>(),
            scores.as_primitive::<Float64Type>(),
        );
        for i in 0..batch.num_rows() {
            let record = Record { games: games.value(i) as u64, score: scores.value(i) };
            records.insert(versions.value(i) as u32, record);
        }
    }
    Ok(records)
}

fn records_sql(role: &str, iteration: u32) -> String {
    format!(
        "WITH met AS (SELECT DISTINCT iteration, task_id, episode, policy_version AS version FROM turns \
           WHERE agent = '{role}' AND trainable = false AND iteration < {iteration}), \
         last AS (SELECT iteration, task_id, episode, \
           CASE WHEN agent = '{role}' THEN 1.0 - team_reward ELSE team_reward END AS result, \
           row_number() OVER (PARTITION BY iteration, task_id, episode ORDER BY turn DESC, node_id DESC) AS place \
           FROM turns WHERE selected AND iteration < {iteration}) \
         SELECT version, count(*) AS games, sum(result) AS score \
         FROM met JOIN last USING (iteration, task_id, episode) WHERE place = 1 GROUP BY version ORDER BY version"
    )
}
