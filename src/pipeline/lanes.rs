//! Lanes: the stages of one run split between processes that run at the same time,
//! meeting only through the store's markers.
//!
//! ```text
//!  train lane    prepare-data, update (v0), group, advantage, update k
//!  sample lane   rollout k, and evaluate k unless an evaluate lane runs them
//!  evaluate lane evaluate k
//! ```
//!
//! Each lane runs its pending stages in the order their needs (`pipeline::needs`) are
//! met, waiting for each need's marker first. With `rollout.max_staleness` s ≥ 1,
//! rollout k needs only update k − s − 1, so the sample lane plays iteration k while
//! the train lane trains the iterations before it; strictly on-policy the lanes take
//! turns, and an evaluate lane plays evaluation k beside rollout k (both need update
//! k − 1 and neither changes weights).

use std::fmt;
use std::str::FromStr;

use crate::config::RunConfig;
use crate::store::{Stage, StageId};

/// Which stages a process runs (`petting pipeline run --lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// prepare-data, every update, group and advantage.
    Train,
    /// Rollouts, with evaluations when `with_evaluations`.
    Sample { with_evaluations: bool },
    /// Evaluations.
    Evaluate,
}

impl Lane {
    /// Whether this lane runs `stage`.
    pub fn runs(self, stage: Stage) -> bool {
        match self {
            Lane::Train => matches!(stage, Stage::PrepareData | Stage::Update | Stage::Group | Stage::Advantage),
            Lane::Sample { with_evaluations } => {
                stage == Stage::Rollout || (with_evaluations && stage == Stage::Evaluate)
            }
            Lane::Evaluate => stage == Stage::Evaluate,
        }
    }

    /// The lane of `config`'s lanes that runs `stage`.
    pub fn of(config: &RunConfig, stage: Stage) -> Lane {
        let beside = config.evaluation.beside;
        match stage {
            Stage::Rollout => Lane::Sample { with_evaluations: !beside },
            Stage::Evaluate if beside => Lane::Evaluate,
            Stage::Evaluate => Lane::Sample { with_evaluations: true },
            _ => Lane::Train,
        }
    }

    /// The lanes a run of `config` overlaps in by itself, after the train lane (the
    /// process that was started): none strictly on-policy without `evaluation.beside`.
    pub fn others(config: &RunConfig) -> Vec<Lane> {
        let beside = config.evaluation.beside;
        match (config.rollout.max_staleness > 0, beside) {
            (false, false) => Vec::new(),
            (false, true) => vec![Lane::Sample { with_evaluations: false }, Lane::Evaluate],
            (true, false) => vec![Lane::Sample { with_evaluations: true }],
            (true, true) => vec![Lane::Sample { with_evaluations: false }, Lane::Evaluate],
        }
    }
}

/// `stages` (pending, in schedule order) that `lane` runs, in the order their needs are
/// met: by the schedule position of what each needs, a rollout (which the train lane
/// waits for) before an evaluation (which nothing waits for), then in schedule order.
pub fn order(config: &RunConfig, lane: Lane, stages: &[StageId]) -> Vec<StageId> {
    let schedule = super::schedule(config);
    let position = |id: StageId| schedule.iter().position(|s| *s == id);
    let mut mine: Vec<StageId> = stages.iter().copied().filter(|id| lane.runs(id.stage)).collect();
    mine.sort_by_key(|&id| (super::needs(config, id).and_then(position), id.stage != Stage::Rollout));
    mine
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Lane::Train => "train",
            Lane::Sample { with_evaluations: true } => "sample",
            Lane::Sample { with_evaluations: false } => "rollout",
            Lane::Evaluate => "evaluate",
        })
    }
}

impl FromStr for Lane {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "train" => Ok(Lane::Train),
            "sample" => Ok(Lane::Sample { with_evaluations: true }),
            "rollout" => Ok(Lane::Sample { with_evaluations: false }),
            "evaluate" => Ok(Lane::Evaluate),
            other => Err(format!(
                "{other:?} is not a lane: train (prepare-data, group, advantage, update), sample (rollout and \
                 evaluate), rollout or evaluate"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> RunConfig {
        let text = format!(
            "store: memory://x\niterations: 5\nenv: {{name: plan_path}}\nworkflow: {{kind: single_agent}}\n\
             agents: {{agent: {{policy: p}}}}\npolicies: {{p: {{model: m}}}}\n{extra}"
        );
        crate::config::parse(&text, std::path::Path::new("test.yaml")).unwrap()
    }

    fn names(stages: &[StageId]) -> Vec<String> {
        stages.iter().map(|s| format!("{}{}", s.stage, s.iteration.map_or(String::new(), |k| k.to_string()))).collect()
    }

    #[test]
    fn a_stale_sample_lane_plays_each_rollout_as_soon_as_its_version_is_committed() {
        let config = config("rollout: {max_staleness: 1}\nevaluation: {every: 2, at_start: true, tasks: 10}\n");
        let schedule = super::super::schedule(&config);
        let sample = names(&order(&config, Lane::Sample { with_evaluations: true }, &schedule));
        // Rollouts 0 and 1 sample v0, before evaluation 0 of it; rollout 2 samples v1
        // (update 0), rollout 3 v2 (update 1), before evaluation 2 of v2.
        let expected =
            ["rollout0", "rollout1", "evaluate0", "rollout2", "rollout3", "evaluate2", "rollout4", "evaluate4"];
        assert_eq!(sample[..8], expected);
        assert_eq!(sample[8], "evaluate5");
        let train = names(&order(&config, Lane::Train, &schedule));
        assert_eq!(train[..6], ["prepare-data", "update", "group0", "advantage0", "update0", "group1"]);
        assert_eq!(train.len(), 2 + 5 * 3);
    }

    #[test]
    fn strictly_on_policy_an_evaluate_lane_plays_beside_the_rollout_of_the_same_version() {
        let config = config("evaluation: {every: 2, at_start: true, tasks: 10, beside: true}\n");
        assert_eq!(Lane::others(&config), [Lane::Sample { with_evaluations: false }, Lane::Evaluate]);
        let schedule = super::super::schedule(&config);
        let rollouts = names(&order(&config, Lane::Sample { with_evaluations: false }, &schedule));
        assert_eq!(rollouts, ["rollout0", "rollout1", "rollout2", "rollout3", "rollout4"]);
        let evaluations = names(&order(&config, Lane::Evaluate, &schedule));
        assert_eq!(evaluations, ["evaluate0", "evaluate2", "evaluate4", "evaluate5"]);
        assert!(Lane::others(&self::config("")).is_empty(), "one process by default");
        for id in &schedule {
            assert!(Lane::of(&config, id.stage).runs(id.stage), "{id:?}");
        }
    }

    #[test]
    fn lanes_read_back_as_they_print() {
        for lane in [
            Lane::Train,
            Lane::Sample { with_evaluations: true },
            Lane::Sample { with_evaluations: false },
            Lane::Evaluate,
        ] {
            assert_eq!(lane.to_string().parse::<Lane>(), Ok(lane));
        }
        assert!("trainer".parse::<Lane>().unwrap_err().contains("not a lane"));
    }
}
