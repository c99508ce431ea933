//! Why an update refuses to run.

use crate::policies;
use crate::schema::Table;

/// Why an update refuses to run (the on-policy checks) or a policy cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ranks of a data-parallel update could not stay together.
    #[error(transparent)]
    Ranks(#[from] crate::ranks::Error),

    #[error("refusing to update in pools: pools {message}; nothing was written")]
    Pools { message: String },

    #[error(
        "refusing to update {policy:?} on {device} as ranks: ranks train on the CPU (Gloo) only; update a \
         policy on CUDA in one process (without --ranks); nothing was written"
    )]
    RanksOffCpu { policy: String, device: String },

    #[error("policy {policy:?} has no committed checkpoint; commit v0 first (the run-level update, `initialise`)")]
    NoCheckpoint { policy: String },

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: the update of iteration {iteration} trains \
         v{iteration}, but the latest committed checkpoint is v{latest}; nothing was written"
    )]
    NotAligned { policy: String, iteration: u32, latest: u32 },

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: the rollout ({marker}) sampled v{rollout_version} \
         with weights sha256 {rollout_sha256}, but the committed checkpoint v{version} has weights sha256 \
         {checkpoint_sha256}; nothing was written"
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

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: {table} row {candidate_id} was sampled by \
         v{found}, {behind} versions behind the v{iteration} this update trains, past rollout.max_staleness \
         {bound}; nothing was written"
    )]
    PastStaleness {
        policy: String,
        iteration: u32,
        table: Table,
        candidate_id: String,
        found: u32,
        behind: u32,
        bound: u32,
    },

    #[error(
        "refusing to update {policy:?} in iteration {iteration}: turns row {candidate_id} says it was sampled by \
         weights {found:?}, but v{version} is {expected}; an engine sampled with other weights than the version \
         it names; nothing was written"
    )]
    RowWeights { policy: String, iteration: u32, candidate_id: String, version: u32, found: String, expected: String },

    #[error("{table} row {candidate_id} names policy {policy:?}, which is not one of the run's trainable policies")]
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
         or the sampler is broken (a vLLM server sampling at a temperature other than 1 must run with \
         --logprobs-mode processed_logprobs, so that its logprobs are those of the distribution it drew from)"
    )]
    Drift { policy: String, version: u32, mean: f64, max: f64, limit: f64 },

    #[error(
        "refusing to update {policy:?} v{version}: its weights give non-finite logprobs on {tokens} of the sampled \
         tokens; the checkpoint is broken (its weights hold a NaN or an infinity)"
    )]
    NonFiniteLogprobs { policy: String, version: u32, tokens: usize },

    #[error(
        "the update of {policy:?} v{version} took no step: the loss or gradient norm was not finite in all {steps} \
         of its mini-batches; nothing was written. What helps: a lower learning rate (policies.{policy}.optimizer.lr \
         = {lr}), a tighter update.grad_clip (now {grad_clip}), or float32 weights (policies.{policy}.dtype, now \
         {dtype})"
    )]
    NoFiniteStep { policy: String, version: u32, steps: usize, lr: f64, grad_clip: f64, dtype: String },

    #[error(
        "refusing to commit {policy:?} v{version}: after the update its weights hold a NaN or an infinity ({names}); \
         nothing was written. What helps: a lower learning rate (policies.{policy}.optimizer.lr = {lr}) or a tighter \
         update.grad_clip (now {grad_clip})"
    )]
    NonFiniteWeights { policy: String, version: u32, names: String, lr: f64, grad_clip: f64 },

    #[error(
        "refusing to commit {policy:?} v{version}: step {step} changed its weights by more than float32 can \
         measure (weights_change = {change}); nothing was written. What helps: a lower learning rate \
         (policies.{policy}.optimizer.lr = {lr})"
    )]
    WeightsOverflow { policy: String, version: u32, step: u32, change: f64, lr: f64 },

    #[error("policy {policy:?}: {reason}")]
    Init { policy: String, reason: String },

    #[error("critic.warm_start fits the heads to a source run's stored rollouts, but {reason}")]
    WarmCritic { reason: String },

    #[error("cannot fork iteration {iteration} of {from}: {source}")]
    Fork { from: String, iteration: u32, source: Box<policies::Error> },
}
