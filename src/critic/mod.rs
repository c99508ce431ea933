//! The learned critic of `algorithm.name: ppo`: one value head per agent on its policy's
//! own trunk, what it reads, and how it is fitted.
//!
//! ```text
//!  advantage k   policy v_k trunk ─► features (hidden state at the input's last token,
//!                or at each token of the reply with `values: token`)
//!                critic/<agent> v_k ─► V(s) of every turn ─► algo::critic::episode_gae
//!                ─► samples.advantage, samples.value, samples.value_target
//!  update k      PPO steps on the policy ─► features under v_(k+1) ─► head fitted to the
//!                targets with the clipped value loss ─► critic/<agent> in v_(k+1)'s folder
//! ```
//!
//! The head reads the trunk's final hidden state and does not train it: the trunk is the
//! policy's (its adapter included), so the critic costs one forward of each input and a
//! linear fit, and adds no weights the policy samples with. Its input (`critic.sees`) is
//! the agent's own prompt (independent critics, one per agent: IPPO) or the joint
//! history of the episode (a centralised critic per agent: MAPPO), see inputs.rs.
//!
//! `critic.model` puts the heads on a separate critic model instead (model.rs): a trunk
//! of its own size that the policy's training does not move. It is frozen, or, with
//! `critic.lora`, trained with the heads through a LoRA adapter per agent (heads.rs).
//!
//! The heads are part of their policy's checkpoint: `critic/<agent>.safetensors` and the
//! head's AdamW state `critic/<agent>.optimizer.safetensors` in the version's folder,
//! committed, hashed, forked and resumed with it. A version without them (v0, or a fork
//! of a run without a critic) starts each head afresh from the run seed, as an optimiser
//! starts afresh at v0.

mod episodes;
mod heads;
mod inputs;
pub mod model;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::model::{LoraConfig, OptimizerConfig};
use crate::validate::{Invalid, check};

pub use episodes::{episodes, returns, steps};
pub use heads::{CRITIC_DIR, Critics, FitSet, FitStep, Trunk, clipped_value_loss_tensor, features};
pub use inputs::{CriticInput, inputs};

/// `critic:` in a run's config: the learned critic of `algorithm.name: ppo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CriticConfig {
    /// What each agent's critic reads: its own prompt (own), or the joint history of the
    /// episode, every other agent's latest turn before its own prompt (joint: MAPPO's
    /// centralised critic).
    pub sees: Sees,
    /// A separate critic model: a Hugging Face folder (relative to the run file) whose
    /// trunk gives the features every head reads, in place of the policy's own; frozen
    /// unless `critic.lora` trains it.
    /// It must tokenize as the policies do (the same tokenizer.json). Absent: each head
    /// sits on its policy's trunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Train the critic model's trunk with its heads: a LoRA adapter per agent on
    /// `critic.model`, stepped by the value loss with the head (by `critic.optimizer`).
    /// Absent: that trunk stays frozen and only the heads learn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// Where the critic values a turn: once, at its state (the prompt's last token), or
    /// at every token of its reply, so that the reply's tokens are credited one by one.
    pub values: ValuesAt,
    /// GAE's λ: 1 judges each turn by the whole return to the episode's end, 0 by the
    /// next turn's value alone. γ is `algorithm.gamma`.
    pub lambda: f64,
    /// `values: token`: GAE's λ between the tokens of one reply (their γ is 1): 1 judges
    /// every token by its turn's return, 0 by the next token's value alone.
    pub token_lambda: f64,
    /// Clip of the value loss: a value may not move more than this from the one the
    /// critic predicted at sampling time and buy a lower loss (in reward units).
    pub value_clip: f64,
    /// Passes over the iteration's samples per update.
    pub epochs: u32,
    /// Samples per step of the head's optimiser.
    pub mini_batch_sequences: u32,
    /// Inputs longer than this keep their last tokens (joint histories grow with turns).
    pub max_input_tokens: u32,
    /// Shift each policy's advantages to mean 0 and scale them to variance 1.
    pub whiten_advantages: bool,
    /// Fit the heads to a source run's stored rollouts when a run forks from it, before
    /// its first PPO iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_start: Option<CriticWarmStart>,
    /// AdamW of the value heads (lr 1e-3, weight_decay 0 unless set).
    #[serde(deserialize_with = "head_optimizer_over_defaults")]
    pub optimizer: OptimizerConfig,
}

