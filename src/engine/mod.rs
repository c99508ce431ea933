//! Sampling: who answers a stage's prompts. A [`Responder`] answers a batch of prompts
//! with one policy; `play` drives episodes through one, and knows nothing of what is
//! behind it.
//!
//! ```text
//!  rollout.engine / evaluation.engine: tch | vllm
//!  stage.rs        StageEngine::prepare: the engine a rollout or evaluation samples with,
//!                  brought to the stage's policy versions; .responder() answers prompts
//!  responder.rs    ModelResponder: petting's own sampler (crate::model) on the loaded
//!                  policies; VllmResponder: the same prompts through the vLLM server
//!  vllm: {url, command?}   a server the user runs, or one petting starts (server.rs; the
//!                  process keeps it in a ServerSlot, so its stages share one)
//!     ├─ sync.rs   before a stage samples: the server holds exactly version k of every
//!     │            policy (adapter `<policy>-v<k>-<digest>` loaded, or full weights
//!     │            reloaded and fingerprinted: fingerprint.rs), checked by a logprob
//!     │            probe against the committed weights
//!     └─ client.rs token ids in, token ids and logprobs out; a seed per request
//! ```
//!
//! The server samples; petting still renders every prompt with its own chat template and
//! tokenizer and keeps the tch weights for the probe and the update, so nothing is
//! re-tokenised and what the update trains on is exactly what was sampled.

pub mod client;
mod config;
pub mod fingerprint;
mod responder;
pub mod server;
mod stage;
pub mod sync;

pub use client::VllmClient;
pub use config::{EngineKind, VllmConfig};
use responder::{ModelResponder, VllmResponder};
pub use server::{ManagedServer, ServerSlot};
pub use stage::StageEngine;
pub use sync::Served;

/// One prompt to answer, with the seed of its own random stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The agent's message, which the responder renders with the policy's chat template;
    /// or, with `tokens`, the prompt as already rendered.
    pub text: String,
    /// The prompt's token ids, where the caller rendered it (an agent program's
    /// conversation, whose earlier turns keep the ids they were sampled with).
    pub tokens: Option<Vec<i64>>,
    pub seed: u64,
}

impl Prompt {
    /// An agent's message, rendered by the responder.
    pub fn message(text: String, seed: u64) -> Prompt {
        Prompt { text, tokens: None, seed }
    }
}

/// A sampled reply and what produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The prompt as the model saw it (chat template applied) and its tokens.
    pub prompt_text: String,
    pub prompt_tokens: Vec<i32>,
    pub text: String,
    pub tokens: Vec<i32>,
    pub logprobs: Vec<f32>,
    pub finish_reason: String,
    /// Wall time of the batch the reply was sampled in.
    pub seconds: f64,
    /// What sampled it, and the name the engine knows the weights by (the policy for
    /// tch, the served model or adapter for vLLM).
    pub engine: EngineKind,
    pub engine_model: String,
}

/// Answers a batch of prompts with one policy.
pub trait Responder {
    fn respond(&mut self, policy: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, Error>;

    /// [`respond`](Responder::respond), telling `watch` how the replies come along
    /// (progress within one long batch): a prompt's index, the part of its reply newly done
    /// (the parts of a reply add up to 1), and the tokens newly generated. Responders that
    /// answer all at once tell it of each whole reply when the batch is done.
    fn respond_watched(
        &mut self,
        policy: &str,
        prompts: &[Prompt],
        watch: &mut dyn FnMut(usize, f64, u64),
    ) -> Result<Vec<Reply>, Error> {
        let replies = self.respond(policy, prompts)?;
        for (index, reply) in replies.iter().enumerate() {
            watch(index, 1.0, reply.tokens.len() as u64);
        }
        Ok(replies)
    }

    /// Whether `policy` can be sent `text`: false when the prompt, as the model would
    /// see it, is longer than the limit (answering it would be an error).
    fn fits(&mut self, _policy: &str, _text: &str) -> Result<bool, Error> {
        Ok(true)
    }

    /// The most tokens a prompt may have.
    fn prompt_limit(&self) -> usize {
        usize::MAX
    }

    /// An OpenAI-style conversation (`messages`, and the `tools` offered) rendered with
    /// `policy`'s chat template, ending with the opening of the assistant's reply.
    fn chat_text(
        &mut self,
        _policy: &str,
        _messages: &serde_json::Value,
        _tools: Option<&serde_json::Value>,
    ) -> Result<String, Error> {
        Err(Error::Unsupported("this responder does not render conversations".into()))
    }

    /// `text` as `policy`'s tokenizer encodes it (no special tokens added).
    fn encode(&mut self, _policy: &str, _text: &str) -> Result<Vec<i64>, Error> {
        Err(Error::Unsupported("this responder does not tokenise".into()))
    }
}

/// Why sampling failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Model(#[from] crate::model::Error),

    #[error(transparent)]
    Policy(#[from] crate::policies::Error),

    #[error(transparent)]
    Store(#[from] crate::store::Error),

    #[error(
        "the vLLM server at {url} did not answer {during}: {reason}{log}; rerun the stage once the server is \
         back (nothing of this stage was committed)"
    )]
    Unreachable { url: String, during: String, reason: String, log: LogHint },

    #[error("the vLLM server at {url} refused {during}: HTTP {status}: {body}{log}")]
    Status { url: String, during: String, status: u16, body: String, log: LogHint },

    #[error("the vLLM server at {url} answered {during} with something unexpected: {reason}")]
    BadResponse { url: String, during: String, reason: String },

    #[error("cannot start the vLLM server ({command}): {reason}{log}")]
    Start { command: String, reason: String, log: LogHint },

    #[error("the vLLM server does not hold v{version} of {policy:?}: {probe}, more than vllm.probe_tolerance; {hint}")]
    WrongWeights { policy: String, version: u32, probe: String, hint: &'static str },

    #[error(
        "the vLLM server does not hold v{version} of {policy:?}: the fingerprint of its weights ({served}) is not \
         the committed checkpoint's ({expected}); {hint}"
    )]
    Fingerprint { policy: String, version: u32, served: String, expected: String, hint: &'static str },

    #[error("{0}")]
    Unsupported(String),

    #[error("cannot prepare the weights the vLLM server loads at {path}: {source}")]
    Files { path: String, source: std::io::Error },
}

/// Where a started server's log is, appended to messages about it (empty for a server
/// the user runs).
#[derive(Debug, Clone, Default)]
pub struct LogHint(pub Option<std::path::PathBuf>);

impl std::fmt::Display for LogHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(path) => write!(f, " (its log: {})", path.display()),
            None => Ok(()),
        }
    }
}
