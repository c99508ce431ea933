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

use crate::config::RunConfig;
use crate::progress::Progress;
use crate::stages::{self, Error, advantage, evaluate, group, prepare_data, rollout, update};
use crate::store::{self, CommitMarker, RunStore, Stage, StageId};

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

/// Whether policy version `k` (k < iterations) is evaluated before iteration k samples.
fn evaluates(config: &RunConfig, k: u32) -> bool {
    let (every, first) = (config.evaluation.every, config.first_iteration());
    (k == first && config.evaluation.at_start) || (k > first && every > 0 && k.is_multiple_of(every))
}

/// Runs one stage, reporting how far its long phases are to `progress`.
pub async fn run_stage(
    store: &RunStore,
    config: &RunConfig,
    id: StageId,
    progress: &dyn Progress,
) -> Result<CommitMarker, Error> {
    match (id.stage, id.iteration) {
        (Stage::PrepareData, _) => Ok(prepare_data::run(store, config).await?.marker),
        (Stage::Update, None) => update::initialise(store, config, progress).await.map_err(|e| Box::new(e).into()),
        (Stage::Rollout, Some(k)) => rollout::run(store, config, k, id.shard, progress).await,
        (Stage::Group, Some(k)) => group::run(store, config, k).await,
        (Stage::Advantage, Some(k)) => advantage::run(store, config, k).await,
        (Stage::Update, Some(k)) => update::run(store, config, k, progress).await.map_err(|e| Box::new(e).into()),
        (Stage::Evaluate, Some(k)) => evaluate::run(store, config, k, progress).await,
        (stage, None) => unreachable!("{stage} runs per iteration"),
    }
}

/// The stages of the schedule that are not committed yet, in order.
pub async fn pending(store: &RunStore, config: &RunConfig) -> Result<Vec<StageId>, stages::Error> {
    let markers = store.markers().await?;
    let committed = |id: &StageId| store::committed_among(&markers, id.stage, id.iteration).is_some();
    Ok(schedule(config).into_iter().filter(|id| !committed(id)).collect())
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
    fn without_a_schedule_only_the_final_policies_are_evaluated() {
        let names = names(&schedule(&config("{every: 0, at_start: false, tasks: 10}")));
        let evaluations: Vec<&String> = names.iter().filter(|n| n.starts_with("evaluate")).collect();
        assert_eq!(evaluations, ["evaluate5"]);
    }
}
