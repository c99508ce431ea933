//! update: trains each policy on its own samples and commits its next version.
//!
//! ```text
//!  run-level  initialise ──► _commits/update.json            v0 of every policy
//!             (initialise.rs; the SFT warm start of scratch policies in warm_start.rs)
//!
//!  iteration k  run ──► _commits/iteration=k/update.json     v(k+1) of every policy
//!    1. checks, before anything is written (checks.rs, strict on-policy, DESIGN §3):
//!       latest committed version of each policy == k; the rollout marker's PolicyRef
//!       (version, weights sha256) == that checkpoint; every turns part the rollout
//!       names is under turns/iteration=k/; every turns and samples row carries v_k;
//!       the samples were computed from this rollout
//!    2. per policy (ppo.rs; its own samples only, joined to turns by candidate_id), with only
//!       its model in memory (another role's full model is dropped first and reloaded,
//!       checked against its marker, when its turn comes):
//!       recompute the response logprobs with the loaded weights (the first
//!       mini-batch's by its own training forward), PPO-clip steps, and after the
//!       first, the drift check (mean drift vs sampled > update.max_logprob_drift is
//!       an error)
//!       (a failure here, e.g. drift, may leave the earlier policies' new files as
//!       orphans for `petting gc`; the checks of step 1 and every checkpoint's hashes
//!       come before the first write)
//!    3. one marker: the checkpoints v(k+1), the updates table, the versions used
//! ```
//!
//! With ranks (`Session::ranks`: `--ranks N`, torchrun, srun; crate::ranks), every rank
//! makes the same checks and training sets, trains its shard of each mini-batch with
//! the gradients summed over all (data_parallel.rs, ppo.rs), and the ranks compare their
//! new weights; only then does rank 0 write and commit, and the others return its
//! marker. A rank that fails fails the others at their next collective: nothing is
//! committed.
//!
//! The recomputed logprobs are the PPO "old" logprobs: on-policy they equal the sampled
//! ones up to numerics (bf16 sampling vs f32 training, batching), and using them makes
//! the first step's ratio exactly 1. Sample order is a seeded shuffle keyed by (run
//! seed, iteration, policy, epoch), so a rerun on CPU writes the same weights bit for bit.
//!
//! The optimiser continues across iterations: its state (float32 moments and master
//! weights, the step count) is saved with every checkpoint version and loaded with it, so
//! a resumed run or a fork continues the very same optimisation. The learning-rate
//! schedule is placed on a run-wide axis of the steps actually taken (the optimiser
//! state's count), assuming every later iteration takes as many as this one.
//!
//! A step whose loss or gradient norm is not finite is not taken (`updates.skipped`); an
//! update that takes none, or whose weights end non-finite, fails naming the policy and
//! the knobs that help, before anything is written.
//!
//! `updates.entropy` is the mean of −log π(token) over the mini-batch's sampled tokens
//! under the pre-step weights: the token entropy in expectation when the rollout sampled
//! at temperature 1 without top-p/top-k (a cross-entropy otherwise); full-vocabulary
//! entropy would need the (N, V) logits the training forward avoids. SFT rows record 0.

mod checks;
mod critic_fit;
mod data_parallel;
mod error;
mod initialise;
mod memory;
mod ppo;
mod warm_critic;
mod warm_start;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::config::RunConfig;
use crate::critic::{CRITIC_DIR, CriticConfig, Critics};
use crate::model::{AdamWState, LanguageModel};
use crate::policies::{self, LoadedPolicies};
use crate::progress::{Progress, phase};
use crate::ranks::Ranks;
use crate::schema::Table;
use serde::{Deserialize, Serialize};

use crate::store::{
    CheckpointRef, CommitInfo, CommitMarker, FileEntry, InputRef, Partition, PolicyRef, RunStore, Stage, StageId,
    StageWriter, StoredMarker,
};
use crate::tables::{self, LogprobGapRow, SampleRow, TurnRow, UpdateRow};

use super::{Session, inputs};
use checks::TrainingSet;
pub use error::Error;
pub use initialise::{check_fork, initialise};
use memory::memory_knob;
use ppo::{PpoSettings, Trained, train_ppo};

