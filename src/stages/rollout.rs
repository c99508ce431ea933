//! The rollout stage: iteration k's batch of training tasks (`tasks::batch`) played with
//! version k of every policy (strictly: an older or newer latest checkpoint is refused),
//! every candidate written to `turns`.
//!
//! Sharding (`--shard i/n`) plays the tasks whose position in the batch is i mod n; seeds
//! are per task, so shards together write exactly the rows one unsharded rollout writes.
//! A replay fork's rollout is not sampled here: the pipeline runs `replay` instead.

use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::engine::EngineKind;
use crate::model::SamplingConfig;
use crate::play::{self, Branching, Candidate, OverlongPrompt, RolloutMode, Selection, Setup};
use crate::policies::{self, LoadedPolicies, Resident};
use crate::progress::{Progress, phase};
use crate::rng::Key;
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::store::{CommitInfo, CommitMarker, RunStore, Shard, Split, Stage, StageId};
use crate::tables::{TaskRow, TurnRow};
use crate::tasks;
use crate::validate::{Invalid, check};

use super::Error;
use super::engine::StageEngine;

/// `rollout:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// Training tasks per iteration (B).
    pub tasks_per_iteration: u32,
    /// Candidates per (task, agent, turn) in tree mode, trajectories per task otherwise (K).
    pub k: u32,
    /// tree: AT-GRPO's branch-and-select sampling; independent: K separate trajectories.
    pub mode: RolloutMode,
    /// How the candidate that continues the trajectory is chosen in tree mode.
    pub select: Selection,
    /// Sampling settings.
    pub sampling: SamplingConfig,
    /// Longest prompt (chat template applied) a rollout or evaluation may send; a longer
    /// one is never cut: it fails the stage or skips its task (`overlong_prompt`).
    pub max_prompt_tokens: u32,
    /// A prompt longer than `max_prompt_tokens`: error (the stage fails, naming the
    /// limit) or skip (its task is left out of the stage, and the commit lists it).
    pub overlong_prompt: OverlongPrompt,
    /// Memory for the sampler's key/value caches, GiB; a share of the device's free
    /// memory when unset. Batches are sized from it.
    pub kv_cache_gib: Option<f64>,
    /// Who samples: tch (petting's own sampler) or vllm (the server of `vllm:`).
    pub engine: EngineKind,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            tasks_per_iteration: 16,
            k: 4,
            mode: RolloutMode::Tree,
            select: Selection::BestReward,
            sampling: SamplingConfig::default(),
            max_prompt_tokens: 4096,
            overlong_prompt: OverlongPrompt::Error,
            kv_cache_gib: None,
            engine: EngineKind::Tch,
        }
    }
}

impl RolloutConfig {
    pub fn validate(&self, train_tasks: u32) -> Result<(), Invalid> {
        check(self.k >= 1, "rollout.k", "must be at least 1")?;
        check(self.tasks_per_iteration >= 1, "rollout.tasks_per_iteration", "must be at least 1")?;
        check(
            self.tasks_per_iteration <= train_tasks,
            "rollout.tasks_per_iteration",
            format!("{} is more than data.train_tasks ({train_tasks})", self.tasks_per_iteration),
        )?;
        check(self.max_prompt_tokens >= 1, "rollout.max_prompt_tokens", "must be at least 1")?;
        check_kv_cache_gib(self.kv_cache_gib, "rollout.kv_cache_gib")?;
        self.sampling.validate("rollout.sampling")
    }
}

/// What helps a rollout that runs out of memory.
const MEMORY_KNOB: &str = "a smaller rollout.kv_cache_gib, fewer prompts at once (rollout.tasks_per_iteration × \
     rollout.k, or a shard per worker with --worker) or shorter ones (rollout.max_prompt_tokens, \
     rollout.sampling.max_new_tokens)";

/// `kv_cache_gib` of rollout and evaluation: unset, or a positive size.
pub(crate) fn check_kv_cache_gib(gib: Option<f64>, key: &str) -> Result<(), Invalid> {
    check(
        gib.is_none_or(|g| g > 0.0 && g.is_finite()),
        key,
        "must be a positive number of GiB (unset: a share of the device's free memory)",
    )
}

/// Plays iteration `iteration`'s batch (or one shard of it) and commits its `turns`.
pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    shard: Option<Shard>,
    progress: &dyn Progress,
    resident: &Resident,
) -> Result<CommitMarker, Error> {
    let stage = StageId { shard, ..StageId::at(Stage::Rollout, iteration) };
    super::refuse_if_committed(store, stage).await?;
    let writer = store.begin(stage);
    let (prepared, train) = tasks::read(store, Split::Train).await?;
    let batch = tasks::batch(&train, config, iteration, shard);
    let mut loaded = policies::load_current(store, config, iteration, resident).await?;
    let setup = setup(config, iteration);
    let games = play::games(&config.env, &batch)?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let rollout = &config.rollout;
    let engine =
        StageEngine::prepare(rollout.engine, rollout.kv_cache_gib, store, config, &mut loaded, resident).await?;
    let episodes = games.len() as u64 * u64::from(setup.episodes_per_task());
    let played = phase(progress, &stage.to_string(), episodes, "episodes", || {
        tokio::task::block_in_place(|| {
            let max_prompt = rollout.max_prompt_tokens as usize;
            engine.play(&mut loaded, &rollout.sampling, max_prompt, &games, &setup, &sandbox, progress)
        })
    })
    .map_err(|e| Error::from(e).out_of_memory_in(stage, None, MEMORY_KNOB))?;
    let rows = turn_rows(config, &batch, &played.candidates, &loaded);
    let info = CommitInfo {
        inputs: vec![prepared.input_ref()],
        policies_used: loaded.refs(),
        model_seconds: played.model_seconds,
        sandbox_seconds: played.sandbox_seconds,
        skipped_tasks: played.skipped.iter().map(|&t| batch[t].task_id.clone()).collect(),
        ..super::run_info(config)
    };
    let marker = super::commit_by_agent(writer, rows, info).await?;
    resident.give_back(loaded);
    Ok(marker)
}

fn setup(config: &RunConfig, iteration: u32) -> Setup {
    let rollout = &config.rollout;
    Setup {
        workflow: config.workflow.kind,
        max_turns: config.workflow.max_turns,
        alone: config.workflow.alone,
        opponent: None,
        policies: config.agent_policies(),
        branching: Branching::new(rollout.mode, rollout.k, rollout.select, config.algorithm.alpha),
        seed_keys: vec![config.seed, iteration as u64, Key::ROLLOUT],
        overlong_prompt: rollout.overlong_prompt,
    }
}

fn turn_rows(config: &RunConfig, batch: &[TaskRow], candidates: &[Candidate], loaded: &LoadedPolicies) -> Vec<TurnRow> {
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
                policy_version: loaded.member(&c.policy).map_or(0, |m| m.version),
                weights_sha256: loaded.member(&c.policy).map_or_else(String::new, |m| m.weights_sha256.clone()),
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
            }
        })
        .collect()
}
