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

use super::{Error, Session, league};

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
    for mut played in plays(config, iteration) {
        if let Some(version) = played.opponent_version {
            let opponents = league::at_version(config, test.len(), version);
            played.setup.league = league::load(store, config, &opponents, &mut loaded).await?;
        }
        let setup = &played.setup;
        let started = Instant::now();
        let label = format!("{stage} {}", played.label());
        let episodes = games.len() as u64 * u64::from(setup.episodes_per_task());
        let Played { finished, model_seconds: model, sandbox_seconds: sandboxed, skipped, .. } =
            phase(progress, &label, episodes, "episodes", || {
                tokio::task::block_in_place(|| {
                    let max_prompt = evaluation.max_prompt_tokens as usize;
                    let mut responder = engine.responder(&mut loaded, &evaluation.sampling, max_prompt);
                    play::play(games.start(setup)?, setup, responder.as_mut(), &sandbox, progress)
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
        rows.extend(finished.iter().map(|f| EvalRow {
            task_id: test[f.task_index].task_id.clone(),
            env: config.env.name().to_string(),
            mode: played.mode_name().to_string(),
            sample: f.episode,
            policies: describe(setup, &loaded, f.task_index),
            success: if played.mode == EvalMode::ToolAlone { f.tool_success } else { f.success },
            reward: f.team_reward,
            turns: f.turns,
            tokens: f.tokens,
            seconds,
            opponent_version: played.opponent_version,
        }));
    }
    let info = CommitInfo {
        inputs: vec![prepared.input_ref()],
        policies_used: loaded.refs(),
        opponents_used: loaded.past_refs(),
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

/// One set of episodes of an evaluation: a mode, or the league's roles at a past version
/// against the current policies (`evaluation.against`).
struct Evaluated {
    mode: EvalMode,
    setup: Setup,
    opponent_version: Option<u32>,
}

impl Evaluated {
    /// The `evals.mode` of its rows.
    fn mode_name(&self) -> &'static str {
        if self.opponent_version.is_some() { "league" } else { self.mode.name() }
    }

    fn label(&self) -> String {
        self.opponent_version.map_or_else(|| self.mode.name().to_string(), |v| format!("league v{v}"))
    }
}

/// Every configured mode, then each past version of `evaluation.against` stored by
/// iteration `iteration` (a later one is not played yet).
fn plays(config: &RunConfig, iteration: u32) -> Vec<Evaluated> {
    let modes = config.evaluation.modes.iter().enumerate().map(|(index, &mode)| Evaluated {
        mode,
        setup: setup(config, mode, iteration, index as u64),
        opponent_version: None,
    });
    let past = config.evaluation.against.iter().filter(|&&v| v <= iteration).map(|&version| {
        let mode = EvalMode::MultiAgent;
        let setup = Setup {
            opponent: None,
            policies: config.agent_policies(),
            ..setup(config, mode, iteration, Key::LEAGUE + u64::from(version))
        };
        Evaluated { mode, setup, opponent_version: Some(version) }
    });
    modes.chain(past).collect()
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
        league: HashMap::new(),
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

/// `role=policy@vN` pairs in role order as task `task` plays them, e.g.
/// `planner=shared@v3,tool=shared@v3`, or `player_o=minimax` for the solver's role.
fn describe(setup: &Setup, loaded: &LoadedPolicies, task: usize) -> String {
    let mut pairs: Vec<String> = setup
        .policies
        .keys()
        .map(|role| {
            let played = setup.league.get(&(task, *role)).unwrap_or(&setup.policies[role]);
            match loaded.member(played) {
                Some(m) => format!("{role}={}@v{}", m.policy, m.version),
                None => format!("{role}={played}@v0"),
            }
        })
        .collect();
    pairs.extend(setup.opponent.map(|role| format!("{role}=minimax")));
    pairs.sort();
    pairs.join(",")
}
