//! update: trains each policy on its own samples and commits its next version.
//!
//! ```text
//!  run-level  initialise ──► _commits/update.json            v0 of every policy
//!             pretrained: the base folder copied in; LoRA: base + a fresh adapter (B = 0);
//!             scratch: Policy::scratch + prepare-data's tokenizer, then SFT on the
//!             demonstrations when warm_start is set (updates rows, mode "sft")
//!
//!  iteration k  run ──► _commits/iteration=k/update.json     v(k+1) of every policy
//!    1. checks, before anything is written (strict on-policy, DESIGN §3):
//!       latest committed version of each policy == k; the rollout marker's PolicyRef
//!       (version, weights sha256) == that checkpoint; every turns part the rollout
//!       names is under turns/iteration=k/; every turns and samples row carries v_k;
//!       the samples were computed from this rollout
//!    2. per policy (its own samples only, joined to turns by candidate_id):
//!       recompute the response logprobs with the loaded weights (drift vs sampled;
//!       mean drift > update.max_logprob_drift is an error), then PPO-clip steps
//!       (a failure here, e.g. drift, may leave the earlier policies' new files as
//!       orphans for `petting gc`; the checks of step 1 and every checkpoint's hashes
//!       come before the first write)
//!    3. one marker: the checkpoints v(k+1), the updates table, the versions used
//! ```
//!
//! The recomputed logprobs are the PPO "old" logprobs: on-policy they equal the sampled
//! ones up to numerics (bf16 sampling vs f32 training, batching), and using them makes
//! the first step's ratio exactly 1. Sample order is a seeded shuffle keyed by (run
//! seed, iteration, policy, epoch), so a rerun on CPU writes the same weights bit for bit.
//!
//! A fresh AdamW is built per update (optimiser state is not checkpointed). Its
//! learning-rate schedule is placed on a run-wide step axis that assumes every iteration
//! takes as many steps as this one: step = k · steps_k + s of iterations · steps_k.
//!
//! `updates.entropy` is the mean of −log π(token) over the mini-batch's sampled tokens
//! under the pre-step weights: the token entropy in expectation when the rollout sampled
//! at temperature 1 without top-p/top-k (a cross-entropy otherwise); full-vocabulary
//! entropy would need the (N, V) logits the training forward avoids. SFT rows record 0.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tch::{Kind, Tensor};

use super::checkpoints::{self, LoadedPolicy};
use super::inputs;
use crate::algo::loss::{Aggregation, ppo_clip_loss};
use crate::config::{
    Algorithm, ForkConfig, ModelInit, OptimizerConfig, PolicyConfig, RunConfig, Schedule, WarmStartConfig,
};
use crate::envs::rng::{SplitMix64, stream};
use crate::model::{self, LoadOptions, ModelConfig, Policy, ScoreRequest};
use crate::progress::{Progress, phase};
use crate::schema::Table;
use crate::store::{
    self, CommitInfo, CommitMarker, InputRef, Partition, PolicyRef, RunStore, Stage, StageId, StoredMarker,
};
use crate::tables::{self, DemonstrationRow, SampleRow, TurnRow, UpdateRow};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Stage(#[from] super::Error),

    #[error(transparent)]
    Store(#[from] store::Error),

    #[error(transparent)]
    Model(#[from] model::Error),

    #[error(transparent)]
    Checkpoint(#[from] checkpoints::Error),

    #[error("libtorch: {context}: {source}")]
    Torch { context: &'static str, source: tch::TchError },

    #[error("cannot encode the updates table: {0}")]
    Encode(#[from] serde_arrow::Error),

    #[error("policy {policy:?} has no committed checkpoint; commit v0 first (the run-level update, `initialise`)")]
    NoCheckpoint { policy: String },

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: the update of iteration {iteration} trains \
         v{iteration}, but the latest committed checkpoint is v{latest}; nothing was written"
    )]
    NotAligned { policy: String, iteration: u32, latest: u32 },

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: the rollout ({marker}) sampled v{rollout_version} \
         with weights sha256 {rollout_sha256}, but the latest committed checkpoint is v{version} with weights \
         sha256 {checkpoint_sha256}; nothing was written"
    )]
    WeightsMismatch {
        policy: String,
        iteration: u32,
        marker: String,
        rollout_version: u32,
        rollout_sha256: String,
        version: u32,
        checkpoint_sha256: String,
    },

    #[error(
        "refusing to update iteration {iteration}: policy {policy:?} has turns, but the rollout marker does not \
         record which weights sampled them; nothing was written"
    )]
    UnrecordedPolicy { policy: String, iteration: u32 },

    #[error(
        "refusing to update iteration {iteration}: the rollout marker {marker} names {path}, which is not a turns \
         part of iteration {iteration}; nothing was written"
    )]
    ForeignPart { iteration: u32, marker: String, path: String },

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: {table} row {candidate_id} was sampled by \
         v{found}, but the latest committed checkpoint is v{expected}; nothing was written"
    )]
    RowVersion { policy: String, iteration: u32, table: Table, candidate_id: String, found: u32, expected: u32 },

    #[error("{table} row {candidate_id} names policy {policy:?}, which is not one of the run's policies")]
    UnknownPolicy { table: Table, candidate_id: String, policy: String },

    #[error("samples row {candidate_id} of iteration {iteration} has no turns row in the rollout")]
    MissingTurn { iteration: u32, candidate_id: String },

    #[error("candidate {candidate_id}: {reason}")]
    BadRow { candidate_id: String, reason: String },

    #[error(
        "refusing to update iteration {iteration}: the samples ({advantage}) were not computed from the committed \
         rollout {rollout}"
    )]
    StaleSamples { iteration: u32, advantage: String, rollout: String },

    #[error(
        "refusing to update {policy:?} v{version}: the recomputed logprobs differ from the sampled ones by {mean:.4} \
         on average (max {max:.4}), more than update.max_logprob_drift = {limit}; the rollout used other weights \
         or the sampler is broken"
    )]
    Drift { policy: String, version: u32, mean: f64, max: f64, limit: f64 },

    #[error("policy {policy:?}: {reason}")]
    Init { policy: String, reason: String },

    #[error("cannot fork iteration {iteration} of {from}: {source}")]
    Fork { from: String, iteration: u32, source: Box<checkpoints::Error> },
}

