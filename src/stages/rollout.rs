//! The rollout stage: iteration k's batch of training tasks played with version k of
//! every policy (strictly: an older or newer latest checkpoint is refused), every
//! candidate written to `turns`.
//!
//! The batch is the k-th slice of B tasks of a per-epoch seeded shuffle of the train split,
//! so every task is seen once per epoch. Sharding (`--shard i/n`) keeps the tasks whose
//! position in the batch is i mod n; seeds are per task, so shards together write exactly
//! the rows one unsharded rollout writes.

use std::collections::{BTreeMap, HashMap};

use crate::config::RunConfig;
use crate::envs::AnyEnv;
use crate::envs::rng::{SplitMix64, stream};
use crate::model::GenerationSettings;
use crate::progress::{Progress, phase};
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::store::{CommitInfo, CommitMarker, PolicyRef, RunStore, Shard, Split, Stage, StageId, StageWriter};
use crate::tables::{TaskRow, TurnRow};

use super::checkpoints::{self, LoadedPolicy};
use super::play::{self, Candidate, Game, Plan};
use super::responder::ModelResponder;
use super::{Error, tasks};

/// Stage key of rollout seeds.
const ROLLOUT: u64 = 0x2011;

/// Plays iteration `iteration`'s batch (or one shard of it) and commits its `turns`.
pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    shard: Option<Shard>,
    progress: &dyn Progress,
) -> Result<CommitMarker, Error> {
    let stage = StageId { shard, ..StageId::at(Stage::Rollout, iteration) };
    super::refuse_if_committed(store, stage).await?;
    if let Some(fork) = super::replay::replays(config, iteration) {
        return super::replay::rollout(store, config, fork, shard).await;
    }
    let writer = store.begin(stage);
    let (prepared, train) = tasks::read(store, Split::Train).await?;
    let batch = batch(&train, config, iteration, shard);
    let mut loaded = load_current(store, config, iteration).await?;
    let plan = plan(config, iteration);
    let games = games(config, &batch)?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let settings = GenerationSettings::from_config(&config.rollout.sampling);
    let episodes = games.len() as u64 * u64::from(plan.episodes_per_task());
    let played = phase(progress, &stage.to_string(), episodes, "episodes", || {
        tokio::task::block_in_place(|| {
            let mut responder = ModelResponder::new(&mut loaded, settings, config.rollout.max_prompt_tokens as usize);
            play::play(&games, &plan, &mut responder, &sandbox, progress)
        })
    })?;
    let rows = turn_rows(config, &batch, &played.candidates, &loaded);
    let info = CommitInfo {
        inputs: vec![prepared.input_ref()],
        policies_used: policy_refs(&loaded),
        model_seconds: played.model_seconds,
        sandbox_seconds: played.sandbox_seconds,
        ..super::run_info(config)
    };
    commit_by_agent(writer, rows, info).await
}

/// Commits a rollout's rows, one part per agent.
pub(super) async fn commit_by_agent(
    writer: StageWriter<'_>,
    rows: Vec<TurnRow>,
    info: CommitInfo,
) -> Result<CommitMarker, Error> {
    // One part per agent (a stable partition: each agent's rows keep their order), so
    // predicates on `agent`, and on `policy` when roles have their own, skip whole files.
    let mut agents: Vec<&str> = rows.iter().map(|r| r.agent.as_str()).collect();
    agents.sort_unstable();
    agents.dedup();
    let by_agent: Vec<Vec<TurnRow>> =
        agents.iter().map(|a| rows.iter().filter(|r| r.agent == *a).cloned().collect()).collect();
    let parts: Vec<&[TurnRow]> = by_agent.iter().map(Vec::as_slice).collect();
    super::commit_parts(writer, &parts, info).await
}

/// Loads version `iteration` of every policy, refusing when it is not the latest.
pub async fn load_current(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
) -> Result<BTreeMap<String, LoadedPolicy>, Error> {
    let mut loaded = BTreeMap::new();
    for name in config.policies.keys() {
        let latest = checkpoints::latest(store, name).await?;
        if latest.as_ref().map(|r| r.version) != Some(iteration) {
            return Err(Error::StaleVersion {
                policy: name.clone(),
                wanted: iteration,
                latest: latest.map(|r| r.version),
            });
        }
        loaded.insert(name.clone(), checkpoints::load(store, config, name, iteration).await?);
    }
    Ok(loaded)
}

