//! Language models in tch: one Hugging Face–compatible decoder for the Llama, Qwen2 and
//! Qwen3 families, its tokenizer and chat template, batched KV-cache sampling with
//! per-token logprobs, training forwards, LoRA adapters, checkpoints and GGUF import.
//!
//! ```text
//!  HF folder ──► LanguageModel::load ──► generate(requests)  ──► tokens, text, logprobs, finish
//!  (config.json,      │            score(pairs)       ──► per-token logprobs (no grad)
//!   *.safetensors,    │            backward(pairs, f) ──► grads of loss f(logprobs)
//!   tokenizer.json)   │            add_adapter / save_adapter / load_adapter (PEFT)
//!  config.json ──► LanguageModel::scratch (seeded)      save ──► HF folder + meta.json
//!                     │            values(head, seqs) ──► a critic's ValueHead over the trunk
//!  GGUF ──► gguf::import ──► HF folder
//! ```
//!
//! Device, dtype and grad mode are decided by the caller: [`LoadOptions`] carries the
//! device and dtype, and sampling and scoring run under `tch::no_grad` themselves, since
//! grad mode is per thread.

mod adamw;
mod build_tokenizer;
mod chat_template;
mod checkpoint;
mod config;
mod csrc;
mod decode_attention;
mod decoder;
mod device;
mod generate;
pub mod gguf;
mod kv_cache;
mod language_model;
mod lora;
mod packed_linear;
mod prefill_plan;
mod sampler;
mod score;
mod tokenizer;
pub mod trainer;
mod value_head;
pub mod vision;
mod weights;

use std::path::{Path, PathBuf};

pub use adamw::{AdamW, AdamWState, OPTIMIZER_FILE, OptimizerConfig, StateShard, StepChange};
pub use build_tokenizer::{
    CHATML_TEMPLATE, DEFAULT_VOCAB_SIZE, END_OF_TEXT, IM_END, IM_START, TokenizerFiles, build_tokenizer, scratch_config,
};
pub use chat_template::{ChatMessage, ChatTemplate, TemplateOptions};
pub use checkpoint::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, CheckpointMeta, META_FILE, SaveAs, sha256_file};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use decoder::CausalLm;
pub use device::{DType, Device};
pub use generate::{FinishReason, Generation, GenerationRequest, GenerationSettings, GenerationStats, KvBudget};
pub use kv_cache::KvCache;
pub use language_model::{LanguageModel, LoadOptions};
pub use lora::{ALL_LINEAR, LoraConfig};
pub use sampler::{Sampler, Sampling, SamplingConfig};
pub use score::{MicroBatch, MicroBatching, ScoreRequest, prompt_groups};
pub use tokenizer::Tokenizer;
pub use trainer::{AllReduce, DataParallel, PpoClip, StepResult, Totals, Trainer};
pub use value_head::{VALUE_HEAD_FILE, ValueHead};
pub use vision::PromptImages;
pub use weights::{
    MAX_SHARD_BYTES, SafetensorsSet, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, is_weight_file, read_header, shard_names,
    weights_digest, write_safetensors, write_weights,
};

/// Errors of the model code; each names the file and, where there is one, the tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{}: {source}", file.display())]
    Io { file: PathBuf, source: std::io::Error },
    #[error("{}: missing: {what}", file.display())]
    MissingFile { file: PathBuf, what: &'static str },
    #[error("{}: {reason}", file.display())]
    Config { file: PathBuf, reason: String },
    #[error("{}: {reason}", file.display())]
    Format { file: PathBuf, reason: String },
    #[error("{}: tensor {tensor} is missing", file.display())]
    MissingTensor { file: PathBuf, tensor: String },
    #[error("{}: tensor {tensor} has shape {found:?}, expected {expected:?}", file.display())]
    Shape { file: PathBuf, tensor: String, expected: Vec<i64>, found: Vec<i64> },
    #[error("{}: tokenizer: {reason}", file.display())]
    Tokenizer { file: PathBuf, reason: String },
    #[error("chat template: {reason}")]
    Template { reason: String },
    #[error("no adapter named {name:?} (have: {have:?})")]
    UnknownAdapter { name: String, have: Vec<String> },
    #[error("adapter {name:?} exists already")]
    DuplicateAdapter { name: String },
    #[error("invalid request: {reason}")]
    Request { reason: String },
    #[error("libtorch: {context}: {source}")]
    Torch { context: String, source: tch::TchError },
    #[error("{reason}")]
    Device { reason: String },
    #[error(transparent)]
    Ranks(#[from] crate::ranks::Error),
    #[error("out of memory while {during}: {detail}")]
    OutOfMemory { during: String, detail: String },
    #[error(
        "a prompt of {tokens} tokens is longer than the limit of {limit} (rollout.max_prompt_tokens, \
         evaluation.max_prompt_tokens in an evaluation, warm_start.max_prompt_tokens in a warm start); cutting it would lose the chat header or the task, so \
         raise the limit (the model's context allows), or shorten the prompts (fewer turns: workflow.max_turns); \
         it begins: {start:?}"
    )]
    PromptTooLong { tokens: usize, limit: usize, start: String },
}

impl Error {
    pub(crate) fn io(file: &Path, source: std::io::Error) -> Error {
        Error::Io { file: file.to_path_buf(), source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs model work, turning libtorch running out of memory into [`Error::OutOfMemory`].
///
/// tch's infallible tensor operations unwrap libtorch's errors, so an allocation that
/// fails deep inside a forward pass is a panic. It is caught here, at the model's
/// boundary, and classified by libtorch's message (its CPU and CUDA allocators say
/// "can't allocate memory" and "out of memory"); any other panic goes on unwinding.
pub(crate) fn guard<T>(during: impl FnOnce() -> String, work: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => match out_of_memory_message(payload.as_ref()) {
            Some(detail) => Err(Error::OutOfMemory { during: during(), detail }),
            None => std::panic::resume_unwind(payload),
        },
    }
}

/// libtorch's message, when a panic's payload says an allocation failed.
pub fn out_of_memory_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    let text =
        payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied())?;
    // libtorch's sentence, without tch's wrapping or the C++ backtrace after it (whose
    // newlines the wrapping escapes).
    let start = ["CUDA out of memory", "DefaultCPUAllocator: ", "out of memory"].iter().find_map(|m| text.find(m))?;
    let sentence = &text[start..];
    let end = ["\\n", "\n", "\")"].iter().filter_map(|m| sentence.find(m)).min().unwrap_or(sentence.len());
    Some(sentence[..end].trim().to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn out_of_memory_panics_are_told_by_libtorchs_sentence() {
        let cpu = r#"called `Result::unwrap()` on an `Err` value: Torch("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 82965504 bytes. Error code 12 (Cannot allocate memory)\nframe #0: c10::ThrowEnforceNotMet")"#.to_string();
        assert_eq!(
            super::out_of_memory_message(&cpu).unwrap(),
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 82965504 bytes. Error code 12 (Cannot allocate memory)"
        );
        let cuda = "Torch(\"CUDA out of memory. Tried to allocate 2.00 GiB\")".to_string();
        assert_eq!(super::out_of_memory_message(&cuda).unwrap(), "CUDA out of memory. Tried to allocate 2.00 GiB");
        assert_eq!(super::out_of_memory_message(&"index out of range".to_string()), None);
        assert_eq!(super::out_of_memory_message(&7u32), None);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::path::PathBuf;

    /// A file or folder of `tests/fixtures` (its README says what each is).
    pub(crate) fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
    }
}
