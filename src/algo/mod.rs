//! The algorithm: which candidates are compared with each other, their mixed reward and
//! advantages, how token losses are aggregated, and the learning-rate schedule.
//!
//! [`Algorithm`] answers every question about an estimator, and nothing outside this
//! module matches on it: [`Algorithm::grouping`] (grouping.rs), [`Algorithm::advantages`]
//! beside its SQL twin [`Algorithm::advantage_sql`] (advantage.rs),
//! [`Algorithm::aggregation`] (loss.rs) and [`Algorithm::label`]; what a candidate is
//! credited with before grouping is [`credit::credited`], and a learned critic's GAE and
//! value loss are in critic.rs. The math is pure
//! functions over slices; the stages apply the same formulas to Arrow columns (group,
//! advantage) and tensors (`model::trainer`), and tests keep the two equal.

pub mod advantage;
pub mod credit;
pub mod critic;
pub mod grouping;
pub mod loss;
pub mod schedule;
pub mod stats;

use serde::{Deserialize, Serialize};

use crate::validate::{Invalid, check};

pub use credit::Credit;
pub use grouping::{Grouping, mixed_reward, mixed_reward_sql};

/// `algorithm:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmConfig {
    /// Advantage estimator.
    pub name: Algorithm,
    /// Weight of the team reward in r = alpha * r_team + r_local.
    pub alpha: f64,
    /// Added to the group std before dividing.
    pub std_epsilon: f64,
    /// PPO clip range: ratios outside [1 - eps, 1 + eps] stop contributing gradient.
    pub clip_epsilon: f64,
    /// Which groups are trained on.
    pub filter: GroupFilter,
    /// What a reply cut at `max_new_tokens` (finish_reason length) trains as: keep (as
    /// if complete), mask (out of the loss, as TRL's `mask_truncated_completions` and
    /// DAPO's overlong filtering; it still counts in its group's statistics), or penalty
    /// (its reward gets `truncation_penalty` added before grouping).
    pub truncated: Truncated,
    /// Added to a truncated reply's mixed reward when `truncated: penalty`.
    pub truncation_penalty: f64,
    /// What a candidate is credited with before grouping: its turn's own mixed reward
    /// (turn), or its return to the end of the episode (return), for games rewarded at
    /// the end (docs/environments.md, "Rewards across turns").
    #[serde(skip_serializing_if = "is_default")]
    pub credit: Credit,
    /// Discount γ of `credit: return` and of PPO's GAE per turn of the agent's own, in (0, 1].
    #[serde(skip_serializing_if = "is_one")]
    pub gamma: f64,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn is_one(value: &f64) -> bool {
    *value == 1.0
}

/// `algorithm.truncated`: how replies that ran into `max_new_tokens` train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Truncated {
    #[default]
    Keep,
    Mask,
    Penalty,
}

/// The `turns.finish_reason` of a reply cut at `max_new_tokens`, from either engine.
pub const TRUNCATED_FINISH_REASON: &str = "length";

impl Default for AlgorithmConfig {
    fn default() -> Self {
        AlgorithmConfig {
            name: Algorithm::AtGrpo,
            alpha: 1.0,
            std_epsilon: 1e-6,
            clip_epsilon: 0.2,
            filter: GroupFilter::default(),
            truncated: Truncated::Keep,
            truncation_penalty: -1.0,
            credit: Credit::Turn,
            gamma: 1.0,
        }
    }
}

