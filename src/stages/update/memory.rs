//! How an update's training fits in memory: micro-batches, and what helps when it does not.

use crate::config::{Recompute, UpdateConfig};
use crate::model::{LanguageModel, MicroBatching};

/// What helps an update's training step that runs out of memory.
pub(super) fn memory_knob(update: &UpdateConfig) -> String {
    format!(
        "a smaller update.micro_batch_tokens (now {}) or update.recompute_activations: true",
        update.micro_batch_tokens
    )
}

/// How `policy` trains in an update: micro-batches of `micro_batch_tokens`, checkpointed as
/// configured or as the model needs.
pub(super) fn micro_batching(update: &UpdateConfig, model: &LanguageModel) -> MicroBatching {
    let tokens = update.micro_batch_tokens as usize;
    let recompute = match update.recompute_activations {
        Recompute::On => true,
        Recompute::Off => false,
        Recompute::Auto => model.activation_bytes_per_token() * tokens as u64 > AUTO_CHECKPOINTING_BYTES,
    };
    MicroBatching { share_prefix: update.share_prefix, ..MicroBatching::new(tokens, recompute) }
}

/// Activations of one micro-batch above which `recompute_activations: auto` turns it on.
const AUTO_CHECKPOINTING_BYTES: u64 = 4 << 30;
