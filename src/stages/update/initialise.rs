//! The run-level update: version 0 of every policy, or a fork's version K.
//!
//! ```text
//!  pretrained:        the base folder copied in as v0
//!  pretrained + LoRA: the base folder as the frozen base, a fresh adapter (B = 0) as v0
//!  scratch:           LanguageModel::scratch + prepare-data's tokenizer, then the SFT warm
//!                     start on the demonstrations when warm_start is set
//!  fork of run@K:     the source's version K of every policy (a full model forked into
//!                     a policy with `lora` becomes the base of a new adapter)
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::{ForkConfig, RunConfig};
use crate::critic::CRITIC_DIR;
use crate::model::{AdamWState, LanguageModel, ModelConfig};
use crate::policies::{self, BaseRef, Fetched, LoadedPolicies, ModelInit, PolicyConfig};
use crate::progress::{Progress, phase};
use crate::rng::{Key, name_key, stream};
use crate::schema::Table;
use crate::store::{self, CommitInfo, CommitMarker, Partition, RunStore, Stage, StageId, StageWriter, StoredMarker};
use crate::tables::{self, DemonstrationRow};

use super::{Error, warm_critic, warm_start};
use crate::stages;

/// Commits v0 of every policy (`_commits/update.json`), or for a fork of iteration K
/// the source run's version K.
pub async fn initialise(
    store: &RunStore,
    config: &RunConfig,
    progress: &dyn Progress,
) -> Result<CommitMarker, stages::Error> {
    let stage = StageId::run_level(Stage::Update);
    if store.marker(&stage).await?.is_some() {
        return Err(store::Error::AlreadyCommitted { url: store.url().to_string(), stage }.into());
    }
    if let Some(fork) = &config.fork {
        return initialise_from(store, config, fork).await;
    }
    if config.critic.as_ref().is_some_and(|c| c.warm_start.is_some()) {
        let reason = "this run starts afresh and has none: start it with --from RUN@K".into();
        return Err(Error::WarmCritic { reason }.into());
    }
    let prepared = store.marker(&StageId::run_level(Stage::PrepareData)).await?;
    let mut writer = store.begin(stage);
    let mut saved = Vec::new();
    let mut rows = Vec::new();
    let mut model_seconds = 0.0;
    let mut bases = Bases::default();
    for (name, policy_config) in &config.policies {
        let checkpoint = match (policy_config.init, &policy_config.lora) {
            (ModelInit::Pretrained, None) => {
                policies::save_pretrained_copy(&mut writer, name, &policy_config.model).await?
            }
            (ModelInit::Pretrained, Some(lora)) => {
                let base = bases.commit(&mut writer, name, &policy_config.model).await?;
                let mut policy = LanguageModel::load(&policy_config.model, &policy_config.load_options())?;
                policy.add_adapter(name, lora, stream(&[config.seed, Key::LORA, name_key(name)]))?;
                policies::save_policy(&mut writer, name, &policy, Some(&base), 0, None, None).await?
            }
            (ModelInit::Scratch, Some(_)) => {
                unreachable!("config validation refuses init: scratch with lora outside a fork")
            }
            (ModelInit::Scratch, None) => {
                let prepared = prepared.as_ref().ok_or_else(|| Error::Init {
                    policy: name.clone(),
                    reason: "init: scratch takes its tokenizer from prepare-data, which is not committed".into(),
                })?;
                let mut policy = scratch_policy(store, config, name, policy_config, prepared).await?;
                if let Some(warm) = &config.warm_start {
                    let demos: Vec<DemonstrationRow> = store.read_rows(&[&prepared.marker]).await?;
                    let examples = warm_start::examples(&policy, config, name, &demos)?;
                    let started = Instant::now();
                    let label = format!("warm start {name}");
                    let knob = super::memory::memory_knob(&config.update);
                    rows.extend(
                        phase(progress, &label, u64::from(warm.steps), "steps", || {
                            tokio::task::block_in_place(|| {
                                warm_start::train(&mut policy, name, &examples, config, progress)
                            })
                        })
                        .map_err(|e| e.out_of_memory_in(stage, Some(name), &knob))?,
                    );
                    model_seconds += started.elapsed().as_secs_f64();
                }
                policies::save_policy(&mut writer, name, &policy, None, 0, None, None).await?
            }
        };
        saved.push(checkpoint);
    }
    if !rows.is_empty() {
        // Warm-start rows live in the iteration=0 partition (the table is partitioned by
        // iteration only); mode "sft" and version_to 0 tell them from iteration 0's PPO rows.
        let batch =
            tables::to_batch(&rows).map_err(|source| stages::Error::Encode { table: Table::Updates, source })?;
        writer.write_table(Table::Updates, Partition::Iteration(0), &[batch]).await?;
    }
    let info = CommitInfo {
        inputs: prepared.iter().map(StoredMarker::input_ref).collect(),
        checkpoints: saved,
        model_seconds,
        ..stages::run_info(config)
    };
    Ok(writer.finish().commit(info).await?)
}

