//! The `iteration.yaml` schema: the run file, loaded, overridden with `--set`, and
//! validated once, here.
//!
//! A section's type lives with the module it configures (`env` in `envs`, `workflow` in
//! `workflows`, `algorithm` in `algo`, model settings in `model`, `policies:` in
//! `policies`, the engines and `vllm:` in `engine`, `limits:` in `limits`), which is handed
//! its values, never the run file. The stages are handed the whole run config, since
//! each reads several sections; their own sections live here, one file each. A value
//! that spans sections (the behaviour temperature and the loss aggregation the update
//! takes from the rollout's sampling) is a method of [`RunConfig`], here.
//!
//! Unknown keys and wrong types are errors naming the file, the key path and what is
//! allowed; each section checks its own values and [`RunConfig::validate`] the rules
//! that span sections (every workflow role has an agent, every agent's policy exists, …)
//! right after parsing, so no stage ever meets a half-valid config. Paths inside the
//! file are relative to the file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::algo::AlgorithmConfig;
use crate::critic::CriticConfig;
use crate::engine::VllmConfig;
use crate::envs::EnvConfig;
use crate::envs::dataset::DataConfig;
use crate::limits::Limits;
use crate::policies::{League, PolicyConfig, Retention};
use crate::validate::Invalid;
use crate::workflows::{Agent, WorkflowConfig, WorkflowKind};

mod evaluation;
pub mod pools;
pub mod reference;
mod renamed;
mod rollout;
mod update;
mod validation;
mod warm_start;

pub use evaluation::{EvalMode, EvaluationConfig};
pub use pools::PoolConfig;
pub use renamed::Renamed;
pub use rollout::RolloutConfig;
pub use update::{Recompute, UpdateConfig};
pub use warm_start::WarmStartConfig;

/// A problem with a config file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {file}: {source}")]
    Read { file: PathBuf, source: std::io::Error },

    #[error("{file}: {}{message}", key_prefix(.key))]
    Parse { file: PathBuf, key: Option<String>, message: String },

    #[error("{file}: {key}: {message}")]
    Invalid { file: PathBuf, key: String, message: String },

    #[error("{url} has no run.yaml; create the run with `petting pipeline run iteration.yaml`")]
    NoRun { url: String },

    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

fn key_prefix(key: &Option<String>) -> String {
    key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default()
}

/// A whole run: `iteration.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Where the run lives: a local path, file:///path, s3://bucket/prefix, gs://…, az://… or memory://.
    pub store: String,
    /// Name recorded in every row the run samples; defaults to the store's last path segment.
    #[serde(default)]
    pub name: Option<String>,
    /// Seed of every random stream of the run (tasks, sampling, initialisation).
    #[serde(default)]
    pub seed: u64,
    /// Training iterations to run (each: rollout, group, advantage, update, evaluate).
    pub iterations: u32,
    /// The environment and its parameters.
    pub env: EnvConfig,
    /// How many tasks prepare-data makes, or which dataset files it reads.
    #[serde(default)]
    pub data: DataConfig,
    /// Who acts in which order; a hosted environment's own order when omitted.
    #[serde(default)]
    pub workflow: WorkflowConfig,
    /// Each workflow role and the policy that plays it.
    pub agents: BTreeMap<Agent, AgentConfig>,
    /// The trainable policies, by name.
    pub policies: BTreeMap<String, PolicyConfig>,
    /// How training trajectories are sampled.
    #[serde(default)]
    pub rollout: RolloutConfig,
    /// Advantage estimator and loss.
    #[serde(default)]
    pub algorithm: AlgorithmConfig,
    /// The learned critic of `algorithm.name: ppo` (and only of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic: Option<CriticConfig>,
    /// Optimisation of each policy on its own samples.
    #[serde(default)]
    pub update: UpdateConfig,
    /// Held-out evaluation.
    #[serde(default)]
    pub evaluation: EvaluationConfig,
    /// The vLLM server that stages with `engine: vllm` sample through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm: Option<VllmConfig>,
    /// Supervised warm start on solver demonstrations, building v0 of policies whose
    /// model is initialised from scratch (the embedded default).
    #[serde(default)]
    pub warm_start: Option<WarmStartConfig>,
    /// The stored run this one starts from (`pipeline run --from URL@K` sets it): that
    /// run's policies of version K are this run's checkpoints of version K, and its
    /// iterations run from K on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkConfig>,
    /// Which checkpoint files the run keeps: after every update, older versions'
    /// optimiser states (and, if asked, weights) are pruned. Absent: everything is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// Bounds on what comes in from outside the run: rewards, request bodies, tasks,
    /// host messages.
    #[serde(default, skip_serializing_if = "Limits::is_default")]
    pub limits: Limits,
    /// Pools of ranks, by name (`policies.<name>.pool` puts a policy in one): with ranks,
    /// each policy's update runs over its pool's ranks only, every pool at once. Absent:
    /// every rank trains every policy, one after the other.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<String, PoolConfig>,
    /// Experiment trackers that receive each committed stage's metrics (TensorBoard, MLflow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<crate::tracking::TrackingConfig>,
}