/// Trains every policy of the run on its own samples of iteration `iteration` and
/// commits v(iteration+1) of each, with the `updates` table, in one marker.
pub async fn run(
    store: &RunStore,
    config: &RunConfig,
    iteration: u32,
    progress: &dyn Progress,
    session: &Session,
) -> Result<CommitMarker, super::Error> {
    let stage = StageId::at(Stage::Update, iteration);
    let rollout = inputs(store, stage, Stage::Rollout, iteration).await?;
    let advantage = inputs(store, stage, Stage::Advantage, iteration).await?;
    checks::check_parts(&rollout, iteration)?;
    checks::check_samples_come_from(&advantage, &rollout, iteration)?;
    let markers = store.markers().await?;
    let rollout_markers: Vec<&CommitMarker> = rollout.iter().map(|m| &m.marker).collect();
    let advantage_markers: Vec<&CommitMarker> = advantage.iter().map(|m| &m.marker).collect();
    // read_rows checks every part's size and sha256 against its marker.
    let turns: Vec<TurnRow> = store.read_rows(&rollout_markers).await?;
    let samples: Vec<SampleRow> = store.read_rows(&advantage_markers).await?;
    let staleness = config.rollout.max_staleness;
    let sets = checks::training_sets(&config.policies, &markers, &rollout, &turns, &samples, iteration, staleness)?;
    let critic = config.critic.as_ref().filter(|_| config.algorithm.name.needs_critic());
    let critic_inputs = critic.map(|c| crate::critic::inputs(&turns, c));
    drop((turns, samples));

    // Every checkpoint is verified (or the resident one matches its marker) before
    // anything is written.
    let mut read: Vec<InputRef> = rollout.iter().chain(&advantage).map(StoredMarker::input_ref).collect();
    let mut optimizers = Vec::with_capacity(sets.len());
    let mut critic_parts = Vec::with_capacity(sets.len());
    for set in &sets {
        let (source, _) = policies::find(&markers, &set.name, set.current.version)?;
        if !read.contains(&source.input_ref()) {
            read.push(source.input_ref());
        }
        optimizers.push(policies::optimizer_file(store, &markers, &set.name, set.current.version).await?);
        critic_parts.push(match critic {
            Some(_) => policies::checkpoint_part(store, &markers, &set.name, set.current.version, CRITIC_DIR).await?,
            None => None,
        });
    }
    let ranks = session.ranks.as_ref();
    // With pools, this rank trains its pool's policies over its pool's ranks; else every
    // policy over all ranks (or alone).
    let pool = match ranks {
        Some(world) if !config.pools.is_empty() => Some(my_pool(config, world)?),
        _ => None,
    };
    let trainers = pool.as_ref().map(|(_, ranks)| ranks).or(ranks);
    let writes = trainers.is_none_or(|r| r.is_leader());
    let mut writer = store.begin(stage);
    if let (Some(world), Some(_)) = (ranks, &pool) {
        // Each pool's leader writes its checkpoints into rank 0's attempt.
        let attempt = world.from_leader("the update's attempt", Some(writer.attempt())).map_err(Error::from)?;
        if !world.is_leader() {
            writer = store.join_attempt(stage, attempt);
        }
    }
    let mut loaded = match pool {
        Some(_) => LoadedPolicies::default(),
        None => session.policies.take(store, &config.policies, iteration).await?,
    };
    let mut outcome = Outcome::default();
    for ((set, optimizer), critic_part) in sets.into_iter().zip(optimizers).zip(critic_parts) {
        if let Some((name, _)) = &pool
            && config.policies[&set.name].pool.as_ref() != Some(name)
        {
            continue;
        }
        hold_only(&mut loaded, store, config, &markers, &set.name, iteration).await?;
        let optimizer = optimizer.map(|path| AdamWState::load(&path)).transpose()?;
        let started = Instant::now();
        let (trained, optimizer) = train_policy(&mut loaded, config, &set, iteration, optimizer, trainers, progress)?;
        let fitted = match (critic, &critic_inputs) {
            (Some(critic), Some(inputs)) => {
                let policy = &config.policies[&set.name];
                let separate = super::separate_critic_model(critic, &markers, policy, &set.name, set.current.version)?;
                let part = critic_part.as_deref();
                Some(fit_critic(&mut loaded, separate, config, critic, &set, inputs, part, iteration)?)
            }
            _ => None,
        };
        outcome.model_seconds += started.elapsed().as_secs_f64();
        if !writes {
            continue;
        }
        outcome.rows.extend(trained.steps);
        outcome.gaps.extend(trained.gaps);
        let heads = match fitted {
            Some(fitted) => {
                outcome.rows.extend(fitted.rows);
                Some(saved_heads(&fitted.critics)?)
            }
            None => None,
        };
        let part = heads.as_ref().map(|dir| (CRITIC_DIR, dir.path()));
        let checkpoint =
            policies::save(&mut writer, &mut loaded, &set.name, iteration + 1, optimizer.as_ref(), part).await?;
        loaded.advance(&set.name, iteration + 1, checkpoint.weights_sha256.clone());
        outcome.saved.push(checkpoint);
        outcome.used.push(set.current);
    }
    if let Some(world) = ranks.filter(|r| !r.is_leader()) {
        if let (Some((name, _)), true) = (&pool, writes) {
            outcome.files = writer.into_files();
            let json = serde_json::to_vec(&outcome).expect("an outcome is JSON");
            world.put(&format!("pool {name}"), &json).map_err(Error::from)?;
        }
        // The policies in memory are not what a marker names: none is kept.
        world.from_leader("the commit", None).map_err(Error::from)?;
        return Ok(store.marker(&stage).await?.expect("rank 0 committed the update").marker);
    }
    if let (Some(world), Some((mine, _))) = (ranks, &pool) {
        for (name, _) in crate::config::pools::members(&config.pools).into_iter().filter(|(name, _)| name != mine) {
            let theirs = world.take(&format!("pool {name}")).map_err(Error::from)?;
            let theirs: Outcome = serde_json::from_slice(&theirs).expect("a pool's outcome is JSON");
            writer.adopt(theirs.files.clone());
            outcome.add(theirs);
        }
    }
    let marker = commit(writer, config, iteration, outcome, read).await?;
    if pool.is_none() {
        session.policies.give_back(loaded);
    }
    if let Some(ranks) = ranks {
        ranks.from_leader("the commit", Some(&stage.to_string())).map_err(Error::from)?;
    }
    Ok(marker)
}

