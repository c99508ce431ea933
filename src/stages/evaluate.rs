//! The evaluate stage: independent episodes on the test split with version k of every
//! policy (what iteration k samples with; k = `iterations` is the final policy), in each
//! configured mode, written to `evals` under iteration k.
//!
//! * multi_agent: the configured workflow and agent→policy map.
//! * single_agent: the environment's single-agent workflow, played by the first role's policy.
//! * swapped: the configured workflow with the two roles' policies exchanged.
//! * alone: the configured workflow with each agent acting alone (tool_planner); success
//!   is the planner's.
//! * tool_alone: the same episodes; success is the tool agent's own answer.
//!
//! With tic-tac-toe's `env.eval_opponent: minimax`, the two-player modes play X with the
//! trained policy (in swapped, O's) against a perfect minimax O.
//!
//! multi_agent and swapped play the agents together also where `workflow.alone` trains
//! them apart: that is the paper's "train in single agent, evaluate in MAS".
//!
//! Sharding (`--shard i/n`) keeps the test tasks at positions i mod n; seeds are per task,
//! so the shards together write the rows one unsharded evaluation writes.

use std::collections::HashMap;
use std::time::Instant;

use crate::config::{EvalMode, RunConfig};
use crate::envs::EnvConfig;
use crate::envs::tic_tac_toe::Opponent;
use crate::play::{self, Branching, Played, Setup};
use crate::policies::LoadedPolicies;
use crate::progress::{Progress, phase};
use crate::rng::Key;
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::store::{CommitInfo, CommitMarker, RunStore, Shard, Split, Stage, StageId};
use crate::tables::EvalRow;
use crate::tasks;
use crate::workflows::{Agent, WorkflowKind};

use super::{Error, Session};

pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    shard: Option<Shard>,
    progress: &dyn Progress,
    session: &Session,
) -> Result<CommitMarker, Error> {
    let stage = StageId { shard, ..StageId::at(Stage::Evaluate, iteration) };
    super::refuse_if_committed(store, stage).await?;
    let writer = store.begin(stage);
    let (prepared, mut test) = tasks::read(store, Split::Test).await?;
    test.truncate(config.evaluation.tasks as usize);
    let test: Vec<_> =
        test.into_iter().enumerate().filter(|(i, _)| shard.is_none_or(|s| s.holds(*i))).map(|(_, t)| t).collect();
    let games = play::games(&config.env, &config.team(), &config.limits, &test)?;
    let mut loaded = session.policies.take(store, &config.policies, iteration).await?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let evaluation = &config.evaluation;
    let engine = session.engine(evaluation.engine, evaluation.kv_cache_gib, store, config, &mut loaded).await?;
    let mut rows = Vec::new();
    let (mut model_seconds, mut sandbox_seconds) = (0.0, 0.0);
    let mut skipped_tasks: Vec<String> = Vec::new();
    let mut failed_episodes: Vec<String> = Vec::new();
    for (mode_index, &mode) in config.evaluation.modes.iter().enumerate() {
        let setup = setup(config, mode, iteration, mode_index as u64);
        let started = Instant::now();
        let label = format!("{stage} {}", mode.name());
        let episodes = games.len() as u64 * u64::from(setup.episodes_per_task());
        let Played { finished, model_seconds: model, sandbox_seconds: sandboxed, skipped, .. } =
            phase(progress, &label, episodes, "episodes", || {
                tokio::task::block_in_place(|| {
                    let max_prompt = evaluation.max_prompt_tokens as usize;
                    let mut responder = engine.responder(&mut loaded, &evaluation.sampling, max_prompt);
                    play::play(games.start(&setup)?, &setup, responder.as_mut(), &sandbox, progress)
                })
            })
            .map_err(|e| {
                let knob = "a smaller evaluation.tasks, a shard per worker (--worker), or shorter prompts \
                            (evaluation.max_prompt_tokens, evaluation.sampling.max_new_tokens)";
                Error::from(e).out_of_memory_in(stage, None, knob)
            })?;
        model_seconds += model;
        sandbox_seconds += sandboxed;
        for task in skipped.iter().map(|&t| &test[t].task_id) {
            if !skipped_tasks.contains(task) {
                skipped_tasks.push(task.clone());
            }
        }
        failed_episodes.extend(super::failed_episodes(&test, &finished));
        let seconds = started.elapsed().as_secs_f64() / finished.len().max(1) as f64;
        let policies = describe(&setup, &loaded);
        rows.extend(finished.iter().map(|f| EvalRow {
            task_id: test[f.task_index].task_id.clone(),
            env: config.env.name().to_string(),
            mode: mode.name().to_string(),
            sample: f.episode,
            policies: policies.clone(),
            success: if mode == EvalMode::ToolAlone { f.tool_success } else { f.success },
            reward: f.team_reward,
            turns: f.turns,
            tokens: f.tokens,
            seconds,
        }));
    }
    let info = CommitInfo {
        inputs: vec![prepared.input_ref()],
        policies_used: loaded.refs(),
        model_seconds,
        sandbox_seconds,
        skipped_tasks,
        failed_episodes,
        ..super::run_info(config)
    };
    let marker = super::commit_rows(writer, &rows, info).await?;
    session.policies.give_back(loaded);
    Ok(marker)
}