pub fn policy_refs(loaded: &BTreeMap<String, LoadedPolicy>) -> Vec<PolicyRef> {
    loaded
        .values()
        .map(|l| PolicyRef { policy: l.name.clone(), version: l.version, weights_sha256: l.weights_sha256.clone() })
        .collect()
}

/// The tasks of iteration k (or of one shard of it).
pub fn batch(train: &[TaskRow], config: &RunConfig, iteration: u32, shard: Option<Shard>) -> Vec<TaskRow> {
    let b = config.rollout.tasks_per_iteration as usize;
    let n = train.len();
    (0..b)
        .filter(|i| shard.is_none_or(|s| s.holds(*i)))
        .map(|i| {
            let position = iteration as usize * b + i;
            let order = epoch_order(n, config.seed, (position / n) as u64);
            train[order[position % n]].clone()
        })
        .collect()
}

/// A seeded permutation of 0..n for one pass over the train split (Fisher–Yates).
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(stream(&[seed, ROLLOUT, epoch]));
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

pub fn plan(config: &RunConfig, iteration: u32) -> Plan {
    Plan {
        workflow: config.workflow.kind,
        max_turns: config.workflow.max_turns,
        alone: config.workflow.alone,
        policies: agent_policies(config),
        mode: config.rollout.mode,
        k: config.rollout.k,
        select: config.rollout.select,
        alpha: config.algorithm.alpha,
        seed_keys: vec![config.seed, iteration as u64, ROLLOUT],
    }
}

pub fn agent_policies(config: &RunConfig) -> HashMap<String, String> {
    config.agents.iter().map(|(role, agent)| (role.clone(), agent.policy.clone())).collect()
}

pub fn games(config: &RunConfig, tasks: &[TaskRow]) -> Result<Vec<Game>, Error> {
    tasks
        .iter()
        .map(|t| Ok(Game { task_id: t.task_id.clone(), env: AnyEnv::from_instance(&config.env, &t.instance)? }))
        .collect()
}

fn turn_rows(
    config: &RunConfig,
    batch: &[TaskRow],
    candidates: &[Candidate],
    loaded: &BTreeMap<String, LoadedPolicy>,
) -> Vec<TurnRow> {
    let sampling = &config.rollout.sampling;
    candidates
        .iter()
        .map(|c| {
            let task_id = &batch[c.task_index].task_id;
            let o = &c.outcome;
            TurnRow {
                candidate_id: format!("{task_id}/e{}/t{}/{}/b{}", c.episode, c.turn, c.agent, c.branch),
                run: config.run_name(),
                task_id: task_id.clone(),
                episode: c.episode,
                turn: c.turn,
                agent: c.agent.to_string(),
                policy: c.policy.clone(),
                policy_version: loaded[&c.policy].version,
                branch: c.branch,
                node_id: c.node_id,
                parent_id: c.parent_id,
                selected: c.selected,
                prompt_message: c.message.clone(),
                prompt_text: c.reply.prompt_text.clone(),
                prompt_tokens: c.reply.prompt_tokens.clone(),
                response_text: c.reply.text.clone(),
                response_tokens: c.reply.tokens.clone(),
                response_logprobs: c.reply.logprobs.clone(),
                finish_reason: c.reply.finish_reason.clone(),
                action: o.action.clone(),
                parse_error: o.parse_error.clone(),
                feedback: o.feedback.clone(),
                local_reward: o.local_reward,
                team_reward: o.team_reward,
                done: o.done,
                success: o.success,
                temperature: sampling.temperature as f32,
                top_p: sampling.top_p as f32,
                top_k: sampling.top_k,
                sampling_seed: c.seed,
                generation_seconds: c.reply.seconds,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_visit_every_task_once() {
        let mut order = epoch_order(37, 5, 2);
        assert_ne!(order, (0..37).collect::<Vec<_>>());
        order.sort();
        assert_eq!(order, (0..37).collect::<Vec<_>>());
        assert_eq!(epoch_order(37, 5, 2), epoch_order(37, 5, 2));
        assert_ne!(epoch_order(37, 5, 2), epoch_order(37, 5, 3));
    }
}
