//! The policies of a run in memory: every full model once, and every LoRA policy an
//! adapter on its base's one model (two roles' adapters on one base hold one base).
//!
//! ```text
//!  models:  [ Qwen 0.5B base + adapters {tool, planner} ]   [ full model "critic" ]
//!  members: tool → (model 0, adapter "tool", v3, digest)   planner → (model 0, …)   critic → (model 1, …)
//! ```
//!
//! [`Resident`] keeps them between the stages of one process, so a version is loaded
//! once: the update trains the versions the rollout sampled with and gives back the
//! ones it committed, which the next evaluation and rollout take without reading the
//! store, once each member's digest matches what the commit markers record. The update
//! holds one model at a time ([`LoadedPolicies::keep_only`]), so it gives back the last
//! model it trained and the next stage loads the others from the store.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::model::LanguageModel;
use crate::store::{PolicyRef, RunStore, StoredMarker};

use super::{BaseRef, Error, Fetched, PolicyConfig, fetch, find};

/// The run's policies by name (`policies:`).
type Configs = BTreeMap<String, PolicyConfig>;

/// One policy in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The policy (a key of `policies:`) this is a version of.
    pub policy: String,
    pub version: u32,
    /// The weights digest of that version, as its commit marker records it.
    pub weights_sha256: String,
    /// Index into the models.
    model: usize,
    /// A LoRA policy: its adapter, under the policy's name, on the model's base.
    lora: bool,
}

/// A model in memory: a full policy's weights, or a base and the adapters on it.
#[derive(Debug)]
struct Model {
    policy: LanguageModel,
    /// The committed base, for a model that carries adapters.
    base: Option<BaseRef>,
}

/// The loaded policies of a run, by name.
#[derive(Debug, Default)]
pub struct LoadedPolicies {
    models: Vec<Model>,
    members: BTreeMap<String, Member>,
}

impl LoadedPolicies {
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.get(name)
    }

    /// How many models are in memory (LoRA policies on one base share one).
    pub fn model_count(&self) -> usize {
        self.models.len()
    }

    /// The model `name` runs on, and the adapter to run it with (`None`: the model's own
    /// weights).
    pub fn model(&mut self, name: &str) -> Option<(&mut LanguageModel, Option<&str>)> {
        let (key, member) = self.members.get_key_value(name)?;
        let adapter = member.lora.then_some(key.as_str());
        Some((&mut self.models[member.model].policy, adapter))
    }

    /// Whether `name` is a LoRA adapter on its model.
    pub fn is_lora(&self, name: &str) -> bool {
        self.members.get(name).is_some_and(|m| m.lora)
    }

    /// The committed base of a LoRA policy.
    pub fn base(&self, name: &str) -> Option<&BaseRef> {
        self.members.get(name).filter(|m| m.lora).and_then(|m| self.models[m.model].base.as_ref())
    }

    /// What each loaded policy is, for a marker's `policies_used`.
    pub fn refs(&self) -> Vec<PolicyRef> {
        self.refs_where(|name, m| *name == m.policy)
    }

    /// The past versions a league's roles play, for a marker's `opponents_used`.
    pub fn past_refs(&self) -> Vec<PolicyRef> {
        self.refs_where(|name, m| *name != m.policy)
    }

    fn refs_where(&self, keep: impl Fn(&String, &Member) -> bool) -> Vec<PolicyRef> {
        self.members
            .iter()
            .filter(|(name, m)| keep(name, m))
            .map(|(_, m)| PolicyRef {
                policy: m.policy.clone(),
                version: m.version,
                weights_sha256: m.weights_sha256.clone(),
            })
            .collect()
    }

    /// Records that `name` now holds `version` with weights `weights_sha256` (an update
    /// trained it in place and committed it).
    pub fn advance(&mut self, name: &str, version: u32, weights_sha256: String) {
        if let Some(member) = self.members.get_mut(name) {
            member.version = version;
            member.weights_sha256 = weights_sha256;
        }
    }

    /// Loads a fetched checkpoint: a full model as a model of its own, an adapter onto
    /// the model already holding its base (same weights, device and dtype) or a new one.
    pub fn add(&mut self, configs: &Configs, fetched: Fetched) -> Result<(), Error> {
        let name = fetched.name.clone();
        self.add_as(configs, fetched, name)
    }

    /// Loads a fetched past version of a policy beside its current one, as the member
    /// [`past_member`] names (a LoRA version: one more adapter on the shared base).
    pub fn add_past(&mut self, configs: &Configs, fetched: Fetched) -> Result<(), Error> {
        let name = past_member(&fetched.name, fetched.version);
        self.add_as(configs, fetched, name)
    }

    fn add_as(&mut self, configs: &Configs, fetched: Fetched, name: String) -> Result<(), Error> {
        let policy_config = configs.get(&fetched.name).ok_or_else(|| Error::UnknownPolicy {
            policy: fetched.name.clone(),
            known: configs.keys().cloned().collect(),
        })?;
        let options = policy_config.load_options();
        let (model, lora) = match fetched.base {
            None => {
                self.models.push(Model { policy: LanguageModel::load(&fetched.dir, &options)?, base: None });
                (self.models.len() - 1, false)
            }
            Some((base, base_dir)) => {
                let shared = self.models.iter().position(|m| {
                    m.base.as_ref().is_some_and(|b| b.weights_sha256 == base.weights_sha256)
                        && *m.policy.options() == options
                });
                let model = match shared {
                    Some(model) => model,
                    None => {
                        self.models.push(Model { policy: LanguageModel::load(&base_dir, &options)?, base: Some(base) });
                        self.models.len() - 1
                    }
                };
                self.models[model].policy.load_adapter(&name, &fetched.dir)?;
                (model, true)
            }
        };
        let (policy, version, weights_sha256) = (fetched.name, fetched.version, fetched.weights_sha256);
        self.members.insert(name, Member { policy, version, weights_sha256, model, lora });
        Ok(())
    }

    /// Drops every model but the one `name` runs on, with the members on it (every
    /// model when no member is `name`): a full fine-tune needs its weights, gradients and
    /// optimiser moments in memory, and another role's full model beside them is what
    /// overflows a machine that fits one (two 0.5B models on 24 GiB).
    pub fn keep_only(&mut self, name: &str) {
        let Some(kept) = self.members.get(name).map(|m| m.model) else {
            *self = LoadedPolicies::default();
            return;
        };
        let model = self.models.swap_remove(kept);
        self.models = vec![model];
        self.members.retain(|_, m| m.model == kept);
        self.members.values_mut().for_each(|m| m.model = 0);
    }

    /// Whether every member is a policy of `configs` at version `version` (version 0 for a
    /// frozen one) as committed (some policies may be missing).
    fn all_at(&self, markers: &[StoredMarker], configs: &Configs, version: u32) -> bool {
        self.members.iter().all(|(name, m)| {
            let Some(config) = configs.get(name) else { return false };
            let version = config.version_at(version);
            let committed = find(markers, name, version).ok().map(|(_, c)| &c.weights_sha256);
            m.version == version && Some(&m.weights_sha256) == committed
        })
    }

    /// Loads version `version` (version 0 for a frozen one) of every policy of `configs`
    /// that is not a member yet.
    async fn load_missing(
        &mut self,
        store: &RunStore,
        markers: &[StoredMarker],
        configs: &Configs,
        version: u32,
    ) -> Result<(), Error> {
        for (name, config) in configs {
            if !self.members.contains_key(name) {
                self.add(configs, fetch(store, markers, name, config.version_at(version)).await?)?;
            }
        }
        Ok(())
    }
}