fn setup(config: &RunConfig, mode: EvalMode, iteration: u32, mode_key: u64) -> Setup {
    let configured = config.agent_policies();
    let team = config.team();
    let roles = team.as_slice();
    let (workflow, policies) = match mode {
        EvalMode::MultiAgent | EvalMode::Alone | EvalMode::ToolAlone => (config.workflow.kind, configured),
        EvalMode::SingleAgent => {
            let first = configured[&roles[0]].clone();
            (WorkflowKind::SingleAgent, HashMap::from([(Agent::SINGLE, first)]))
        }
        EvalMode::Swapped => {
            let mut swapped = configured.clone();
            if let [a, b] = roles {
                swapped.insert(*a, configured[b].clone());
                swapped.insert(*b, configured[a].clone());
            }
            (config.workflow.kind, swapped)
        }
    };
    let opponent = opponent(config, workflow);
    let policies = policies.into_iter().filter(|(role, _)| Some(*role) != opponent).collect();
    Setup {
        workflow,
        max_turns: config.workflow.max_turns,
        alone: matches!(mode, EvalMode::Alone | EvalMode::ToolAlone),
        opponent,
        policies,
        branching: Branching::Independent { episodes: config.evaluation.samples.max(1) },
        seed_keys: vec![config.seed, iteration as u64, Key::EVALUATE, mode_key],
        overlong_prompt: config.evaluation.overlong_prompt,
    }
}

/// The role tic-tac-toe's minimax plays at evaluation when `env.eval_opponent` asks for it:
/// O, against the trained policy's X.
fn opponent(config: &RunConfig, workflow: WorkflowKind) -> Option<Agent> {
    let EnvConfig::TicTacToe(game) = &config.env else { return None };
    (game.eval_opponent == Opponent::Minimax && workflow == WorkflowKind::TwoPlayers).then_some(Agent::PLAYER_O)
}

/// `role=policy@vN` pairs in role order, e.g. `planner=shared@v3,tool=shared@v3`, or
/// `player_o=minimax` for the solver's role.
fn describe(setup: &Setup, loaded: &LoadedPolicies) -> String {
    let mut pairs: Vec<String> = setup
        .policies
        .iter()
        .map(|(role, p)| format!("{role}={p}@v{}", loaded.member(p).map_or(0, |m| m.version)))
        .collect();
    pairs.extend(setup.opponent.map(|role| format!("{role}=minimax")));
    pairs.sort();
    pairs.join(",")
}