/// A stored run and one of its iterations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkConfig {
    /// The source run: a local path or a URL.
    pub from: String,
    /// Its iteration K: the run starts from the policies iteration K sampled with.
    pub iteration: u32,
    /// Replay (`URL@K:group`): copy the source's rollout of iteration K instead of sampling
    /// it, so group, advantage and update run with this run's algorithm on exactly the
    /// same turns. Everything that decides what rollout K samples must match the source.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay: bool,
}

impl std::str::FromStr for ForkConfig {
    type Err = String;

    /// `URL@K` or `URL@K:group`, e.g. `runs/plan-path@10` or `s3://bucket/runs/a@3:group`.
    fn from_str(text: &str) -> Result<ForkConfig, String> {
        let (from, rest) =
            text.rsplit_once('@').ok_or_else(|| format!("{text:?} is not URL@K or URL@K:group (e.g. runs/a@10)"))?;
        let (k, stage) = rest.split_once(':').map_or((rest, None), |(k, s)| (k, Some(s)));
        let iteration = k.parse().map_err(|_| format!("{k:?} after '@' in {text:?} is not an iteration number"))?;
        if from.is_empty() {
            return Err(format!("{text:?} names no run before '@'"));
        }
        let replay = match stage {
            None => false,
            Some("group") => true,
            Some(other) => {
                return Err(format!(
                    "{other:?} after ':' in {text:?}: a fork restarts at rollout (URL@K) or at group, \
                     replaying rollout K (URL@K:group)"
                ));
            }
        };
        Ok(ForkConfig { from: from.to_string(), iteration, replay })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The policy (a key of `policies`) that plays this role.
    pub policy: String,
    /// Play a past version of the policy instead (fictitious self-play), drawn per task
    /// from the versions stored before the rollout. The role's turns are stored with the
    /// version played and never trained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub league: Option<League>,
}

/// A parsed, validated config and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: RunConfig,
    /// The file as written, frozen into the run as run.yaml.
    pub text: String,
    pub file: PathBuf,
    /// Keys the file writes under an old name, moved to their new one.
    pub renamed: Vec<Renamed>,
}

impl LoadedConfig {
    /// Folder that relative paths in the file are resolved against.
    pub fn base_dir(&self) -> &Path {
        self.file.parent().unwrap_or(Path::new("."))
    }

    pub fn resolve(&self, path: &Path) -> PathBuf {
        self.base_dir().join(path)
    }

    /// The store URL, with a local path taken relative to the config file.
    pub fn store_url(&self) -> String {
        self.resolve_url(&self.config.store)
    }

    /// A URL as it is; a local path relative to the config file's folder.
    fn resolve_url(&self, location: &str) -> String {
        if location.contains("://") {
            location.to_string()
        } else {
            absolute(&self.resolve(Path::new(location))).to_string_lossy().into_owned()
        }
    }