/// The member a past version of `policy` is loaded as, beside the current one.
pub fn past_member(policy: &str, version: u32) -> String {
    format!("{policy}@v{version}")
}

/// Version `version` of every policy of the run (a frozen one's version 0), each file
/// checked against its marker.
pub async fn load_all(store: &RunStore, configs: &Configs, version: u32) -> Result<LoadedPolicies, Error> {
    let markers = store.markers().await?;
    let mut loaded = LoadedPolicies::default();
    loaded.load_missing(store, &markers, configs, version).await?;
    Ok(loaded)
}

/// Version `version` of one policy.
pub async fn load(store: &RunStore, configs: &Configs, name: &str, version: u32) -> Result<LoadedPolicies, Error> {
    let markers = store.markers().await?;
    let mut loaded = LoadedPolicies::default();
    loaded.add(configs, fetch(store, &markers, name, version).await?)?;
    Ok(loaded)
}

/// Policies kept in memory between the stages of one process (`petting pipeline run`),
/// so that each version is loaded once. A stage takes them and gives them back when done;
/// a stage that fails gives nothing back, and the next one loads from the store.
#[derive(Debug, Default)]
pub struct Resident {
    policies: Mutex<Option<LoadedPolicies>>,
}

impl Resident {
    /// Version `version` of every policy (a frozen one's version 0): the resident members
    /// when every one is that version with the digest its commit marker records, and the
    /// policies not resident loaded from the store; else all from the store (the resident
    /// set dropped first, so two sets are never in memory).
    pub async fn take(&self, store: &RunStore, configs: &Configs, version: u32) -> Result<LoadedPolicies, Error> {
        let markers = store.markers().await?;
        let resident = self.policies.lock().expect("resident policies").take();
        let mut loaded = resident.filter(|l| l.all_at(&markers, configs, version)).unwrap_or_default();
        loaded.load_missing(store, &markers, configs, version).await?;
        Ok(loaded)
    }

    pub fn give_back(&self, loaded: LoadedPolicies) {
        *self.policies.lock().expect("resident policies") = Some(loaded);
    }
}