/// What the update of some policies made: their `updates` and `logprob_gaps` rows,
/// checkpoints, the versions they trained, and (from a pool's leader) the files it wrote.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Outcome {
    rows: Vec<UpdateRow>,
    gaps: Vec<LogprobGapRow>,
    saved: Vec<CheckpointRef>,
    used: Vec<PolicyRef>,
    model_seconds: f64,
    files: Vec<FileEntry>,
}

impl Outcome {
    /// Adds another pool's outcome, keeping every list in policy order, as one process
    /// writes them.
    fn add(&mut self, other: Outcome) {
        self.rows.extend(other.rows);
        self.gaps.extend(other.gaps);
        self.saved.extend(other.saved);
        self.used.extend(other.used);
        self.model_seconds += other.model_seconds;
        self.rows.sort_by(|a, b| a.policy.cmp(&b.policy));
        self.gaps.sort_by(|a, b| a.policy.cmp(&b.policy));
        self.saved.sort_by(|a, b| a.policy.cmp(&b.policy));
        self.used.sort_by(|a, b| a.policy.cmp(&b.policy));
    }
}

/// Writes the tables of `outcome` and commits the attempt with its checkpoints.
async fn commit(
    mut writer: StageWriter<'_>,
    config: &RunConfig,
    iteration: u32,
    outcome: Outcome,
    read: Vec<InputRef>,
) -> Result<CommitMarker, super::Error> {
    if !outcome.rows.is_empty() {
        let batch =
            tables::to_batch(&outcome.rows).map_err(|source| super::Error::Encode { table: Table::Updates, source })?;
        writer.write_table(Table::Updates, Partition::Iteration(iteration), &[batch]).await?;
    }
    if !outcome.gaps.is_empty() {
        let batch = tables::to_batch(&outcome.gaps)
            .map_err(|source| super::Error::Encode { table: Table::LogprobGaps, source })?;
        writer.write_table(Table::LogprobGaps, Partition::Iteration(iteration), &[batch]).await?;
    }
    let info = CommitInfo {
        inputs: read,
        policies_used: outcome.used,
        checkpoints: outcome.saved,
        model_seconds: outcome.model_seconds,
        ..super::run_info(config)
    };
    Ok(writer.finish().commit(info).await?)
}

/// This rank's pool (`pools:`) and its ranks, once the pools' ranks add up to the world.
fn my_pool(config: &RunConfig, world: &Ranks) -> Result<(String, Arc<Ranks>), Error> {
    crate::config::pools::check_world(&config.pools, world.size())
        .map_err(|invalid| Error::Pools { message: invalid.message })?;
    let (name, members) = crate::config::pools::members(&config.pools)
        .into_iter()
        .find(|(_, members)| members.contains(&world.rank()))
        .expect("the pools' ranks add up to the world");
    let ranks = world.pool(&name, members)?;
    Ok((name, Arc::new(ranks)))
}

