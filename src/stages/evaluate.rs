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
//! multi_agent and swapped play the agents together also where `workflow.alone` trains
//! them apart: that is the paper's "train in single agent, evaluate in MAS".
//!
//! Sharding (`--shard i/n`) keeps the test tasks at positions i mod n; seeds are per task,
//! so the shards together write the rows one unsharded evaluation writes.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::config::{EvalMode, RolloutMode, RunConfig, Selection, WorkflowKind};
use crate::model::GenerationSettings;
use crate::progress::{Progress, phase};
use crate::sandbox::{Sandbox, SandboxConfig};
use crate::store::{CommitInfo, CommitMarker, RunStore, Shard, Split, Stage, StageId};
use crate::tables::EvalRow;

use super::checkpoints::{self, LoadedPolicy};
use super::play::{self, Plan, Played};
use super::responder::ModelResponder;
use super::rollout::{agent_policies, games, policy_refs};
use super::{Error, tasks};

/// Stage key of evaluation seeds.
const EVALUATE: u64 = 0xE7A1;

pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    shard: Option<Shard>,
    progress: &dyn Progress,
) -> Result<CommitMarker, Error> {
    let stage = StageId { shard, ..StageId::at(Stage::Evaluate, iteration) };
    super::refuse_if_committed(store, stage).await?;
    let writer = store.begin(stage);
    let (prepared, mut test) = tasks::read(store, Split::Test).await?;
    test.truncate(config.evaluation.tasks as usize);
    let test: Vec<_> =
        test.into_iter().enumerate().filter(|(i, _)| shard.is_none_or(|s| s.holds(*i))).map(|(_, t)| t).collect();
    let games = games(config, &test)?;
    let mut loaded = BTreeMap::new();
    for name in config.policies.keys() {
        loaded.insert(name.clone(), checkpoints::load(store, config, name, iteration).await?);
    }
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let mut rows = Vec::new();
    let (mut model_seconds, mut sandbox_seconds) = (0.0, 0.0);
    for (mode_index, &mode) in config.evaluation.modes.iter().enumerate() {
        let plan = plan(config, mode, iteration, mode_index as u64);
        let started = Instant::now();
        let label = format!("{stage} {}", mode_name(mode));
        let episodes = games.len() as u64 * u64::from(plan.episodes_per_task());
        let Played { finished, model_seconds: model, sandbox_seconds: sandboxed, .. } =
            phase(progress, &label, episodes, "episodes", || {
                tokio::task::block_in_place(|| {
                    let settings = GenerationSettings::from_config(&config.evaluation.sampling);
                    let max_prompt = config.rollout.max_prompt_tokens as usize;
                    let mut responder = ModelResponder::new(&mut loaded, settings, max_prompt);
                    play::play(&games, &plan, &mut responder, &sandbox, progress)
                })
            })?;
        model_seconds += model;
        sandbox_seconds += sandboxed;
        let seconds = started.elapsed().as_secs_f64() / finished.len().max(1) as f64;
        let policies = describe(&plan.policies, &loaded);
        rows.extend(finished.iter().map(|f| EvalRow {
            task_id: test[f.task_index].task_id.clone(),
            env: config.env.name().to_string(),
            mode: mode_name(mode).to_string(),
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
        policies_used: policy_refs(&loaded),
        model_seconds,
        sandbox_seconds,
        ..super::run_info(config)
    };
    super::commit_rows(writer, &rows, info).await
}

pub fn mode_name(mode: EvalMode) -> &'static str {
    match mode {
        EvalMode::SingleAgent => "single_agent",
        EvalMode::MultiAgent => "multi_agent",
        EvalMode::Swapped => "swapped",
        EvalMode::Alone => "alone",
        EvalMode::ToolAlone => "tool_alone",
    }
}

fn plan(config: &RunConfig, mode: EvalMode, iteration: u32, mode_key: u64) -> Plan {
    let configured = agent_policies(config);
    let roles = config.workflow.kind.roles();
    let (workflow, policies) = match mode {
        EvalMode::MultiAgent | EvalMode::Alone | EvalMode::ToolAlone => (config.workflow.kind, configured),
        EvalMode::SingleAgent => {
            let first = configured[roles[0]].clone();
            (WorkflowKind::SingleAgent, HashMap::from([("agent".to_string(), first)]))
        }
        EvalMode::Swapped => {
            let mut swapped = configured.clone();
            if let [a, b] = roles {
                swapped.insert(a.to_string(), configured[*b].clone());
                swapped.insert(b.to_string(), configured[*a].clone());
            }
            (config.workflow.kind, swapped)
        }
    };
    Plan {
        workflow,
        max_turns: config.workflow.max_turns,
        alone: matches!(mode, EvalMode::Alone | EvalMode::ToolAlone),
        policies,
        mode: RolloutMode::Independent,
        k: config.evaluation.samples.max(1),
        select: Selection::First,
        alpha: config.algorithm.alpha,
        seed_keys: vec![config.seed, iteration as u64, EVALUATE, mode_key],
    }
}

/// `role=policy@vN` pairs in role order, e.g. `planner=shared@v3,tool=shared@v3`.
fn describe(policies: &HashMap<String, String>, loaded: &BTreeMap<String, LoadedPolicy>) -> String {
    let mut pairs: Vec<String> =
        policies.iter().map(|(role, p)| format!("{role}={p}@v{}", loaded.get(p).map_or(0, |l| l.version))).collect();
    pairs.sort();
    pairs.join(",")
}