/// Keys of this stage's random streams (beside the run seed).
const INIT_KEY: u64 = 0x494E_4954; // "INIT"
const LORA_KEY: u64 = 0x4C4F_5241; // "LORA"
const SFT_KEY: u64 = 0x5346_5400; // "SFT"
const PPO_KEY: u64 = 0x5050_4F00; // "PPO"

/// A stream key of a policy name.
fn name_key(name: &str) -> u64 {
    stream(&name.bytes().map(u64::from).collect::<Vec<_>>())
}

fn load_options(policy: &PolicyConfig) -> LoadOptions {
    LoadOptions { device: policy.device, dtype: policy.dtype }
}

// ───────────────────────────── v0: the run-level update ─────────────────────────────

/// Commits v0 of every policy (`_commits/update.json`), or for a fork of iteration K
/// the source run's version K.
pub async fn initialise(store: &RunStore, config: &RunConfig, progress: &dyn Progress) -> Result<CommitMarker, Error> {
    let stage = StageId::run_level(Stage::Update);
    if store.marker(&stage).await?.is_some() {
        return Err(store::Error::AlreadyCommitted { url: store.url().to_string(), stage }.into());
    }
    if let Some(fork) = &config.fork {
        return initialise_from(store, config, fork).await;
    }
    let prepared = store.marker(&StageId::run_level(Stage::PrepareData)).await?;
    let mut writer = store.begin(stage);
    let mut saved = Vec::new();
    let mut rows = Vec::new();
    let mut model_seconds = 0.0;
    for (name, policy_config) in &config.policies {
        let checkpoint = match (policy_config.init, &policy_config.lora) {
            (ModelInit::Pretrained, None) => {
                checkpoints::save_pretrained_copy(&mut writer, name, &policy_config.model).await?
            }
            (ModelInit::Pretrained, Some(lora)) => {
                let base = checkpoints::save_base(&mut writer, name, &policy_config.model).await?;
                let mut policy = Policy::load(&policy_config.model, &load_options(policy_config))?;
                policy.add_adapter(name, lora, stream(&[config.seed, LORA_KEY, name_key(name)]))?;
                let loaded = LoadedPolicy {
                    name: name.clone(),
                    version: 0,
                    weights_sha256: String::new(),
                    policy,
                    base: Some(base),
                };
                checkpoints::save(&mut writer, &loaded, 0).await?
            }
            (ModelInit::Scratch, Some(_)) => {
                return Err(Error::Init {
                    policy: name.clone(),
                    reason: "a LoRA adapter needs a pretrained base: use init: pretrained, or fork the run from a \
                             warm-started one (--from runs/plan-path@0), or drop lora"
                        .into(),
                });
            }
            (ModelInit::Scratch, None) => {
                let prepared = prepared.as_ref().ok_or_else(|| Error::Init {
                    policy: name.clone(),
                    reason: "init: scratch takes its tokenizer from prepare-data, which is not committed".into(),
                })?;
                let mut policy = scratch_policy(store, config, name, policy_config, prepared).await?;
                if let Some(warm) = &config.warm_start {
                    let demos: Vec<DemonstrationRow> = store.read_rows(&[&prepared.marker]).await?;
                    let examples = sft_examples(&policy, config, name, &demos)?;
                    let seed = stream(&[config.seed, SFT_KEY, name_key(name)]);
                    let settings = SftSettings { warm, grad_clip: config.update.grad_clip, seed };
                    let started = Instant::now();
                    let label = format!("warm start {name}");
                    rows.extend(phase(progress, &label, u64::from(warm.steps), "steps", || {
                        train_sft(&mut policy, name, &examples, &settings, &config.update, progress)
                    })?);
                    model_seconds += started.elapsed().as_secs_f64();
                }
                let loaded =
                    LoadedPolicy { name: name.clone(), version: 0, weights_sha256: String::new(), policy, base: None };
                checkpoints::save(&mut writer, &loaded, 0).await?
            }
        };
        saved.push(checkpoint);
    }
    if !rows.is_empty() {
        // Warm-start rows live in the iteration=0 partition (the table is partitioned by
        // iteration only); mode "sft" and version_to 0 tell them from iteration 0's PPO rows.
        writer.write_table(Table::Updates, Partition::Iteration(0), &[tables::to_batch(&rows)?]).await?;
    }
    let info = CommitInfo {
        inputs: prepared.iter().map(StoredMarker::input_ref).collect(),
        checkpoints: saved,
        model_seconds,
        ..super::run_info(config)
    };
    Ok(writer.finish().commit(info).await?)
}

