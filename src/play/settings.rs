//! The choices of the run file the episode logic makes: `rollout.mode`, `rollout.select`
//! and the stages' `overlong_prompt`.

use serde::{Deserialize, Serialize};

/// How candidates are sampled (`rollout.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RolloutMode {
    Tree,
    Independent,
}

/// Which of a tree node's candidates continues the trajectory (`rollout.select`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Highest mixed reward; ties go to the lowest branch.
    BestReward,
    /// Always branch 0 (a random pick, since branches are exchangeable).
    First,
}

/// What a prompt longer than the limit does (`rollout.overlong_prompt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OverlongPrompt {
    /// The stage fails, naming the limit.
    #[default]
    Error,
    /// The task is left out: none of its rows are written, and the stage's commit
    /// marker lists it (`commits.skipped_tasks`).
    Skip,
}