    /// The config as a run freezes it: every default filled in and every local path
    /// absolute, so stages reading it from the store need nothing else.
    pub fn resolved(&self) -> RunConfig {
        let mut config = self.config.clone();
        config.store = self.store_url();
        if let Some(fork) = &mut config.fork {
            fork.from = self.resolve_url(&fork.from);
        }
        for policy in config.policies.values_mut() {
            policy.model = absolute(&self.resolve(&policy.model));
        }
        if let Some(model) = config.critic.as_mut().and_then(|c| c.model.as_mut()) {
            *model = absolute(&self.resolve(model));
        }
        for file in [&mut config.data.train_file, &mut config.data.test_file].into_iter().flatten() {
            file.path = absolute(&self.resolve(&file.path));
        }
        if let EnvConfig::AgentProgram(program) = &mut config.env {
            program.workdir = Some(absolute(&self.resolve(program.workdir.as_deref().unwrap_or(Path::new(".")))));
            if let Some(python) = program.python.as_mut().filter(|p| p.components().count() > 1) {
                *python = absolute(&self.resolve(python));
            }
        }
        // A hosted environment's files are found from the run file's folder.
        let host = match &mut config.env {
            EnvConfig::TextArena(c) => Some(&mut c.host),
            EnvConfig::External(c) => Some(&mut c.host),
            EnvConfig::ReasoningGym(c) => Some(&mut c.host),
            EnvConfig::Math(c) if c.reward.is_some() => Some(&mut c.host),
            EnvConfig::Code(c) if c.reward.is_some() => Some(&mut c.host),
            _ => None,
        };
        if let Some(host) = host {
            host.workdir = Some(absolute(&self.resolve(host.workdir.as_deref().unwrap_or(Path::new(".")))));
            if let Some(python) = host.python.as_mut().filter(|p| p.components().count() > 1) {
                *python = absolute(&self.resolve(python));
            }
        }
        config
    }

    /// The text of `run.yaml`: the resolved config as YAML, with where it came from.
    pub fn frozen_yaml(&self) -> String {
        let yaml = serde_saphyr::to_string(&self.resolved()).expect("a config always serialises");
        format!("# Frozen by {} from {}\n{yaml}", crate::CODE_VERSION, absolute(&self.file).display())
    }
}

/// A config's settings by dotted key path (`rollout.sampling.temperature`), each list and
/// scalar one value (strings as they are, anything else as JSON), unset keys left out:
/// what `compare` tells runs apart by and MLflow takes as parameters.
pub fn settings(config: &serde_json::Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let key = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&key, value, out);
                }
            }
            serde_json::Value::Null => {}
            serde_json::Value::String(text) => {
                out.insert(prefix.to_string(), text.clone());
            }
            leaf => {
                out.insert(prefix.to_string(), leaf.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", config, &mut out);
    out
}

/// Reads, parses and validates a config file.
pub fn load(file: &Path) -> Result<LoadedConfig, Error> {
    load_with(file, &[])
}

/// Reads a config file, sets the overridden keys in it, then parses and validates it.
pub fn load_with(file: &Path, overrides: &[Override]) -> Result<LoadedConfig, Error> {
    read(file, overrides)?.validate()
}

/// Reads a config file and sets the overridden keys in it, then parses it without
/// validating: the run's fork may still be decided.
pub fn read(file: &Path, overrides: &[Override]) -> Result<Draft, Error> {
    let mut text = std::fs::read_to_string(file).map_err(|source| Error::Read { file: file.to_path_buf(), source })?;
    if !overrides.is_empty() {
        text = apply_overrides(&text, overrides, file)?;
    }
    let (config, renamed) = parse_unchecked(&text, file)?;
    Ok(Draft(LoadedConfig { config, text, file: file.to_path_buf(), renamed }))
}

/// A config file read and parsed but not yet validated, because whether the run is a
/// fork (`--from`, or the fork a stored run was started with) decides what is valid: a
/// LoRA adapter on a model trained from scratch needs one.
#[derive(Debug, Clone)]
pub struct Draft(LoadedConfig);

impl Draft {
    /// The store URL, with a local path taken relative to the config file.
    pub fn store_url(&self) -> String {
        self.0.store_url()
    }

    pub fn fork(&self) -> Option<&ForkConfig> {
        self.0.config.fork.as_ref()
    }

    /// Keys the file writes under an old name.
    pub fn renamed(&self) -> &[Renamed] {
        &self.0.renamed
    }

    /// The config as a run would freeze it (see [`LoadedConfig::resolved`]), unvalidated.
    pub fn resolved(&self) -> RunConfig {
        self.0.resolved()
    }

    /// Starts the run from `fork` (a local source path should be absolute: paths in the
    /// file are relative to the file, this one is not from the file).
    pub fn set_fork(&mut self, fork: ForkConfig) {
        self.0.config.fork = Some(fork);
    }

    pub fn validate(self) -> Result<LoadedConfig, Error> {
        let file = &self.0.file;
        self.0.config.validate().map_err(|Invalid { key, message }| Error::Invalid {
            file: file.clone(),
            key,
            message,
        })?;
        Ok(self.0)
    }
}

/// `KEY=VALUE` from the command line: a dotted key of the file (`algorithm.alpha`) and a
/// YAML value, which replaces the file's value before the file is parsed. Relative paths
/// in values are taken relative to the file, like the file's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub key: String,
    pub value: String,
}