/// What the ranks of iteration `iteration`'s update compare when they meet: the run's
/// config and the committed inputs they train on.
pub async fn rendezvous_digest(store: &RunStore, config: &RunConfig, iteration: u32) -> Result<String, super::Error> {
    use sha2::{Digest, Sha256};
    let stage = StageId::at(Stage::Update, iteration);
    let rollout = inputs(store, stage, Stage::Rollout, iteration).await?;
    let advantage = inputs(store, stage, Stage::Advantage, iteration).await?;
    let mut hasher = Sha256::new();
    hasher.update(format!("{} {stage}\n", config.sha256()));
    for marker in rollout.iter().chain(&advantage) {
        hasher.update(format!("{} {}\n", marker.path, marker.sha256));
    }
    Ok(format!("config {} and inputs {:.12x}", &config.sha256()[..12], hasher.finalize()))
}

/// Leaves `name`'s model the only one in memory: another role's full model is dropped
/// first, and `name`'s fetched (checked against its marker) unless it is resident.
async fn hold_only(
    loaded: &mut LoadedPolicies,
    store: &RunStore,
    config: &RunConfig,
    markers: &[StoredMarker],
    name: &str,
    iteration: u32,
) -> Result<(), super::Error> {
    loaded.keep_only(name);
    if loaded.member(name).is_none() {
        loaded.add(&config.policies, policies::fetch(store, markers, name, iteration).await?)?;
    }
    Ok(())
}

/// Fits the value heads of `set`'s policy on its new trunk, or on the `separate` critic
/// model, off the async runtime's workers (critic_fit.rs).
#[allow(clippy::too_many_arguments)]
fn fit_critic(
    loaded: &mut LoadedPolicies,
    mut separate: Option<LanguageModel>,
    config: &RunConfig,
    critic: &CriticConfig,
    set: &TrainingSet,
    inputs: &HashMap<String, crate::critic::CriticInput>,
    saved: Option<&Path>,
    iteration: u32,
) -> Result<critic_fit::Fitted, super::Error> {
    let (model, adapter) = super::critic_trunk(&mut separate, loaded, &set.name);
    let adapter = adapter.map(str::to_owned);
    tokio::task::block_in_place(|| {
        critic_fit::fit(model, adapter.as_deref(), config, critic, set, inputs, saved, iteration)
    })
    .map_err(|e| {
        e.out_of_memory_in(StageId::at(Stage::Update, iteration), Some(&set.name), &memory_knob(&config.update))
    })
}

/// The fitted heads written to a temporary folder, which `policies::save` uploads as the
/// checkpoint's critic part.
fn saved_heads(critics: &Critics) -> Result<tempfile::TempDir, super::Error> {
    let dir = tempfile::tempdir().map_err(|source| policies::Error::Cache { path: std::env::temp_dir(), source })?;
    critics.save(dir.path())?;
    Ok(dir)
}

/// Runs the PPO steps of `set`'s policy, which is in memory, off the async runtime's
/// workers.
fn train_policy(
    loaded: &mut LoadedPolicies,
    config: &RunConfig,
    set: &TrainingSet,
    iteration: u32,
    optimizer: Option<AdamWState>,
    ranks: Option<&Arc<Ranks>>,
    progress: &dyn Progress,
) -> Result<(Trained, Option<AdamWState>), super::Error> {
    let stage = StageId::at(Stage::Update, iteration);
    let (model, adapter) = loaded.model(&set.name).expect("the policy is in memory");
    if ranks.is_some() && model.device() != tch::Device::Cpu {
        let device = format!("{:?}", model.device());
        return Err(Error::RanksOffCpu { policy: set.name.clone(), device }.into());
    }
    let settings = PpoSettings::new(config, &set.name, iteration, model);
    let adapter = adapter.map(str::to_owned);
    let (label, steps) = (format!("{stage} {}", set.name), settings.steps(set.sequences.len()));
    phase(progress, &label, steps, "steps", || {
        tokio::task::block_in_place(|| train_ppo(model, adapter.as_deref(), set, &settings, optimizer, ranks, progress))
    })
    .map_err(|e| e.out_of_memory_in(stage, Some(&set.name), &memory_knob(&config.update)))
}
