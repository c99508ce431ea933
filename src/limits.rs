//! `limits:`: bounds on what reaches a run from outside it, each checked where it comes
//! in and before it is parsed, tokenised or trained on.

use serde::{Deserialize, Serialize};

use crate::validate::{Invalid, check};

/// `limits:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest |reward| an environment, a reward function or an agent program's verdict
    /// may give: a larger one fails its episode (a verdict) or its stage, naming it,
    /// before any group mean or advantage is computed from it.
    pub reward: f64,
    /// Largest request body an agent program may send to the agent endpoint, in bytes;
    /// checked before the body is read whole, parsed or tokenised.
    pub request_bytes: u64,
    /// Largest task, in bytes: a row of a dataset file, an instance a hosted
    /// environment makes, and the task an agent program is given.
    pub task_bytes: u64,
    /// Largest message (one line of JSON) a hosted environment's host may send, in bytes.
    pub host_message_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { reward: 1e6, request_bytes: 8 << 20, task_bytes: 1 << 20, host_message_bytes: 64 << 20 }
    }
}

impl Limits {
    pub fn is_default(&self) -> bool {
        *self == Limits::default()
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        check(self.reward.is_finite() && self.reward > 0.0, "limits.reward", "must be a positive finite number")?;
        check(self.request_bytes >= 1024, "limits.request_bytes", "must be at least 1024")?;
        check(self.task_bytes >= 1024, "limits.task_bytes", "must be at least 1024")?;
        check(self.host_message_bytes >= 1024, "limits.host_message_bytes", "must be at least 1024")
    }

    /// Whether `reward` is a finite number within the bound.
    pub fn allows_reward(&self, reward: f64) -> bool {
        reward.is_finite() && reward.abs() <= self.reward
    }
}