impl std::str::FromStr for Override {
    type Err = String;

    fn from_str(text: &str) -> Result<Override, String> {
        let (key, value) =
            text.split_once('=').ok_or_else(|| format!("{text:?} is not KEY=VALUE (e.g. algorithm.alpha=0.5)"))?;
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(format!("{key:?} in {text:?} is not a dotted key (e.g. algorithm.alpha)"));
        }
        Ok(Override { key: key.to_string(), value: value.to_string() })
    }
}

fn apply_overrides(text: &str, overrides: &[Override], file: &Path) -> Result<String, Error> {
    let parse_error = |message: String| Error::Parse { file: file.to_path_buf(), key: None, message };
    let mut tree: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| parse_error(e.to_string()))?;
    for Override { key, value } in overrides {
        let value = serde_saphyr::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.clone()));
        set_key(&mut tree, key, value).map_err(|message| Error::Invalid {
            file: file.to_path_buf(),
            key: key.clone(),
            message,
        })?;
    }
    Ok(serde_saphyr::to_string(&tree).expect("a YAML tree always serialises"))
}

/// Sets a dotted key in a YAML tree, creating the mappings on its way that are absent.
fn set_key(tree: &mut serde_json::Value, key: &str, value: serde_json::Value) -> Result<(), String> {
    let mut node = tree;
    for part in key.split('.') {
        if node.is_null() {
            *node = serde_json::Value::Object(Default::default());
        }
        let serde_json::Value::Object(map) = node else {
            return Err(format!("--set cannot set `{part}` inside a value that is not a mapping"));
        };
        node = map.entry(part).or_insert(serde_json::Value::Null);
    }
    *node = value;
    Ok(())
}

/// Parses and validates config text; `file` only names it in errors.
/// The frozen config of the run at `store` (its run.yaml), as every stage reads it.
pub async fn of_run(store: &crate::store::RunStore) -> Result<RunConfig, Error> {
    let text = store.run_config().await?.ok_or_else(|| Error::NoRun { url: store.url().to_string() })?;
    parse(&text, &Path::new(store.url()).join(crate::store::layout::RUN_CONFIG))
}

pub fn parse(text: &str, file: &Path) -> Result<RunConfig, Error> {
    let (config, _) = parse_unchecked(text, file)?;
    config.validate().map_err(|Invalid { key, message }| Error::Invalid { file: file.to_path_buf(), key, message })?;
    Ok(config)
}

/// Parses config text, old key names moved to their new ones (which are returned).
fn parse_unchecked(text: &str, file: &Path) -> Result<(RunConfig, Vec<Renamed>), Error> {
    let mut tree: serde_json::Value = serde_saphyr::from_str(text).unwrap_or(serde_json::Value::Null);
    let renamed = renamed::rename_old_keys(&mut tree).map_err(|Invalid { key, message }| Error::Invalid {
        file: file.to_path_buf(),
        key,
        message,
    })?;
    // Text without old keys is parsed as written, so that errors point into the file.
    let renamed_text =
        (!renamed.is_empty()).then(|| serde_saphyr::to_string(&tree).expect("a YAML tree always serialises"));
    let text = renamed_text.as_deref().unwrap_or(text);
    let mut key = None;
    let parsed = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            key = (path != ".").then_some(path);
            e.into_inner()
        })
    });
    let config: RunConfig = parsed.map_err(|e| {
        let message = e.to_string();
        let message = message.strip_prefix("error: ").unwrap_or(&message).to_string();
        Error::Parse { file: file.to_path_buf(), key, message }
    })?;
    Ok((config, renamed))
}

