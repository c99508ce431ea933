//! The pipeline: every stage of a run in order. Resuming is nothing more than walking
//! this list and running the stages that have no commit marker yet.
//!
//! ```text
//!  prepare-data ─► update (v0: init / warm start)
//!  for k in 0..iterations:  [evaluate k] ─► rollout k ─► group k ─► advantage k ─► update k (v k+1)
//!  evaluate <iterations>    (the final policies)
//! ```
//!
//! `evaluate k` measures version k, the policies iteration k samples with; it runs at
//! k = 0 when `evaluation.at_start`, every `evaluation.every` iterations, and at the end.
//!
//! A fork of iteration K of another run (`fork` in the config) has the same schedule
//! from K on: its run-level update commits the source's version K of every policy.
//!
//! N processes can run one run together (`--worker I/N`, what the cluster recipes in
//! `deploy/` start): rollout and evaluate run in N shards, one per worker, and every
//! other stage on worker 0, while the others wait for its marker. The store is the only
//! thing they share.

pub mod driver;
pub mod headline;
pub mod inputs;
pub mod lanes;

pub use lanes::Lane;

use std::time::Duration;

use crate::config::RunConfig;
use crate::progress::Progress;
use crate::stages::{self, Error, Session, advantage, evaluate, group, prepare_data, replay, rollout, update};
use crate::store::{self, CommitMarker, RunStore, Shard, Stage, StageId};

/// The run-level update that commits version 0 of every policy.
pub const INITIAL_UPDATE: StageId = StageId { stage: Stage::Update, iteration: None, shard: None };

/// Every stage of a run, in the order they run.
pub fn schedule(config: &RunConfig) -> Vec<StageId> {
    let n = config.iterations;
    let mut stages = vec![StageId::run_level(Stage::PrepareData), INITIAL_UPDATE];
    for k in config.first_iteration()..n {
        if evaluates(config, k) {
            stages.push(StageId::at(Stage::Evaluate, k));
        }
        for stage in [Stage::Rollout, Stage::Group, Stage::Advantage, Stage::Update] {
            stages.push(StageId::at(stage, k));
        }
    }
    stages.push(StageId::at(Stage::Evaluate, n));
    stages
}

/// The stage whose commit stage `id` needs before it can start: the update that committed
/// the policies' version it samples with for rollout and evaluate, the previous step
/// within an iteration. The schedule is one order that respects these; an external
/// scheduler may run more at once (evaluate k beside rollout k; with
/// `rollout.max_staleness` s, rollout k beside updates k − s … k − 1).
pub fn needs(config: &RunConfig, id: StageId) -> Option<StageId> {
    let version =
        |v: u32| if v == config.first_iteration() { INITIAL_UPDATE } else { StageId::at(Stage::Update, v - 1) };
    match (id.stage, id.iteration) {
        (Stage::PrepareData, _) => None,
        (Stage::Update, None) => Some(StageId::run_level(Stage::PrepareData)),
        (Stage::Rollout, Some(k)) => Some(version(config.sampled_version(k))),
        (Stage::Evaluate, Some(k)) => Some(version(k)),
        (Stage::Group, Some(k)) => Some(StageId::at(Stage::Rollout, k)),
        (Stage::Advantage, Some(k)) => Some(StageId::at(Stage::Group, k)),
        (Stage::Update, Some(k)) => Some(StageId::at(Stage::Advantage, k)),
        (stage, None) => unreachable!("{stage} runs per iteration"),
    }
}

/// Whether policy version `k` (k < iterations) is evaluated before iteration k samples.
fn evaluates(config: &RunConfig, k: u32) -> bool {
    let (every, first) = (config.evaluation.every, config.first_iteration());
    (k == first && config.evaluation.at_start) || (k > first && every > 0 && k.is_multiple_of(every))
}

/// Runs one stage, reporting how far its long phases are to `progress`; policies and the
/// vLLM server stay in `session` between the stages of one process.
pub async fn run_stage(
    store: &RunStore,
    config: &RunConfig,
    id: StageId,
    progress: &dyn Progress,
    session: &Session,
) -> Result<CommitMarker, Error> {
    match (id.stage, id.iteration) {
        (Stage::PrepareData, _) => Ok(prepare_data::run(store, config).await?.marker),
        (Stage::Update, None) => update::initialise(store, config, progress).await,
        (Stage::Rollout, Some(k)) => match replay::replays(config, k) {
            Some(fork) => replay::run(store, config, fork, id.shard).await,
            None => rollout::run(store, config, k, id.shard, progress, session).await,
        },
        (Stage::Group, Some(k)) => group::run(store, config, k).await,
        (Stage::Advantage, Some(k)) => advantage::run(store, config, k, session).await,
        (Stage::Update, Some(k)) => update::run(store, config, k, progress, session).await,
        (Stage::Evaluate, Some(k)) => evaluate::run(store, config, k, id.shard, progress, session).await,
        (stage, None) => unreachable!("{stage} runs per iteration"),
    }
}

/// The stages of the schedule that are not committed yet, in order.
pub async fn pending(store: &RunStore, config: &RunConfig) -> Result<Vec<StageId>, stages::Error> {
    let markers = store.markers().await?;
    let committed = |id: &StageId| store::committed_among(&markers, id.stage, id.iteration).is_some();
    Ok(schedule(config).into_iter().filter(|id| !committed(id)).collect())
}