/// Checks that the run a config forks from has committed version K of every policy.
pub async fn check_fork(config: &RunConfig) -> Result<(), Error> {
    let Some(fork) = &config.fork else { return Ok(()) };
    let markers = RunStore::open(&fork.from)?.markers().await?;
    for name in config.policies.keys() {
        let source = fork_source(&source_policies(&markers, fork.iteration), name);
        checkpoints::find(&markers, &source, fork.iteration).map_err(|e| fork_error(fork, e))?;
    }
    Ok(())
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

fn fork_error(fork: &ForkConfig, source: checkpoints::Error) -> Error {
    Error::Fork { from: fork.from.clone(), iteration: fork.iteration, source: Box::new(source) }
}

/// Commits the source run's version K of every policy as this run's version K. Every
/// checkpoint is found and verified before anything is written. A full model forked
/// into a policy with `lora` becomes the frozen base of a new adapter (L1 from a shared
/// warm start).
async fn initialise_from(store: &RunStore, config: &RunConfig, fork: &ForkConfig) -> Result<CommitMarker, Error> {
    let k = fork.iteration;
    let source = RunStore::open(&fork.from)?;
    let markers = source.markers().await?;
    let source_names = source_policies(&markers, k);
    let mut fetched = Vec::new();
    for name in config.policies.keys() {
        let from = fork_source(&source_names, name);
        let one = checkpoints::fetch(&source, &markers, &from, k).await.map_err(|e| fork_error(fork, e))?;
        fetched.push(checkpoints::Fetched { name: name.clone(), ..one });
    }
    let mut writer = store.begin(StageId::run_level(Stage::Update));
    let mut saved = Vec::new();
    for fetched in fetched {
        let policy_config = &config.policies[&fetched.name];
        let loaded = match (&fetched.base, &policy_config.lora) {
            (Some((_, dir)), _) => {
                let base = Some(checkpoints::save_base(&mut writer, &fetched.name, dir).await?);
                LoadedPolicy { base, ..checkpoints::open(config, fetched)? }
            }
            (None, Some(lora)) => {
                let name = fetched.name.clone();
                let base = checkpoints::save_base(&mut writer, &name, &fetched.dir).await?;
                let mut policy = Policy::load(&fetched.dir, &load_options(policy_config))?;
                policy.add_adapter(&name, lora, stream(&[config.seed, LORA_KEY, name_key(&name)]))?;
                LoadedPolicy { name, version: k, weights_sha256: String::new(), policy, base: Some(base) }
            }
            (None, None) => checkpoints::open(config, fetched)?,
        };
        saved.push(checkpoints::save(&mut writer, &loaded, k).await?);
    }
    let info = CommitInfo { checkpoints: saved, ..super::run_info(config) };
    Ok(writer.finish().commit(info).await?)
}

/// A model from its config.json alone, with the tokenizer prepare-data committed.
async fn scratch_policy(
    store: &RunStore,
    config: &RunConfig,
    name: &str,
    policy_config: &PolicyConfig,
    prepared: &StoredMarker,
) -> Result<Policy, Error> {
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
    let local = checkpoints::materialise(store, &prepared.marker.files, dir).await?;
    let model_config = ModelConfig::from_dir(&policy_config.model)?;
    let seed = stream(&[config.seed, INIT_KEY, name_key(name)]);
    let mut policy = Policy::scratch(model_config, seed, &load_options(policy_config))?;
    policy.attach_tokenizer_files(&local)?;
    Ok(policy)
}

/// (prompt ids, response ids) of one demonstration.
type Example = (Vec<i64>, Vec<i64>);

/// (prompt ids, response ids) of the demonstrations of the agents `name` plays: the
/// user message rendered with the chat template (generation prompt, no thinking) and
/// the reply followed by EOS. Prompts are cut from the left as rollout cuts them.
fn sft_examples(
    policy: &Policy,
    config: &RunConfig,
    name: &str,
    demos: &[DemonstrationRow],
) -> Result<Vec<Example>, Error> {
    let agents: HashSet<&str> =
        config.agents.iter().filter(|(_, a)| a.policy == name).map(|(role, _)| role.as_str()).collect();
    let eos = *policy.config().eos_token_ids.first().ok_or_else(|| Error::Init {
        policy: name.to_string(),
        reason: "config.json has no eos_token_id to end the demonstrations with".into(),
    })?;
    let max_prompt = config.rollout.max_prompt_tokens as usize;
    let mut examples = Vec::new();
    for demo in demos.iter().filter(|d| agents.contains(d.agent.as_str())) {
        let (_, prompt) = super::responder::agent_prompt(policy, &demo.prompt, max_prompt)?;
        let mut response = policy.require_tokenizer()?.encode(&demo.response, false)?;
        response.push(eos);
        examples.push((prompt, response));
    }
    if examples.is_empty() {
        return Err(Error::Init {
            policy: name.to_string(),
            reason: format!("warm_start is set but prepare-data committed no demonstrations for its agents {agents:?}"),
        });
    }
    Ok(examples)
}

struct SftSettings<'a> {
    warm: &'a WarmStartConfig,
    grad_clip: f64,
    seed: u64,
}

