//! `warm_start:`: the supervised warm start that builds v0 of scratch policies.

use serde::{Deserialize, Serialize};

use crate::algo::schedule::Schedule;
use crate::model::OptimizerConfig;
use crate::validate::{Invalid, check};

/// `warm_start:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WarmStartConfig {
    /// Demonstrations generated from the environment's solver.
    pub demonstrations: u32,
    /// Optimiser steps of supervised training.
    pub steps: u32,
    /// Demonstrations per step.
    pub batch_size: u32,
    /// AdamW settings of the warm start.
    pub optimizer: OptimizerConfig,
    /// Longest demonstration prompt (chat template applied); a longer one is an error,
    /// never cut.
    pub max_prompt_tokens: u32,
}

impl Default for WarmStartConfig {
    fn default() -> Self {
        WarmStartConfig {
            demonstrations: 20_000,
            steps: 400,
            batch_size: 64,
            optimizer: OptimizerConfig {
                lr: 2e-3,
                warmup_steps: 100,
                schedule: Schedule::Cosine,
                ..OptimizerConfig::default()
            },
            max_prompt_tokens: 4096,
        }
    }
}

impl WarmStartConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(self.steps > 0 && self.batch_size > 0, "warm_start", "steps and batch_size must be at least 1")?;
        check(self.demonstrations > 0, "warm_start.demonstrations", "must be at least 1")?;
        check(self.max_prompt_tokens >= 1, "warm_start.max_prompt_tokens", "must be at least 1")?;
        check(self.optimizer.lr > 0.0, "warm_start.optimizer.lr", "must be positive")
    }
}