/// The part of stage `id` that worker `worker` runs: its shard of a rollout or an
/// evaluation, the whole of any other stage on worker 0, nothing otherwise.
pub fn worker_part(id: StageId, worker: Shard) -> Option<StageId> {
    match id.stage {
        _ if worker.count == 1 => Some(id),
        stage if stage.runs_in_shards() => Some(id.with_shard(worker.index, worker.count)),
        _ if worker.index == 0 => Some(id),
        _ => None,
    }
}

/// Waits until stage `id` is committed (every shard of it, when sharded), looking at the
/// store every `poll` at first and every `longest` at most.
pub async fn wait_until_committed(
    store: &RunStore,
    id: StageId,
    poll: Duration,
    longest: Duration,
) -> Result<(), store::Error> {
    let mut delay = poll;
    while store.committed(id.stage, id.iteration).await?.is_none() {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(longest.max(poll));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(evaluation: &str) -> RunConfig {
        let text = format!(
            "store: memory://x\niterations: 5\nenv: {{name: plan_path}}\nworkflow: {{kind: single_agent}}\n\
             agents: {{agent: {{policy: p}}}}\npolicies: {{p: {{model: m}}}}\nevaluation: {evaluation}\n"
        );
        crate::config::parse(&text, std::path::Path::new("test.yaml")).unwrap()
    }

    fn names(stages: &[StageId]) -> Vec<String> {
        stages.iter().map(|s| format!("{}{}", s.stage, s.iteration.map_or(String::new(), |k| k.to_string()))).collect()
    }

    #[test]
    fn iterations_follow_the_warm_start_and_evaluations_bracket_them() {
        let stages = schedule(&config("{every: 2, at_start: true, tasks: 10}"));
        let names = names(&stages);
        assert_eq!(names[..3], ["prepare-data", "update", "evaluate0"]);
        assert_eq!(names[3..7], ["rollout0", "group0", "advantage0", "update0"]);
        let evaluations: Vec<&String> = names.iter().filter(|n| n.starts_with("evaluate")).collect();
        assert_eq!(evaluations, ["evaluate0", "evaluate2", "evaluate4", "evaluate5"]);
        assert_eq!(names.last().unwrap(), "evaluate5");
        assert_eq!(stages.len(), 2 + 5 * 4 + 4);
    }

    #[test]
    fn a_fork_runs_the_iterations_from_its_source_iteration_on() {
        let mut config = config("{every: 2, at_start: true, tasks: 10}");
        config.fork = Some("runs/a@3".parse().unwrap());
        let names = names(&schedule(&config));
        assert_eq!(names[..3], ["prepare-data", "update", "evaluate3"]);
        assert_eq!(names[3..7], ["rollout3", "group3", "advantage3", "update3"]);
        assert_eq!(names.last().unwrap(), "evaluate5");
        assert_eq!(names.len(), 2 + 2 * 4 + 3);
    }

    #[test]
    fn every_stage_needs_the_policies_it_samples_with_or_the_step_before_it() {
        let config = config("{every: 2, at_start: true, tasks: 10}");
        let needs = |id| needs(&config, id).map(|n| names(&[n])[0].clone());
        assert_eq!(needs(StageId::run_level(Stage::PrepareData)), None);
        assert_eq!(needs(INITIAL_UPDATE).unwrap(), "prepare-data");
        assert_eq!(needs(StageId::at(Stage::Rollout, 0)).unwrap(), "update");
        assert_eq!(needs(StageId::at(Stage::Evaluate, 0)).unwrap(), "update");
        assert_eq!(needs(StageId::at(Stage::Rollout, 2)).unwrap(), "update1");
        assert_eq!(needs(StageId::at(Stage::Evaluate, 5)).unwrap(), "update4");
        assert_eq!(needs(StageId::at(Stage::Group, 2)).unwrap(), "rollout2");
        assert_eq!(needs(StageId::at(Stage::Update, 2)).unwrap(), "advantage2");
        // Every stage comes after what it needs in the schedule.
        let order = schedule(&config);
        for (at, id) in order.iter().enumerate() {
            if let Some(need) = super::needs(&config, *id) {
                assert!(order[..at].contains(&need), "{id} before {need}");
            }
        }
    }

    #[test]
    fn workers_share_rollouts_and_evaluations_and_leave_the_rest_to_worker_0() {
        let rollout = StageId::at(Stage::Rollout, 3);
        let group = StageId::at(Stage::Group, 3);
        let second = Shard { index: 1, count: 4 };
        assert_eq!(worker_part(rollout, second), Some(rollout.with_shard(1, 4)));
        let evaluate = StageId::at(Stage::Evaluate, 3);
        assert_eq!(worker_part(evaluate, second), Some(evaluate.with_shard(1, 4)));
        assert_eq!(worker_part(group, second), None);
        assert_eq!(worker_part(INITIAL_UPDATE, second), None);
        assert_eq!(worker_part(group, Shard { index: 0, count: 4 }), Some(group));
        let alone = Shard { index: 0, count: 1 };
        assert_eq!(worker_part(rollout, alone), Some(rollout), "one worker runs stages whole");
    }

    #[test]
    fn without_a_schedule_only_the_final_policies_are_evaluated() {
        let names = names(&schedule(&config("{every: 0, at_start: false, tasks: 10}")));
        let evaluations: Vec<&String> = names.iter().filter(|n| n.starts_with("evaluate")).collect();
        assert_eq!(evaluations, ["evaluate5"]);
    }
}
