//! `evaluation:`: held-out evaluation, and the set-ups it plays.

use serde::{Deserialize, Serialize};

use crate::engine::EngineKind;
use crate::model::SamplingConfig;
use crate::play::OverlongPrompt;
use crate::validate::{Invalid, check};

/// `evaluation:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvaluationConfig {
    /// Evaluate after every N-th iteration (and after the last); 0 evaluates only after the last.
    pub every: u32,
    /// Also evaluate the starting policies (v0) before training.
    pub at_start: bool,
    /// Test tasks played per evaluation (at most data.test_tasks).
    pub tasks: u32,
    /// Episodes per task.
    pub samples: u32,
    /// Which set-ups are evaluated.
    pub modes: Vec<EvalMode>,
    /// Sampling settings; greedy by default.
    pub sampling: SamplingConfig,
    /// Longest prompt (chat template applied) an evaluation may send, as
    /// `rollout.max_prompt_tokens` for the rollout; a longer one is never cut.
    pub max_prompt_tokens: u32,
    /// A prompt longer than `max_prompt_tokens`: error (the stage fails, naming the
    /// limit) or skip (its task is left out of the evaluation, and the commit lists it).
    pub overlong_prompt: OverlongPrompt,
    /// Memory for the sampler's key/value caches, GiB, as `rollout.kv_cache_gib`.
    pub kv_cache_gib: Option<f64>,
    /// Who samples, as `rollout.engine`.
    pub engine: EngineKind,
    /// Play each evaluation in a process of its own beside the rollout that samples with
    /// the same version (`pipeline run` starts it), instead of before that rollout.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub beside: bool,
    /// Past versions the league's roles (`agents.<role>.league`) play against the current
    /// policy, each in episodes of its own once stored (`evals.mode` league,
    /// `evals.opponent_version` the version): the win matrix across versions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub against: Vec<u32>,
}

impl Default for EvaluationConfig {
    fn default() -> Self {
        EvaluationConfig {
            every: 10,
            at_start: true,
            tasks: 200,
            samples: 1,
            modes: vec![EvalMode::MultiAgent],
            sampling: SamplingConfig::greedy(),
            max_prompt_tokens: 4096,
            overlong_prompt: OverlongPrompt::Error,
            kv_cache_gib: None,
            engine: EngineKind::Tch,
            beside: false,
            against: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalMode {
    /// The environment's single-agent workflow, played by the first agent's policy.
    SingleAgent,
    /// The configured workflow, its agents working together.
    MultiAgent,
    /// The configured workflow with the two roles' policies exchanged.
    Swapped,
    /// The configured workflow with each agent acting alone, as `workflow.alone` trains
    /// them (tool_planner only): success is the planner's own.
    Alone,
    /// The same episodes, but success is the tool agent's own: its latest printed answer,
    /// simulated on the state it saw, solves the task (tool_planner only).
    ToolAlone,
}

impl EvaluationConfig {
    /// The section's own checks; the modes' fit to the workflow is checked by the run config.
    pub fn validate(&self, test_tasks: u32) -> Result<(), Invalid> {
        check(self.tasks >= 1, "evaluation.tasks", "must be at least 1")?;
        check(
            self.tasks <= test_tasks,
            "evaluation.tasks",
            format!("{} is more than data.test_tasks ({test_tasks})", self.tasks),
        )?;
        check(self.samples >= 1, "evaluation.samples", "must be at least 1")?;
        check(!self.modes.is_empty(), "evaluation.modes", "must name at least one mode")?;
        check(self.max_prompt_tokens >= 1, "evaluation.max_prompt_tokens", "must be at least 1")?;
        super::rollout::check_kv_cache_gib(self.kv_cache_gib, "evaluation.kv_cache_gib")?;
        self.sampling.validate("evaluation.sampling")
    }
}

impl EvalMode {
    /// The mode as the `evals.mode` column names it.
    pub fn name(self) -> &'static str {
        match self {
            EvalMode::SingleAgent => "single_agent",
            EvalMode::MultiAgent => "multi_agent",
            EvalMode::Swapped => "swapped",
            EvalMode::Alone => "alone",
            EvalMode::ToolAlone => "tool_alone",
        }
    }
}