/// Supervised warm start: `steps` AdamW steps of `batch_size` examples (seeded shuffles,
/// cycling), token-mean cross-entropy on the response tokens.
fn train_sft(
    policy: &mut Policy,
    name: &str,
    examples: &[Example],
    settings: &SftSettings,
    update: &crate::config::UpdateConfig,
    progress: &dyn Progress,
) -> Result<Vec<UpdateRow>, Error> {
    let warm = settings.warm;
    let (steps, batch) = (warm.steps as usize, warm.batch_size as usize);
    let mut order = Vec::with_capacity(steps * batch);
    for cycle in 0.. {
        if order.len() >= steps * batch {
            break;
        }
        order.extend(shuffled(examples.len(), stream(&[settings.seed, cycle])));
    }
    let requests: Vec<ScoreRequest> = examples
        .iter()
        .map(|(p, r)| ScoreRequest { prompt_ids: p.clone(), response_ids: r.clone(), adapter: None })
        .collect();
    let (mut optimizer, variables) = optimizer(policy, None, &warm.optimizer)?;
    let mut rows = Vec::with_capacity(steps);
    for step in 0..steps {
        let start = Instant::now();
        let chosen: Vec<ScoreRequest> =
            order[step * batch..(step + 1) * batch].iter().map(|&i| requests[i].clone()).collect();
        let tokens: usize = chosen.iter().map(|r| r.response_ids.len()).sum();
        optimizer.zero_grad();
        let logprobs = policy.backward(
            &chosen,
            update.micro_batch_tokens as usize,
            update.gradient_checkpointing,
            stream(&[settings.seed, SFT_KEY, step as u64]),
            &mut |mb| Ok(-(&mb.logprobs * &mb.mask).sum(Kind::Float) / tokens as f64),
        )?;
        let grad_norm = clip_grad_norm(&variables, settings.grad_clip);
        let lr = learning_rate(&warm.optimizer, step as u64, steps as u64);
        optimizer.set_lr(lr);
        optimizer.step();
        let nll = -logprobs.iter().flatten().map(|&x| f64::from(x)).sum::<f64>() / tokens.max(1) as f64;
        rows.push(UpdateRow {
            policy: name.to_string(),
            mode: "sft".into(),
            version_from: 0,
            version_to: 0,
            step: step as u32,
            loss: nll,
            clip_fraction: 0.0,
            ratio_mean: 1.0,
            ratio_max: 1.0,
            logprob_drift_mean: 0.0,
            logprob_drift_max: 0.0,
            approx_kl: 0.0,
            grad_norm,
            entropy: 0.0,
            tokens: tokens as u64,
            sequences: chosen.len() as u32,
            learning_rate: lr,
            seconds: start.elapsed().as_secs_f64(),
        });
        progress.advance(1, tokens as u64);
    }
    Ok(rows)
}

// ───────────────────────────── iteration k: PPO-clip ─────────────────────────────

/// One candidate to train on.
#[derive(Debug, Clone, PartialEq)]
struct Sequence {
    candidate_id: String,
    prompt: Vec<i64>,
    response: Vec<i64>,
    /// Logprobs the rollout sampled the response with.
    sampled: Vec<f32>,
    advantage: f64,
}

/// What one policy trains on, once every check has passed.
#[derive(Debug)]
struct PolicyPlan {
    name: String,
    current: PolicyRef,
    sequences: Vec<Sequence>,
}

/// Trains every policy of the run on its own samples of iteration `iteration` and
/// commits v(iteration+1) of each, with the `updates` table, in one marker.
pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    progress: &dyn Progress,
) -> Result<CommitMarker, Error> {
    let stage = StageId::at(Stage::Update, iteration);
    let rollout = inputs(store, stage, Stage::Rollout, iteration).await?;
    let advantage = inputs(store, stage, Stage::Advantage, iteration).await?;
    check_parts(&rollout, iteration)?;
    check_samples_come_from(&advantage, &rollout, iteration)?;
    let markers = store.markers().await?;
    let rollout_markers: Vec<&CommitMarker> = rollout.iter().map(|m| &m.marker).collect();
    let advantage_markers: Vec<&CommitMarker> = advantage.iter().map(|m| &m.marker).collect();
    // read_rows checks every part's size and sha256 against its marker.
    let turns: Vec<TurnRow> = store.read_rows(&rollout_markers).await?;
    let samples: Vec<SampleRow> = store.read_rows(&advantage_markers).await?;
    let plans = plan(config, &markers, &rollout, &turns, &samples, iteration)?;
    drop((turns, samples));

    // Every checkpoint is verified before anything is written; the models are then
    // loaded one at a time, so memory holds one policy.
    let mut read: Vec<InputRef> = rollout.iter().chain(&advantage).map(StoredMarker::input_ref).collect();
    let mut fetched = Vec::with_capacity(plans.len());
    for plan in &plans {
        let (source, _) = checkpoints::find(&markers, &plan.name, plan.current.version)?;
        if !read.contains(&source.input_ref()) {
            read.push(source.input_ref());
        }
        fetched.push(checkpoints::fetch(store, &markers, &plan.name, plan.current.version).await?);
    }
    let mut writer = store.begin(stage);
    let (mut rows, mut saved, mut used) = (Vec::new(), Vec::new(), Vec::new());
    let mut model_seconds = 0.0;
    for (plan, fetched) in plans.into_iter().zip(fetched) {
        let mut loaded = checkpoints::open(config, fetched)?;
        let settings = PpoSettings::new(config, &plan.name, iteration);
        let adapter = loaded.adapter().map(str::to_owned);
        let started = Instant::now();
        let (label, steps) = (format!("{stage} {}", plan.name), settings.steps(plan.sequences.len()));
        rows.extend(phase(progress, &label, steps, "steps", || {
            train_ppo(&mut loaded.policy, adapter.as_deref(), &plan, &settings, progress)
        })?);
        model_seconds += started.elapsed().as_secs_f64();
        saved.push(checkpoints::save(&mut writer, &loaded, iteration + 1).await?);
        used.push(plan.current);
    }
    if !rows.is_empty() {
        writer.write_table(Table::Updates, Partition::Iteration(iteration), &[tables::to_batch(&rows)?]).await?;
    }
    let info =
        CommitInfo { inputs: read, policies_used: used, checkpoints: saved, model_seconds, ..super::run_info(config) };
    Ok(writer.finish().commit(info).await?)
}

/// Every turns part the rollout names must be one of this iteration.
fn check_parts(rollout: &[StoredMarker], iteration: u32) -> Result<(), Error> {
    let prefix = format!("{}/iteration={iteration}/", Table::Turns);
    for m in rollout {
        if let Some(f) = m.marker.files_of(Table::Turns).find(|f| !f.path.starts_with(&prefix)) {
            return Err(Error::ForeignPart { iteration, marker: m.path.clone(), path: f.path.clone() });
        }
    }
    Ok(())
}

