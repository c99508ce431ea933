//! `policies:` and `retention:`: the trainable policies, and which of their checkpoint
//! files a run keeps.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::model::{DType, Device, LoadOptions, LoraConfig, OptimizerConfig};
use crate::validate::{Invalid, check};

/// One entry of `policies:` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Hugging Face folder of the base model (config.json, tokenizer.json, *.safetensors),
    /// relative to this config file.
    pub model: PathBuf,
    /// pretrained: load the folder's weights and tokenizer; scratch: initialise from its
    /// config.json with the run seed and build the tokenizer from the task corpus.
    #[serde(default)]
    pub init: ModelInit,
    /// Where the policy samples and trains: cpu, cuda or cuda:N.
    #[serde(default)]
    pub device: Device,
    /// Weight dtype; bf16 on CUDA and f32 on CPU when absent.
    #[serde(default)]
    pub dtype: Option<DType>,
    /// Train a LoRA adapter on a frozen base instead of all weights.
    #[serde(default)]
    pub lora: Option<LoraConfig>,
    /// AdamW settings.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// The pool of ranks (`pools.<name>`) whose ranks update this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// false: a frozen agent's policy (a grader, a user simulator, a fixed opponent). Its
    /// turns are sampled with version 0 and stored (`turns.trainable` false), but never
    /// grouped, given advantages or trained.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub trainable: bool,
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

/// Where a policy's v0 weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelInit {
    #[default]
    Pretrained,
    Scratch,
}

impl PolicyConfig {
    /// The checks of one policy's own keys (`key` is `policies.<name>`).
    pub fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(
            !self.model.as_os_str().is_empty(),
            format!("{key}.model"),
            "is empty; give a Hugging Face model folder",
        )?;
        if let Some(lora) = &self.lora {
            lora.validate(&format!("{key}.lora"))?;
        }
        self.optimizer.validate(&format!("{key}.optimizer"))?;
        if !self.trainable {
            check(
                self.optimizer == OptimizerConfig::default(),
                format!("{key}.optimizer"),
                "is set, but the policy is frozen (trainable: false): nothing trains it; drop one of the two",
            )?;
            check(
                self.lora.is_none(),
                format!("{key}.lora"),
                "is set, but the policy is frozen (trainable: false): an adapter nothing trains is the base \
                 model; drop one of the two",
            )?;
        }
        // f16's smallest normal is 6e-5: without a loss scaler, which petting does not
        // have, small gradients flush to zero and the policy silently stops learning.
        check(
            self.dtype != Some(DType::F16),
            format!("{key}.dtype"),
            "f16 training needs dynamic loss scaling, which petting does not do; use bf16 (the same memory, \
             float32's range) or f32",
        )
    }

    /// The version of this policy that samples where the trained policies sample with
    /// `version`: a frozen policy only ever has version 0.
    pub fn version_at(&self, version: u32) -> u32 {
        if self.trainable { version } else { 0 }
    }

    /// The device and dtype the policy is loaded with.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions { device: self.device, dtype: self.dtype }
    }
}

/// Which checkpoints of each policy keep which files. Version 0 (the starting weights,
/// which forks start from) and LoRA base folders are always kept whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// The newest versions of each policy kept whole, weights and optimiser state. At
    /// least 1: the next update continues from the newest version's optimiser state.
    #[serde(default = "one")]
    pub keep_last: u32,
    /// Also prune the weights of older versions (then only their meta.json remains), not
    /// only their optimiser state. Their rows stay; a fork from them is refused.
    #[serde(default)]
    pub weights: bool,
    /// With `weights`: still keep the weights of every version divisible by this.
    #[serde(default)]
    pub keep_every: Option<u32>,
}

fn one() -> u32 {
    1
}

impl Retention {
    pub fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(
            self.keep_last >= 1,
            format!("{key}.keep_last"),
            "must be at least 1: the next update needs the newest version's optimiser state",
        )?;
        check(self.keep_every != Some(0), format!("{key}.keep_every"), "must be at least 1")?;
        check(
            self.keep_every.is_none() || self.weights,
            format!("{key}.keep_every"),
            "only applies with weights: true (optimiser states of older versions are all pruned)",
        )
    }
}

impl std::fmt::Display for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "keep the newest {} version(s) of each policy whole", self.keep_last)?;
        match (self.weights, self.keep_every) {
            (false, _) => write!(f, "; older versions keep their weights, not their optimiser state"),
            (true, None) => write!(f, "; older versions keep only meta.json (version 0 whole)"),
            (true, Some(n)) => write!(f, "; older versions keep weights every {n} versions (version 0 whole)"),
        }
    }
}
