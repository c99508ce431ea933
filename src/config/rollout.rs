//! `rollout:`: how training trajectories are sampled.

use serde::{Deserialize, Serialize};

use crate::engine::EngineKind;
use crate::model::SamplingConfig;
use crate::play::{OverlongPrompt, RolloutMode, Selection};
use crate::validate::{Invalid, check};

/// `rollout:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// Training tasks per iteration (B).
    pub tasks_per_iteration: u32,
    /// Tree mode: the candidates sampled at each (task, agent, turn) node, one group
    /// (AT-GRPO's K; default 4). Only tree mode reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branches: Option<u32>,
    /// Independent mode: the episodes sampled for each task, one group (GRPO's group
    /// size; default 4). Only independent mode reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub episodes_per_task: Option<u32>,
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
    /// How many versions behind the one its update trains a rollout may sample with (s):
    /// iteration k samples with version max(k − s, the first), so rollout k needs only
    /// update k − s − 1 and runs while the updates between train. 0: strictly on-policy.
    // Left out of frozen configs at 0 (configs frozen before the key keep their hash), so
    // the schema states the default itself.
    #[serde(skip_serializing_if = "is_zero")]
    #[schemars(extend("default" = 0))]
    pub max_staleness: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// K when the run file does not say.
const DEFAULT_GROUP_SIZE: u32 = 4;

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            tasks_per_iteration: 16,
            branches: None,
            episodes_per_task: None,
            mode: RolloutMode::Tree,
            select: Selection::BestReward,
            sampling: SamplingConfig::default(),
            max_prompt_tokens: 4096,
            overlong_prompt: OverlongPrompt::Error,
            kv_cache_gib: None,
            engine: EngineKind::Tch,
            max_staleness: 0,
        }
    }
}

impl RolloutConfig {
    /// The candidates of a group (K): tree mode's branches per node, or independent mode's
    /// episodes per task.
    pub fn group_size(&self) -> u32 {
        match self.mode {
            RolloutMode::Tree => self.branches,
            RolloutMode::Independent => self.episodes_per_task,
        }
        .unwrap_or(DEFAULT_GROUP_SIZE)
    }

    pub fn validate(&self, train_tasks: u32) -> Result<(), Invalid> {
        // A group size written for the other mode would be silently ignored.
        let (key, misplaced, mode) = match self.mode {
            RolloutMode::Tree => {
                ("rollout.branches", self.episodes_per_task.map(|_| "rollout.episodes_per_task"), "tree")
            }
            RolloutMode::Independent => {
                ("rollout.episodes_per_task", self.branches.map(|_| "rollout.branches"), "independent")
            }
        };
        check(
            misplaced.is_none(),
            misplaced.unwrap_or_default(),
            format!("is not read by rollout.mode: {mode}; its group size is {key}"),
        )?;
        check(self.group_size() >= 1, key, "must be at least 1")?;
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

/// `kv_cache_gib` of rollout and evaluation: unset, or a positive size.
pub(super) fn check_kv_cache_gib(gib: Option<f64>, key: &str) -> Result<(), Invalid> {
    check(
        gib.is_none_or(|g| g > 0.0 && g.is_finite()),
        key,
        "must be a positive number of GiB (unset: a share of the device's free memory)",
    )
}