/// Checks that the run a config forks from has committed version K of every policy.
pub async fn check_fork(config: &RunConfig) -> Result<(), stages::Error> {
    let Some(fork) = &config.fork else { return Ok(()) };
    let markers = RunStore::open(&fork.from)?.markers().await?;
    for name in config.policies.keys() {
        let source = fork_source(&source_policies(&markers, fork.iteration), name);
        let version = source_version(&markers, config, &source, name, fork.iteration);
        policies::find(&markers, &source, version).map_err(|e| fork_error(fork, e))?;
    }
    Ok(())
}

/// The version of the source's policy `from` that the fork's `name` starts from: version
/// k, or for a policy frozen here that the source never trained (frozen there too), its
/// version 0.
fn source_version(markers: &[StoredMarker], config: &RunConfig, from: &str, name: &str, k: u32) -> u32 {
    let frozen = !config.policies[name].trainable;
    if frozen && policies::find(markers, from, k).is_err() { 0 } else { k }
}

/// The policies the source committed a version `k` of.
fn source_policies(markers: &[StoredMarker], k: u32) -> Vec<String> {
    let mut names: Vec<String> = markers
        .iter()
        .flat_map(|m| &m.marker.checkpoints)
        .filter(|c| c.version == k)
        .map(|c| c.policy.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The source policy a fork's policy starts from: the one of the same name or, when
/// the source has only one, that one (a shared policy specialised into one per role).
fn fork_source(source: &[String], name: &str) -> String {
    match source {
        [only] if only != name => only.clone(),
        _ => name.to_string(),
    }
}

fn fork_error(fork: &ForkConfig, source: policies::Error) -> Error {
    Error::Fork { from: fork.from.clone(), iteration: fork.iteration, source: Box::new(source) }
}

/// Commits the source run's version K of every policy as this run's version K. Every
/// checkpoint is found and verified before anything is written. A full model forked
/// into a policy with `lora` becomes the frozen base of a new adapter (L1 from a shared
/// warm start).
async fn initialise_from(
    store: &RunStore,
    config: &RunConfig,
    fork: &ForkConfig,
) -> Result<CommitMarker, stages::Error> {
    let k = fork.iteration;
    let source = RunStore::open(&fork.from)?;
    let markers = source.markers().await?;
    let source_names = source_policies(&markers, k);
    let mut fetched = Vec::new();
    for name in config.policies.keys() {
        let from = fork_source(&source_names, name);
        let version = source_version(&markers, config, &from, name, k);
        let one = policies::fetch(&source, &markers, &from, version).await.map_err(|e| fork_error(fork, e))?;
        fetched.push((Fetched { name: name.clone(), ..one }, from));
    }
    let warm = match config.critic.as_ref().and_then(|c| Some((c, c.warm_start.as_ref()?))) {
        Some((critic, warm_start)) => {
            Some((critic, warm_start, warm_critic::read(&source, config, critic, warm_start, fork).await?))
        }
        None => None,
    };
    let mut writer = store.begin(StageId::run_level(Stage::Update));
    let mut saved = Vec::new();
    let mut rows = Vec::new();
    let mut model_seconds = 0.0;
    let mut bases = Bases::default();
    for (fetched, from) in fetched {
        let name = fetched.name.clone();
        let policy_config = &config.policies[&name];
        let checkpoint = match (&fetched.base, &policy_config.lora) {
            // A full model becomes the frozen base of a new adapter: a new optimisation.
            (None, Some(lora)) => {
                let base = bases.commit(&mut writer, &name, &fetched.dir).await?;
                let mut policy = LanguageModel::load(&fetched.dir, &policy_config.load_options())?;
                policy.add_adapter(&name, lora, stream(&[config.seed, Key::LORA, name_key(&name)]))?;
                policies::save_policy(&mut writer, &name, &policy, Some(&base), k, None, None).await?
            }
            // The source's weights, and its optimisation goes on.
            (source_base, _) => {
                let base = match source_base {
                    Some((_, dir)) => Some(bases.commit(&mut writer, &name, dir).await?),
                    None => None,
                };
                let optimizer = policies::optimizer_file(&source, &markers, &from, k)
                    .await
                    .map_err(|e| fork_error(fork, e))?
                    .map(|path| AdamWState::load(&path))
                    .transpose()?;
                // The critic's heads go on with it too.
                let critic = policies::checkpoint_part(&source, &markers, &from, k, CRITIC_DIR)
                    .await
                    .map_err(|e| fork_error(fork, e))?;
                let mut loaded = LoadedPolicies::default();
                loaded.add(&config.policies, fetched)?;
                let heads = match &warm {
                    Some((critic_config, warm_start, data)) => {
                        let started = Instant::now();
                        let mut separate =
                            stages::separate_critic_model(critic_config, &markers, policy_config, &from, k)?;
                        let (policy, adapter) = stages::critic_trunk(&mut separate, &mut loaded, &name);
                        let adapter = adapter.map(str::to_owned);
                        let (heads, fitted) = tokio::task::block_in_place(|| {
                            let saved = critic.as_deref();
                            let (c, w) = (*critic_config, *warm_start);
                            warm_critic::fit(policy, adapter.as_deref(), config, c, w, data, &name, saved, k)
                        })?;
                        model_seconds += started.elapsed().as_secs_f64();
                        rows.extend(fitted);
                        Some(super::saved_heads(&heads)?)
                    }
                    None => None,
                };
                let part = match &heads {
                    Some(dir) => Some((CRITIC_DIR, dir.path())),
                    None => critic.as_deref().map(|dir| (CRITIC_DIR, dir)),
                };
                let (policy, _) = loaded.model(&name).expect("just added");
                // A policy frozen here has one version, 0, and no optimisation to go on.
                let version = policy_config.version_at(k);
                let optimizer = optimizer.filter(|_| policy_config.trainable);
                policies::save_policy(&mut writer, &name, policy, base.as_ref(), version, optimizer.as_ref(), part)
                    .await?
            }
        };
        saved.push(checkpoint);
    }
    if !rows.is_empty() {
        // As the warm start's SFT rows: in iteration K's partition, version_to K.
        let batch =
            tables::to_batch(&rows).map_err(|source| stages::Error::Encode { table: Table::Updates, source })?;
        writer.write_table(Table::Updates, Partition::Iteration(k), &[batch]).await?;
    }
    let info = CommitInfo { checkpoints: saved, model_seconds, ..stages::run_info(config) };
    Ok(writer.finish().commit(info).await?)
}

/// The base models an initialisation commits, one per source folder: LoRA policies on
/// one base share one copy in the store.
#[derive(Default)]
struct Bases(Vec<(PathBuf, BaseRef)>);

impl Bases {
    /// The committed base of the model in `dir`, committing it under policy `name`'s
    /// folder the first time.
    async fn commit(&mut self, writer: &mut StageWriter<'_>, name: &str, dir: &Path) -> Result<BaseRef, stages::Error> {
        if let Some((_, base)) = self.0.iter().find(|(d, _)| d == dir) {
            return Ok(base.clone());
        }
        let base = policies::save_base(writer, name, dir).await?;
        self.0.push((dir.to_path_buf(), base.clone()));
        Ok(base)
    }
}

/// A model from its config.json alone, with the tokenizer prepare-data committed.
async fn scratch_policy(
    store: &RunStore,
    config: &RunConfig,
    name: &str,
    policy_config: &PolicyConfig,
    prepared: &StoredMarker,
) -> Result<LanguageModel, stages::Error> {
    // prepare-data commits tokenizer.json (and tokenizer_config.json, …) in one folder.
    let tokenizer = prepared
        .marker
        .files
        .iter()
        .find(|f| f.table.is_none() && f.path.rsplit('/').next() == Some("tokenizer.json"))
        .ok_or_else(|| Error::Init {
            policy: name.to_string(),
            reason: format!("init: scratch needs the tokenizer files of prepare-data, and {} has none", prepared.path),
        })?;
    let dir = tokenizer.path.rsplit_once('/').map_or("", |(d, _)| d);
    let local = policies::materialise(store, &prepared.marker.files, dir).await?;
    let model_config = ModelConfig::from_dir(&policy_config.model)?;
    let seed = stream(&[config.seed, Key::INIT, name_key(name)]);
    let mut policy = LanguageModel::scratch(model_config, seed, &policy_config.load_options())?;
    policy.attach_tokenizer_files(&local)?;
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_takes_the_policy_of_the_same_name_or_the_only_one() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(fork_source(&names(&["shared"]), "tool"), "shared");
        assert_eq!(fork_source(&names(&["shared"]), "shared"), "shared");
        assert_eq!(fork_source(&names(&["planner", "tool"]), "tool"), "tool");
        // No match among several: the name itself, which the lookup then reports missing.
        assert_eq!(fork_source(&names(&["a", "b"]), "tool"), "tool");
    }
}