/// The advantage stage must have read exactly the committed rollout.
fn check_samples_come_from(advantage: &[StoredMarker], rollout: &[StoredMarker], iteration: u32) -> Result<(), Error> {
    for a in advantage {
        if let Some(r) = rollout.iter().find(|r| !a.marker.inputs.contains(&r.input_ref())) {
            return Err(Error::StaleSamples { iteration, advantage: a.path.clone(), rollout: r.path.clone() });
        }
    }
    Ok(())
}

/// The strict on-policy checks (DESIGN §3), then each policy's sequences, in
/// candidate order. Every policy of the config gets a plan, with or without samples.
fn plan(
    config: &RunConfig,
    markers: &[StoredMarker],
    rollout: &[StoredMarker],
    turns: &[TurnRow],
    samples: &[SampleRow],
    iteration: u32,
) -> Result<Vec<PolicyPlan>, Error> {
    let mut current: HashMap<&str, PolicyRef> = HashMap::new();
    for name in config.policies.keys() {
        let latest = checkpoints::latest_in(markers, name).ok_or(Error::NoCheckpoint { policy: name.clone() })?;
        if latest.version != iteration {
            return Err(Error::NotAligned { policy: name.clone(), iteration, latest: latest.version });
        }
        check_rollout_weights(rollout, &latest, iteration)?;
        current.insert(name, latest);
    }
    let by_id = check_turns(&current, rollout, turns, iteration)?;
    let mut sequences: HashMap<&str, Vec<Sequence>> = HashMap::new();
    for sample in samples {
        let expected = current_version(&current, Table::Samples, &sample.candidate_id, &sample.policy)?;
        check_version(
            Table::Samples,
            &sample.candidate_id,
            &sample.policy,
            sample.policy_version,
            expected,
            iteration,
        )?;
        let turn = by_id
            .get(sample.candidate_id.as_str())
            .ok_or_else(|| Error::MissingTurn { iteration, candidate_id: sample.candidate_id.clone() })?;
        if let Some(sequence) = sequence_of(sample, turn)? {
            sequences.entry(expected.policy.as_str()).or_default().push(sequence);
        }
    }
    Ok(config
        .policies
        .keys()
        .map(|name| {
            let mut seqs = sequences.remove(name.as_str()).unwrap_or_default();
            seqs.sort_by(|a, b| a.candidate_id.cmp(&b.candidate_id));
            PolicyPlan { name: name.clone(), current: current[name.as_str()].clone(), sequences: seqs }
        })
        .collect())
}

