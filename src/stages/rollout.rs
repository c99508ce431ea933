//! The rollout stage: iteration k's batch of training tasks (`tasks::batch`) played with
//! version k of every policy (strictly: an older or newer latest checkpoint is refused),
//! or with `rollout.max_staleness` s, version k − s (`RunConfig::sampled_version`), every
//! candidate written to `turns` with its staleness.
//!
//! Sharding (`--shard i/n`) plays the tasks whose position in the batch is i mod n; seeds
//! are per task, so shards together write exactly the rows one unsharded rollout writes.
//! A replay fork's rollout is not sampled here: the pipeline runs `replay` instead.

use crate::config::RunConfig;
use crate::limits::Limits;
use std::collections::HashMap;

use crate::play::{self, Branching, Played, Setup};
use crate::policies::{self, LoadedPolicies};
use crate::progress::{Progress, phase};
use crate::rng::Key;
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::store::{CommitInfo, CommitMarker, RunStore, Shard, Split, Stage, StageId};
use crate::tables::{TaskRow, TurnRow};
use crate::tasks;

use super::{Error, Session, league};

/// What helps a rollout that runs out of memory.
const MEMORY_KNOB: &str = "a smaller rollout.kv_cache_gib, fewer prompts at once (rollout.tasks_per_iteration × \
     rollout.branches or episodes_per_task, or a shard per worker with --worker) or shorter ones (rollout.max_prompt_tokens, \
     rollout.sampling.max_new_tokens)";

/// Plays iteration `iteration`'s batch (or one shard of it) and commits its `turns`.
pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    shard: Option<Shard>,
    progress: &dyn Progress,
    session: &Session,
) -> Result<CommitMarker, Error> {
    let stage = StageId { shard, ..StageId::at(Stage::Rollout, iteration) };
    super::refuse_if_committed(store, stage).await?;
    let writer = store.begin(stage);
    let (prepared, train) = tasks::read(store, Split::Train).await?;
    let batch = tasks::batch(&train, config.rollout.tasks_per_iteration, config.seed, iteration, shard);
    // Drawn before anything starts: an opponent not stored is refused here, not mid-rollout.
    let opponents = league::draw(store, config, iteration, &batch).await?;
    let mut setup = setup(config, iteration);
    let games = play::games(&config.env, &config.team(), &config.limits, &batch)?;
    // Agent programs import while the policies load.
    let started = games.start(&setup)?;
    let version = config.sampled_version(iteration);
    let mut loaded = policies::load_for_rollout(store, &config.policies, iteration, version, &session.policies).await?;
    setup.league = league::load(store, config, &opponents, &mut loaded).await?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let rollout = &config.rollout;
    let engine = session.engine(rollout.engine, rollout.kv_cache_gib, store, config, &mut loaded).await?;
    let episodes = games.len() as u64 * u64::from(setup.episodes_per_task());
    let played = phase(progress, &stage.to_string(), episodes, "episodes", || {
        tokio::task::block_in_place(|| {
            let mut responder = engine.responder(&mut loaded, &rollout.sampling, rollout.max_prompt_tokens as usize);
            play::play(started, &setup, responder.as_mut(), &sandbox, progress)
        })
    })
    .map_err(|e| Error::from(e).out_of_memory_in(stage, None, MEMORY_KNOB))?;
    let mut rows = turn_rows(config, iteration, &batch, &played, &loaded);
    super::credit(&mut rows, &config.algorithm);
    check_rewards(stage, &rows, &config.limits)?;
    let info = CommitInfo {
        inputs: vec![prepared.input_ref()],
        policies_used: loaded.refs(),
        opponents_used: loaded.past_refs(),
        model_seconds: played.model_seconds,
        sandbox_seconds: played.sandbox_seconds,
        skipped_tasks: played.skipped.iter().map(|&t| batch[t].task_id.clone()).collect(),
        failed_episodes: super::failed_episodes(&batch, &played.finished),
        ..super::run_info(config)
    };
    let marker = super::commit_by_agent(writer, rows, info).await?;
    session.policies.give_back(loaded);
    Ok(marker)
}

/// An error naming the first candidate whose reward is not finite or past `limits.reward`.
fn check_rewards(stage: StageId, rows: &[TurnRow], limits: &Limits) -> Result<(), Error> {
    for row in rows {
        for (column, value) in [("local_reward", row.local_reward), ("team_reward", row.team_reward)] {
            if !limits.allows_reward(value) {
                let candidate = row.candidate_id.clone();
                return Err(Error::Reward { stage, candidate, column, value, limit: limits.reward });
            }
        }
    }
    Ok(())
}

fn setup(config: &RunConfig, iteration: u32) -> Setup {
    let rollout = &config.rollout;
    Setup {
        workflow: config.workflow.kind,
        max_turns: config.workflow.max_turns,
        alone: config.workflow.alone,
        opponent: None,
        policies: config.agent_policies(),
        league: HashMap::new(),
        branching: Branching::new(rollout.mode, rollout.group_size(), rollout.select, config.algorithm.alpha),
        seed_keys: vec![config.seed, iteration as u64, Key::ROLLOUT],
        overlong_prompt: rollout.overlong_prompt,
    }
}

fn turn_rows(
    config: &RunConfig,
    iteration: u32,
    batch: &[TaskRow],
    played: &Played,
    loaded: &LoadedPolicies,
) -> Vec<TurnRow> {
    let sampling = &config.rollout.sampling;
    let failures: HashMap<(usize, u32), &String> =
        played.finished.iter().filter_map(|f| Some(((f.task_index, f.episode), f.failure.as_ref()?))).collect();
    played
        .candidates
        .iter()
        .map(|c| {
            let task_id = &batch[c.task_index].task_id;
            let member = loaded.member(&c.policy);
            let (policy, version) = member.map_or((&c.policy, iteration), |m| (&m.policy, m.version));
            // A league's past version is never trained, whatever its policy.
            let past = *policy != c.policy;
            let trainable = !past && config.policies.get(policy).is_none_or(|p| p.trainable);
            let o = &c.outcome;
            TurnRow {
                candidate_id: format!("{task_id}/e{}/t{}/{}/b{}", c.episode, c.turn, c.agent, c.branch),
                run: config.run_name(),
                task_id: task_id.clone(),
                episode: c.episode,
                turn: c.turn,
                agent: c.agent.to_string(),
                policy: policy.clone(),
                policy_version: member.map_or(0, |m| m.version),
                weights_sha256: member.map_or_else(String::new, |m| m.weights_sha256.clone()),
                engine: c.reply.engine.name().to_string(),
                engine_model: c.reply.engine_model.clone(),
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
                failure: failures.get(&(c.task_index, c.episode)).map(|f| f.to_string()),
                credited_reward: None,
                // A frozen policy's only version is never behind; a past one is not trained.
                staleness: (!past).then(|| if trainable { iteration - version } else { 0 }),
                trainable: Some(trainable),
            }
        })
        .collect()
}