fn absolute(path: &Path) -> PathBuf {
    crate::store::absolute_path(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The truncated importance weights' cap when rollouts may be stale and the run file sets
/// none (verl's and AReaL's default).
pub const STALE_IMPORTANCE_CAP: f64 = 2.0;

impl RunConfig {
    /// The agents `policy` plays, in name order.
    pub fn agents_of(&self, policy: &str) -> Vec<&str> {
        self.agents.iter().filter(|(_, a)| a.policy == policy).map(|(agent, _)| agent.as_str()).collect()
    }

    /// The first iteration the run trains: 0, or the iteration it was forked from.
    pub fn first_iteration(&self) -> u32 {
        self.fork.as_ref().map_or(0, |f| f.iteration)
    }

    /// The version of every policy iteration `k`'s rollout samples with: k itself
    /// strictly on-policy, else `rollout.max_staleness` behind it (never before the
    /// first). A rule of the config, not of timing, so a rerun or a resume samples with
    /// the very version the first attempt did.
    pub fn sampled_version(&self, k: u32) -> u32 {
        k.saturating_sub(self.rollout.max_staleness).max(self.first_iteration())
    }

    /// The cap of the truncated importance weights π_trainer / π_sampler: the run file's,
    /// else, when rollouts may be stale, [`STALE_IMPORTANCE_CAP`] (a stale sample's
    /// sampler is an older policy, and the weights correct for it).
    pub fn importance_cap(&self) -> Option<f64> {
        let stale = self.rollout.max_staleness > 0;
        self.update.truncated_importance_ratio.or(stale.then_some(STALE_IMPORTANCE_CAP))
    }

    /// The agents of the run: the workflow's, or a hosted environment's (a TextArena
    /// game's players; an external environment's are the run file's `agents:`, checked
    /// against the environment's own when its host starts).
    pub fn team(&self) -> Vec<Agent> {
        match (&self.env, self.workflow.kind) {
            (EnvConfig::TextArena(game), _) => game.agents(),
            (_, WorkflowKind::Environment) => self.agents.keys().copied().collect(),
            (_, kind) => kind.agents().to_vec(),
        }
    }

    /// Which policy plays each agent.
    pub fn agent_policies(&self) -> HashMap<Agent, String> {
        self.agents.iter().map(|(role, agent)| (*role, agent.policy.clone())).collect()
    }

    /// The sections that decide what a rollout samples (given the weights) and that
    /// differ between two configs: a replay copies turns only between equal ones.
    pub fn sampling_differences(&self, other: &RunConfig) -> Vec<&'static str> {
        fn json<T: Serialize>(value: &T) -> serde_json::Value {
            serde_json::to_value(value).expect("a config always serialises")
        }
        let sections: [(&'static str, serde_json::Value, serde_json::Value); 6] = [
            ("seed", json(&self.seed), json(&other.seed)),
            ("env", json(&self.env), json(&other.env)),
            ("data", json(&self.data), json(&other.data)),
            ("workflow", json(&self.workflow), json(&other.workflow)),
            ("agents", json(&self.agents), json(&other.agents)),
            ("rollout", json(&self.rollout), json(&other.rollout)),
        ];
        sections.into_iter().filter(|(_, a, b)| a != b).map(|(name, _, _)| name).collect()
    }

    /// The run's name: `name`, or the last segment of the store URL.
    pub fn run_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let trimmed = self.store.trim_end_matches('/');
            trimmed.rsplit('/').next().unwrap_or(trimmed).to_string()
        })
    }

    /// The temperature the rollout's samples were drawn at, which the trainer's logprobs
    /// must use to be the behaviour policy's (a greedy rollout's are at temperature 1).
    pub fn behaviour_temperature(&self) -> f64 {
        match self.rollout.sampling.temperature {
            t if t > 0.0 => t,
            _ => 1.0,
        }
    }

    /// How the update turns token losses into a loss: the estimator's aggregation, whose
    /// Dr.GRPO normaliser is the longest response the rollout can sample.
    pub fn loss_aggregation(&self) -> crate::algo::loss::Aggregation {
        self.algorithm.name.aggregation(self.rollout.sampling.max_new_tokens)
    }

    /// sha256 of the resolved config (defaults filled in), so formatting and comments
    /// do not count as a change but every setting does.
    pub fn sha256(&self) -> String {
        let json = serde_json::to_vec(self).expect("a config always serialises");
        hex::encode(Sha256::digest(json))
    }
}

#[cfg(test)]
mod tests;