impl AlgorithmConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(self.alpha >= 0.0, "algorithm.alpha", "must not be negative")?;
        check(self.std_epsilon > 0.0, "algorithm.std_epsilon", "must be positive")?;
        check(self.clip_epsilon > 0.0 && self.clip_epsilon < 1.0, "algorithm.clip_epsilon", "must be in (0, 1)")?;
        let f = self.filter.drop_lowest_mean_fraction;
        check((0.0..1.0).contains(&f), "algorithm.filter.drop_lowest_mean_fraction", "must be in [0, 1)")?;
        check(self.truncation_penalty.is_finite(), "algorithm.truncation_penalty", "must be a finite number")?;
        check(self.gamma > 0.0 && self.gamma <= 1.0, "algorithm.gamma", "must be in (0, 1]")?;
        check(
            self.gamma == 1.0 || self.credit == Credit::Return || self.name.needs_critic(),
            "algorithm.gamma",
            "discounts returns only: set algorithm.credit: return (or name: ppo), or leave gamma at 1",
        )
    }

    /// The reward groups compare, in SQL over `turns`: the credited reward the rollout
    /// recorded ([`credit::credited`]; the turn's mixed reward in runs made before the
    /// column existed), plus the truncation penalty where it applies.
    pub fn reward_sql(&self) -> String {
        let mixed = format!("coalesce(credited_reward, {})", mixed_reward_sql(self.alpha));
        match self.truncated {
            Truncated::Penalty => format!(
                "{mixed} + CASE WHEN finish_reason = '{TRUNCATED_FINISH_REASON}' THEN CAST({:?} AS DOUBLE) ELSE 0.0 END",
                self.truncation_penalty
            ),
            Truncated::Keep | Truncated::Mask => mixed,
        }
    }
}

/// The advantage estimator, with the grouping and loss aggregation that go with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Groups by (task, agent, turn), A = (r - mean) / (std + eps).
    AtGrpo,
    /// Groups by task only.
    Grpo,
    /// GRPO without std normalisation, sequence-sum token normalisation.
    DrGrpo,
    /// CoMLRL MAGRPO: group-mean baseline.
    Magrpo,
    /// CoMLRL MARLOO: leave-one-out baseline.
    Marloo,
    /// CoMLRL MAReMax: group-max baseline.
    Maremax,
    /// PPO with a learned critic (`critic:`): GAE(γ, λ) over each agent's turns,
    /// no group baseline (critic.rs; the critic itself is `crate::critic`).
    Ppo,
}

impl Algorithm {
    /// The estimators that compare a candidate with its group.
    pub const GROUP_BASELINES: [Algorithm; 6] = [
        Algorithm::AtGrpo,
        Algorithm::Grpo,
        Algorithm::DrGrpo,
        Algorithm::Magrpo,
        Algorithm::Marloo,
        Algorithm::Maremax,
    ];

    /// The estimator as papers write it.
    pub fn label(self) -> &'static str {
        match self {
            Algorithm::AtGrpo => "AT-GRPO",
            Algorithm::Grpo => "GRPO",
            Algorithm::DrGrpo => "Dr.GRPO",
            Algorithm::Magrpo => "MAGRPO",
            Algorithm::Marloo => "MARLOO",
            Algorithm::Maremax => "MAReMax",
            Algorithm::Ppo => "PPO (GAE)",
        }
    }

    /// Whether the estimator needs a learned critic, rather than a group, for its baseline.
    pub fn needs_critic(self) -> bool {
        self == Algorithm::Ppo
    }
}

/// Which groups the update trains on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GroupFilter {
    /// Drop groups whose rewards are all equal (no learning signal). Off by default: kept,
    /// as GRPO defines the estimator, their zero-advantage samples add nothing to the loss
    /// but count in the token-mean denominator, which scales the step down as groups
    /// saturate. Measured both ways, dropping them changes no held-out figure and saves
    /// update time: on the embedded default (pipelines/plan-path.yaml) the same success at
    /// v0/v10/v20/v30 and 26% less update time; on pipelines/math-single-agent.yaml
    /// (SmolLM2-135M, seed 1) 14% kept against 16% dropped at v5, 12% both at v10 (50 test
    /// tasks: one task is 2 points), with 320 against 168 sequences trained. The shipped
    /// math and code pipelines drop them.
    pub drop_degenerate: bool,
    /// Drop this fraction of groups with the lowest mean reward.
    pub drop_lowest_mean_fraction: f64,
}