/// The rollout's record of the weights it sampled `latest.policy` with must be `latest`.
fn check_rollout_weights(rollout: &[StoredMarker], latest: &PolicyRef, iteration: u32) -> Result<(), Error> {
    for m in rollout {
        for used in m.marker.policies_used.iter().filter(|u| u.policy == latest.policy) {
            if used != latest {
                return Err(Error::WeightsMismatch {
                    policy: latest.policy.clone(),
                    iteration,
                    marker: m.path.clone(),
                    rollout_version: used.version,
                    rollout_sha256: used.weights_sha256.clone(),
                    version: latest.version,
                    checkpoint_sha256: latest.weights_sha256.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The latest version of the policy a row of `table` names; one of the run's policies.
fn current_version<'c>(
    current: &'c HashMap<&str, PolicyRef>,
    table: Table,
    candidate_id: &str,
    policy: &str,
) -> Result<&'c PolicyRef, Error> {
    current.get(policy).ok_or_else(|| Error::UnknownPolicy {
        table,
        candidate_id: candidate_id.to_string(),
        policy: policy.to_string(),
    })
}

/// Every turns row: a known policy the rollout recorded, sampled by its latest version.
fn check_turns<'t>(
    current: &HashMap<&str, PolicyRef>,
    rollout: &[StoredMarker],
    turns: &'t [TurnRow],
    iteration: u32,
) -> Result<HashMap<&'t str, &'t TurnRow>, Error> {
    let recorded: HashSet<&str> =
        rollout.iter().flat_map(|m| &m.marker.policies_used).map(|p| p.policy.as_str()).collect();
    let mut by_id = HashMap::with_capacity(turns.len());
    for turn in turns {
        let expected = current_version(current, Table::Turns, &turn.candidate_id, &turn.policy)?;
        if !recorded.contains(turn.policy.as_str()) {
            return Err(Error::UnrecordedPolicy { policy: turn.policy.clone(), iteration });
        }
        check_version(Table::Turns, &turn.candidate_id, &turn.policy, turn.policy_version, expected, iteration)?;
        by_id.insert(turn.candidate_id.as_str(), turn);
    }
    Ok(by_id)
}

fn check_version(
    table: Table,
    candidate_id: &str,
    policy: &str,
    found: u32,
    expected: &PolicyRef,
    iteration: u32,
) -> Result<(), Error> {
    if found == expected.version {
        return Ok(());
    }
    Err(Error::RowVersion {
        policy: policy.to_string(),
        iteration,
        table,
        candidate_id: candidate_id.to_string(),
        found,
        expected: expected.version,
    })
}

/// The sequence a sample trains on; None when its response is empty (nothing to train).
fn sequence_of(sample: &SampleRow, turn: &TurnRow) -> Result<Option<Sequence>, Error> {
    let bad = |reason: String| Error::BadRow { candidate_id: sample.candidate_id.clone(), reason };
    if turn.policy != sample.policy {
        return Err(bad(format!(
            "samples routes it to {:?}, but turns says {:?} sampled it",
            sample.policy, turn.policy
        )));
    }
    if turn.response_tokens.len() != turn.response_logprobs.len() {
        return Err(bad(format!(
            "{} response tokens but {} logprobs",
            turn.response_tokens.len(),
            turn.response_logprobs.len()
        )));
    }
    if turn.prompt_tokens.is_empty() {
        return Err(bad("the prompt has no tokens".into()));
    }
    if turn.response_tokens.is_empty() {
        return Ok(None);
    }
    Ok(Some(Sequence {
        candidate_id: sample.candidate_id.clone(),
        prompt: turn.prompt_tokens.iter().map(|&t| i64::from(t)).collect(),
        response: turn.response_tokens.iter().map(|&t| i64::from(t)).collect(),
        sampled: turn.response_logprobs.clone(),
        advantage: sample.advantage,
    }))
}

/// What a PPO update of one policy runs with.
struct PpoSettings {
    name: String,
    iteration: u32,
    iterations: u32,
    epochs: u32,
    mini_batch: usize,
    micro_batch_tokens: usize,
    gradient_checkpointing: bool,
    grad_clip: f64,
    clip_epsilon: f64,
    aggregation: Aggregation,
    max_drift: f64,
    optimizer: OptimizerConfig,
    seed: u64,
}

impl PpoSettings {
    fn new(config: &RunConfig, name: &str, iteration: u32) -> PpoSettings {
        let update = &config.update;
        let aggregation = match config.algorithm.name {
            // Dr.GRPO: sum over each response, divided by a constant (the longest possible).
            Algorithm::DrGrpo => {
                Aggregation::SequenceSum { normaliser: f64::from(config.rollout.sampling.max_new_tokens.max(1)) }
            }
            _ => Aggregation::TokenMean,
        };
        PpoSettings {
            name: name.to_string(),
            iteration,
            iterations: config.iterations,
            epochs: update.epochs,
            mini_batch: update.mini_batch_sequences.max(1) as usize,
            micro_batch_tokens: update.micro_batch_tokens as usize,
            gradient_checkpointing: update.gradient_checkpointing,
            grad_clip: update.grad_clip,
            clip_epsilon: config.algorithm.clip_epsilon,
            aggregation,
            max_drift: update.max_logprob_drift,
            optimizer: config.policies[name].optimizer.clone(),
            seed: stream(&[config.seed, PPO_KEY, u64::from(iteration), name_key(name)]),
        }
    }

    /// Optimiser steps over `sequences` samples: every epoch in mini-batches.
    fn steps(&self, sequences: usize) -> u64 {
        sequences.div_ceil(self.mini_batch) as u64 * u64::from(self.epochs)
    }
}

/// Recomputes the logprobs (drift check), then runs the PPO-clip steps; one row per step.
fn train_ppo(
    policy: &mut Policy,
    adapter: Option<&str>,
    plan: &PolicyPlan,
    settings: &PpoSettings,
    progress: &dyn Progress,
) -> Result<Vec<UpdateRow>, Error> {
    let sequences = &plan.sequences;
    if sequences.is_empty() {
        return Ok(Vec::new());
    }
    let requests: Vec<ScoreRequest> = sequences
        .iter()
        .map(|s| ScoreRequest {
            prompt_ids: s.prompt.clone(),
            response_ids: s.response.clone(),
            adapter: adapter.map(str::to_owned),
        })
        .collect();
    let old = policy.score(&requests, settings.micro_batch_tokens)?;
    let drift: Vec<Vec<f64>> = old
        .iter()
        .zip(sequences)
        .map(|(o, s)| o.iter().zip(&s.sampled).map(|(a, b)| f64::from((a - b).abs())).collect())
        .collect();
    let (mean, max) = mean_max(drift.iter().flatten().copied());
    if mean > settings.max_drift {
        return Err(Error::Drift {
            policy: plan.name.clone(),
            version: plan.current.version,
            mean,
            max,
            limit: settings.max_drift,
        });
    }
    let (mut optimizer, variables) = optimizer(policy, adapter, &settings.optimizer)?;
    let steps_per_iteration = settings.steps(sequences.len());
    let device = policy.device();
    let mut rows = Vec::new();
    for epoch in 0..settings.epochs {
        let order = shuffled(sequences.len(), stream(&[settings.seed, u64::from(epoch)]));
        for chunk in order.chunks(settings.mini_batch) {
            let start = Instant::now();
            let step = rows.len() as u64;
            let batch: Vec<ScoreRequest> = chunk.iter().map(|&i| requests[i].clone()).collect();
            let tokens: usize = chunk.iter().map(|&i| sequences[i].response.len()).sum();
            let weight = token_weight(settings.aggregation, tokens, chunk.len());
            optimizer.zero_grad();
            let new = policy.backward(
                &batch,
                settings.micro_batch_tokens,
                settings.gradient_checkpointing,
                stream(&[settings.seed, PPO_KEY, step]),
                &mut |mb| {
                    let rows_of = |i: usize| chunk[i];
                    let old_t = padded(mb.indices.iter().map(|&i| &old[rows_of(i)]), &mb.logprobs, device);
                    let adv: Vec<f32> = mb.indices.iter().map(|&i| sequences[rows_of(i)].advantage as f32).collect();
                    let adv_t = Tensor::from_slice(&adv).view([-1, 1]).to_device(device);
                    Ok(ppo_clip_tensor(&mb.logprobs, &old_t, &adv_t, &mb.mask, settings.clip_epsilon) * weight)
                },
            )?;
            let grad_norm = clip_grad_norm(&variables, settings.grad_clip);
            let global = u64::from(settings.iteration) * steps_per_iteration + step;
            let lr = learning_rate(&settings.optimizer, global, u64::from(settings.iterations) * steps_per_iteration);
            optimizer.set_lr(lr);
            optimizer.step();
            rows.push(step_row(settings, plan, chunk, &new, &old, &drift, StepFacts { step, grad_norm, lr, start }));
            progress.advance(1, tokens as u64);
        }
    }
    Ok(rows)
}

struct StepFacts {
    step: u64,
    grad_norm: f64,
    lr: f64,
    start: Instant,
}

/// The `updates` row of one step: the PPO terms by `algo::loss` on the logprobs the
/// step's forward computed (before the step), with the pre-update drift and entropy.
fn step_row(
    settings: &PpoSettings,
    plan: &PolicyPlan,
    chunk: &[usize],
    new: &[Vec<f32>],
    old: &[Vec<f32>],
    drift: &[Vec<f64>],
    facts: StepFacts,
) -> UpdateRow {
    let pairs: Vec<Vec<(f64, f64)>> = chunk
        .iter()
        .enumerate()
        .map(|(row, &i)| new[row].iter().zip(&old[i]).map(|(&n, &o)| (f64::from(n), f64::from(o))).collect())
        .collect();
    let sequences: Vec<(&[(f64, f64)], f64)> =
        pairs.iter().zip(chunk).map(|(p, &i)| (p.as_slice(), plan.sequences[i].advantage)).collect();
    let summary = ppo_clip_loss(&sequences, settings.clip_epsilon, settings.aggregation);
    let (drift_mean, drift_max) = mean_max(chunk.iter().flat_map(|&i| drift[i].iter().copied()));
    let (entropy, _) = mean_max(chunk.iter().flat_map(|&i| old[i].iter().map(|&x| -f64::from(x))));
    UpdateRow {
        policy: settings.name.clone(),
        mode: "ppo".into(),
        version_from: plan.current.version,
        version_to: plan.current.version + 1,
        step: facts.step as u32,
        loss: summary.loss,
        clip_fraction: summary.clip_fraction,
        ratio_mean: summary.ratio_mean,
        ratio_max: summary.ratio_max,
        logprob_drift_mean: drift_mean,
        logprob_drift_max: drift_max,
        approx_kl: summary.approx_kl,
        grad_norm: facts.grad_norm,
        entropy,
        tokens: summary.tokens as u64,
        sequences: chunk.len() as u32,
        learning_rate: facts.lr,
        seconds: facts.start.elapsed().as_secs_f64(),
    }
}

/// Values of `rows` right-padded with zeros to the (b, T) shape of `like`.
fn padded<'a>(rows: impl Iterator<Item = &'a Vec<f32>>, like: &Tensor, device: tch::Device) -> Tensor {
    let (b, t) = like.size2().expect("(b, T) logprobs");
    let mut flat = vec![0f32; (b * t) as usize];
    for (r, values) in rows.enumerate() {
        flat[r * t as usize..r * t as usize + values.len()].copy_from_slice(values);
    }
    Tensor::from_slice(&flat).view([b, t]).to_device(device)
}

// ───────────────────────────── pieces with their own tests ─────────────────────────────

/// `algo::loss::ppo_clip_token` on tensors, summed over the real tokens: logp, old and
/// mask are (b, T), advantage is (b, 1), broadcast to every token.
fn ppo_clip_tensor(logp: &Tensor, old: &Tensor, advantage: &Tensor, mask: &Tensor, clip_epsilon: f64) -> Tensor {
    let ratio = (logp - old).exp();
    let pg_loss1 = -advantage * &ratio;
    let pg_loss2 = -advantage * ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon);
    (pg_loss1.maximum(&pg_loss2) * mask).sum(Kind::Float)
}

/// The factor turning a mini-batch's summed token losses into its loss: 1/tokens for
/// the token mean, 1/(normaliser · sequences) for the sequence sum of Dr.GRPO.
fn token_weight(aggregation: Aggregation, tokens: usize, sequences: usize) -> f64 {
    match aggregation {
        Aggregation::TokenMean => 1.0 / tokens.max(1) as f64,
        Aggregation::SequenceSum { normaliser } => 1.0 / (normaliser * sequences.max(1) as f64),
    }
}

/// The learning rate of optimiser step `step` (from 0) of `total`: linear warm-up to
/// `lr` over `warmup_steps`, then constant or cosine decay to 0 at `total`.
fn learning_rate(optimizer: &OptimizerConfig, step: u64, total: u64) -> f64 {
    let warmup = u64::from(optimizer.warmup_steps);
    if step < warmup {
        return optimizer.lr * (step + 1) as f64 / warmup as f64;
    }
    match optimizer.schedule {
        Schedule::Constant => optimizer.lr,
        Schedule::Cosine => {
            let progress = ((step - warmup) as f64 / total.saturating_sub(warmup).max(1) as f64).min(1.0);
            optimizer.lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// 0..n in an order that depends only on `seed` (Fisher–Yates with splitmix64).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64::new(seed);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

/// (mean, max) of the values; (0, 0) when there are none.
fn mean_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut sum, mut max, mut n) = (0.0, 0.0f64, 0usize);
    for v in values {
        sum += v;
        max = max.max(v);
        n += 1;
    }
    if n == 0 { (0.0, 0.0) } else { (sum / n as f64, max) }
}

/// AdamW over the trainable variables: the adapter's for LoRA, else the whole model's.
fn optimizer(
    policy: &Policy,
    adapter: Option<&str>,
    config: &OptimizerConfig,
) -> Result<(tch::nn::Optimizer, Vec<Tensor>), Error> {
    use tch::nn::OptimizerConfig as _;
    let vs = match adapter {
        Some(name) => policy.adapter_var_store(name)?,
        None => policy.var_store(),
    };
    let adamw = tch::nn::AdamW {
        beta1: config.betas[0],
        beta2: config.betas[1],
        wd: config.weight_decay,
        eps: config.eps,
        amsgrad: false,
    };
    let optimizer = adamw.build(vs, config.lr).map_err(|source| Error::Torch { context: "AdamW", source })?;
    Ok((optimizer, vs.trainable_variables()))
}

/// Scales the gradients so their global L2 norm is at most `max_norm` (as torch's
/// `clip_grad_norm_`); returns the norm before clipping.
fn clip_grad_norm(variables: &[Tensor], max_norm: f64) -> f64 {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = variables.iter().map(Tensor::grad).filter(Tensor::defined).collect();
        if grads.is_empty() {
            return 0.0;
        }
        let squares: Vec<Tensor> = grads.iter().map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double)).collect();
        let norm = Tensor::stack(&squares, 0).sum(Kind::Double).sqrt().double_value(&[]);
        let coefficient = max_norm / (norm + 1e-6);
        if coefficient < 1.0 {
            for mut g in grads {
                let _ = g.g_mul_scalar_(coefficient);
            }
        }
        norm
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OptimizerConfig;

    #[test]
    fn a_fork_takes_the_policy_of_the_same_name_or_the_only_one() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(fork_source(&names(&["shared"]), "tool"), "shared");
        assert_eq!(fork_source(&names(&["shared"]), "shared"), "shared");
        assert_eq!(fork_source(&names(&["planner", "tool"]), "tool"), "tool");
        // No match among several: the name itself, which the lookup then reports missing.
        assert_eq!(fork_source(&names(&["a", "b"]), "tool"), "tool");
    }

    #[test]
    fn the_tensor_loss_equals_the_pure_function() {
        // Two sequences of 3 and 1 tokens, ratios on both sides of the clip range.
        let new = [[-1.0f32, -0.5, -2.0], [-0.3, 0.0, 0.0]];
        let old = [[-1.3f32, -0.5, -1.0], [-0.2, 0.0, 0.0]];
        let lens = [3usize, 1];
        let adv = [1.5f64, -0.7];
        let t = |v: &[[f32; 3]; 2]| Tensor::from_slice(&v.concat()).view([2, 3]);
        let mask = Tensor::from_slice(&[1f32, 1., 1., 1., 0., 0.]).view([2, 3]);
        let adv_t = Tensor::from_slice(&[adv[0] as f32, adv[1] as f32]).view([2, 1]);
        let pairs: Vec<Vec<(f64, f64)>> =
            (0..2).map(|r| (0..lens[r]).map(|j| (f64::from(new[r][j]), f64::from(old[r][j]))).collect()).collect();
        let seqs: Vec<(&[(f64, f64)], f64)> = pairs.iter().zip(adv).map(|(p, a)| (p.as_slice(), a)).collect();
        for aggregation in [Aggregation::TokenMean, Aggregation::SequenceSum { normaliser: 5.0 }] {
            let expected = ppo_clip_loss(&seqs, 0.2, aggregation);
            let sum = ppo_clip_tensor(&t(&new), &t(&old), &adv_t, &mask, 0.2);
            let got = sum.double_value(&[]) * token_weight(aggregation, 4, 2);
            assert!((got - expected.loss).abs() < 1e-6, "{aggregation:?}: {got} vs {}", expected.loss);
        }
        // And by hand for the token mean: ratios e^0.3, 1, e^-1 (A = 1.5), e^-0.1 (A = -0.7).
        let by_hand = (-1.5 * 1.2 - 1.5 - 1.5 * (-1.0f64).exp() + 0.7 * (-0.1f64).exp()) / 4.0;
        let expected = ppo_clip_loss(&seqs, 0.2, Aggregation::TokenMean).loss;
        assert!((by_hand - expected).abs() < 1e-6, "{by_hand} vs {expected}");
    }

    #[test]
    fn learning_rate_warms_up_then_follows_the_schedule() {
        let cosine = OptimizerConfig { lr: 1.0, warmup_steps: 4, schedule: Schedule::Cosine, ..Default::default() };
        let lrs: Vec<f64> = (0..9).map(|s| learning_rate(&cosine, s, 8)).collect();
        let expected = [0.25, 0.5, 0.75, 1.0, 1.0, 0.8535533905932737, 0.5, 0.14644660940672624, 0.0];
        for (got, want) in lrs.iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{lrs:?}");
        }
        let constant = OptimizerConfig { lr: 0.5, ..Default::default() };
        assert_eq!((learning_rate(&constant, 0, 10), learning_rate(&constant, 99, 10)), (0.5, 0.5));
    }

    #[test]
    fn shuffles_are_permutations_fixed_by_their_seed() {
        let a = shuffled(50, 7);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_eq!(a, shuffled(50, 7));
        assert_ne!(a, shuffled(50, 8));
        assert_ne!(a, sorted);
    }

    #[test]
    fn gradient_clipping_scales_to_the_limit_and_reports_the_norm() {
        let a = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        // Gradients (3, 0) and (4): global norm 5.
        let loss = (&a * Tensor::from_slice(&[3f32, 0.])).sum(Kind::Float) + (&b * 4.0).sum(Kind::Float);
        loss.backward();
        let norm = clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 1.0);
        assert!((norm - 5.0).abs() < 1e-9);
        let clipped = Vec::<f32>::try_from(a.grad()).unwrap();
        assert!((clipped[0] - 0.6).abs() < 1e-5 && (b.grad().double_value(&[0]) - 0.8).abs() < 1e-5);
        // Under the limit nothing changes.
        assert!((clip_grad_norm(&[a.shallow_clone(), b.shallow_clone()], 10.0) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn drift_statistics_are_mean_and_max() {
        let (mean, max) = mean_max([0.5, 0.1, 0.3].into_iter());
        assert!((mean - 0.3).abs() < 1e-12 && max == 0.5);
        assert_eq!(mean_max(std::iter::empty()), (0.0, 0.0));
    }
}
