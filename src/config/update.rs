//! `update:`: optimisation of each policy on its own samples.

use serde::{Deserialize, Serialize};

use crate::validate::{Invalid, check};

/// `update:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpdateConfig {
    /// Passes over the iteration's samples.
    pub epochs: u32,
    /// Sequences per optimiser step.
    pub mini_batch_sequences: u32,
    /// Tokens per forward/backward pass; bounds memory, not the step.
    pub micro_batch_tokens: u32,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// Recompute activations in the backward pass to save memory: true, false, or auto
    /// (on when a micro-batch's activations would take more than 4 GiB).
    pub recompute_activations: Recompute,
    /// Forward a prompt that several samples share (a group's candidates) once, each
    /// response attending to it: the same loss and gradients, a fraction of the work.
    pub share_prefix: bool,
    /// Largest mean |recomputed - sampled| token logprob accepted before the first step;
    /// more means the weights or the sampler are wrong, and the update refuses.
    pub max_logprob_drift: f64,
    /// Correct the engine-vs-trainer mismatch with truncated importance weights: each
    /// token's loss weighted by min(π_trainer / π_engine, this cap), e.g. 2.0. Unset: none,
    /// or 2.0 when rollout.max_staleness lets an older version sample.
    pub truncated_importance_ratio: Option<f64>,
    /// With ranks, each keeps 1/N of AdamW's state (moments and float32 masters), steps
    /// only its share of the weights and gives them to the others (ZeRO-1): for a model
    /// whose optimiser state does not fit one device. The checkpoint keeps the whole
    /// state, which a run of any number of ranks resumes from.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shard_optimizer_state: bool,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            epochs: 1,
            mini_batch_sequences: 64,
            micro_batch_tokens: 8192,
            grad_clip: 1.0,
            recompute_activations: Recompute::Auto,
            share_prefix: true,
            max_logprob_drift: 0.05,
            truncated_importance_ratio: None,
            shard_optimizer_state: false,
        }
    }
}

impl UpdateConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        check(self.epochs >= 1, "update.epochs", "must be at least 1")?;
        check(self.mini_batch_sequences >= 1, "update.mini_batch_sequences", "must be at least 1")?;
        check(self.micro_batch_tokens >= 1, "update.micro_batch_tokens", "must be at least 1")?;
        check(self.grad_clip > 0.0, "update.grad_clip", "must be positive")?;
        check(self.max_logprob_drift > 0.0, "update.max_logprob_drift", "must be positive")?;
        check(
            self.truncated_importance_ratio.is_none_or(|c| c >= 1.0 && c.is_finite()),
            "update.truncated_importance_ratio",
            "must be a cap of at least 1 (e.g. 2.0), or unset for no correction",
        )
    }
}

/// Whether activations are recomputed in the backward pass (`update.recompute_activations`):
/// `true`, `false` or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recompute {
    Auto,
    On,
    Off,
}

impl Serialize for Recompute {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Recompute::Auto => s.serialize_str("auto"),
            Recompute::On => s.serialize_bool(true),
            Recompute::Off => s.serialize_bool(false),
        }
    }
}

impl schemars::JsonSchema for Recompute {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Recompute".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"oneOf": [{"type": "boolean"}, {"const": "auto"}]})
    }
}

impl<'de> Deserialize<'de> for Recompute {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Recompute, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bool(bool),
            Word(String),
        }
        match Written::deserialize(d)? {
            Written::Bool(true) => Ok(Recompute::On),
            Written::Bool(false) => Ok(Recompute::Off),
            Written::Word(w) if w == "auto" => Ok(Recompute::Auto),
            Written::Word(w) => Err(serde::de::Error::custom(format!("{w:?} is not true, false or auto"))),
        }
    }
}