/// `critic.warm_start`: the heads fitted to the returns of the rollouts a fork's source
/// committed before the fork point (`--from RUN@K`: iterations K − iterations … K − 1),
/// on the features of the forked version K.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CriticWarmStart {
    /// How many of the source's iterations before the fork point.
    pub iterations: u32,
    /// Passes over their turns.
    pub epochs: u32,
}

impl Default for CriticWarmStart {
    fn default() -> Self {
        CriticWarmStart { iterations: 4, epochs: 20 }
    }
}

/// `critic.values`: one value per turn or one per token of its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ValuesAt {
    /// The turn's state, before its reply: every token of the reply shares its advantage.
    #[default]
    Turn,
    /// The state before each token of the reply: a value and an advantage per token
    /// (verl's and OpenRLHF's token-level GAE), kept in `samples.token_*`.
    Token,
}

/// `critic.sees`: the state a critic values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sees {
    /// The agent's own prompt: an independent critic per agent.
    #[default]
    Own,
    /// The other agents' latest turns (prompt and reply), then the agent's own prompt.
    Joint,
}

fn head_optimizer() -> OptimizerConfig {
    // A linear head on fixed features: a far larger step than a trunk takes, no decay.
    OptimizerConfig { lr: 1e-3, weight_decay: 0.0, ..OptimizerConfig::default() }
}

/// A partial `critic.optimizer` section set over the head's defaults, not AdamW's (whose
/// lr of 1e-6, a trunk's, would leave a head all but still).
fn head_optimizer_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<OptimizerConfig, D::Error> {
    let serde_json::Value::Object(set) = serde_json::Value::deserialize(deserializer)? else {
        return Err(serde::de::Error::custom("critic.optimizer must be a mapping of AdamW settings"));
    };
    let mut merged = serde_json::to_value(head_optimizer()).expect("an optimizer config serialises");
    merged.as_object_mut().expect("a mapping").extend(set);
    serde_json::from_value(merged).map_err(serde::de::Error::custom)
}

impl Default for CriticConfig {
    fn default() -> Self {
        CriticConfig {
            sees: Sees::Own,
            model: None,
            lora: None,
            values: ValuesAt::Turn,
            lambda: 0.95,
            token_lambda: 1.0,
            value_clip: 0.5,
            epochs: 4,
            mini_batch_sequences: 32,
            max_input_tokens: 2048,
            whiten_advantages: true,
            warm_start: None,
            optimizer: head_optimizer(),
        }
    }
}

impl CriticConfig {
    /// Whether each agent's critic reads the joint history (MAPPO's centralised critic).
    pub fn centralised(&self) -> bool {
        self.sees == Sees::Joint
    }

    /// GAE's discounts of this critic with `algorithm.gamma`.
    pub fn discounts(&self, gamma: f64) -> crate::algo::critic::Discounts {
        crate::algo::critic::Discounts { gamma, lambda: self.lambda, token_lambda: self.token_lambda }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        check((0.0..=1.0).contains(&self.lambda), "critic.lambda", "must be in [0, 1]")?;
        check((0.0..=1.0).contains(&self.token_lambda), "critic.token_lambda", "must be in [0, 1]")?;
        check(self.value_clip > 0.0 && self.value_clip.is_finite(), "critic.value_clip", "must be positive")?;
        check(self.epochs >= 1, "critic.epochs", "must be at least 1")?;
        check(self.mini_batch_sequences >= 1, "critic.mini_batch_sequences", "must be at least 1")?;
        check(self.max_input_tokens >= 1, "critic.max_input_tokens", "must be at least 1")?;
        if let Some(model) = &self.model {
            check(!model.as_os_str().is_empty(), "critic.model", "is empty; give a Hugging Face model folder")?;
        }
        if let Some(lora) = &self.lora {
            check(
                self.model.is_some(),
                "critic.lora",
                "trains a separate critic model's trunk: set critic.model too (a head on the policy's own \
                 trunk reads the trunk the policy's training moves)",
            )?;
            lora.validate("critic.lora")?;
        }
        if let Some(warm) = &self.warm_start {
            check(warm.iterations >= 1, "critic.warm_start.iterations", "must be at least 1")?;
            check(warm.epochs >= 1, "critic.warm_start.epochs", "must be at least 1")?;
        }
        self.optimizer.validate("critic.optimizer")
    }
}
