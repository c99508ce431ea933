//! Which engine samples a stage's prompts: petting's own tch sampler, or a vLLM server
//! reached over its OpenAI-compatible HTTP API.
//!
//! ```text
//!  rollout.engine / evaluation.engine: tch | vllm
//!  vllm: {url, command?}             a server the user runs, or one petting starts (server.rs)
//!     │
//!     ├─ sync.rs     before a stage samples: the server holds exactly version k of every
//!     │              policy (adapter `<policy>-v<k>-<digest>` loaded, or full weights
//!     │              reloaded and fingerprinted: fingerprint.rs), checked by a logprob
//!     │              probe against the committed weights
//!     └─ client.rs   token ids in, token ids and logprobs out; a seed per request
//! ```
//!
//! The server samples; petting still renders every prompt with its own chat template and
//! tokenizer and keeps the tch weights for the probe and the update, so nothing is
//! re-tokenised and what the update trains on is exactly what was sampled.

pub mod client;
pub mod fingerprint;
pub mod server;
pub mod sync;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::{Invalid, check};

pub use client::VllmClient;
pub use server::{ManagedServer, ServerSlot};
pub use sync::Served;

/// `rollout.engine` and `evaluation.engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// petting's own sampler on the policy's device.
    #[default]
    Tch,
    /// The vLLM server of the `vllm:` section.
    Vllm,
}

impl EngineKind {
    /// As the `turns.engine` column names it.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Tch => "tch",
            EngineKind::Vllm => "vllm",
        }
    }
}

/// `vllm:` in a run's config: the server that stages with `engine: vllm` sample through.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VllmConfig {
    /// Where the server answers, e.g. http://127.0.0.1:8000.
    pub url: String,
    /// Start the server with this command (program and arguments) for the run, and stop
    /// it at the end; unset: the server at `url` is already running.
    #[serde(default)]
    pub command: Vec<String>,
    /// Extra environment of the started server.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How long a started server may take to answer /health.
    #[serde(default = "default_startup_timeout")]
    pub startup_timeout_seconds: u64,
    /// How long one request may take before the stage fails.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_seconds: u64,
    /// Requests in flight at once; the server batches them.
    #[serde(default = "default_concurrency")]
    pub max_concurrent_requests: usize,
    /// Load each version's weights into the server (adapters by name; full weights by
    /// reload, which needs VLLM_SERVER_DEV_MODE=1). false: the server must already hold
    /// them, and the probe still checks that it does.
    #[serde(default = "default_true")]
    pub load_weights: bool,
}

fn default_startup_timeout() -> u64 {
    600
}
fn default_request_timeout() -> u64 {
    600
}
fn default_concurrency() -> usize {
    256
}
fn default_true() -> bool {
    true
}

impl VllmConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        let url = url::Url::parse(&self.url);
        check(
            url.as_ref().is_ok_and(|u| matches!(u.scheme(), "http" | "https")),
            "vllm.url",
            format!("{:?} is not an http(s) URL such as http://127.0.0.1:8000", self.url),
        )?;
        check(
            self.command.first().is_none_or(|p| !p.trim().is_empty()),
            "vllm.command",
            "names no program; give the server's command line as a list, e.g. [python, -m, vllm.entrypoints.openai.api_server, --model, …]",
        )?;
        check(self.startup_timeout_seconds >= 1, "vllm.startup_timeout_seconds", "must be at least 1")?;
        check(self.request_timeout_seconds >= 1, "vllm.request_timeout_seconds", "must be at least 1")?;
        check(self.max_concurrent_requests >= 1, "vllm.max_concurrent_requests", "must be at least 1")
    }
}

/// Why sampling through vLLM failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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

    #[error(
        "the vLLM server does not hold v{version} of {policy:?}: {probe}, more than update.max_logprob_drift; {hint}"
    )]
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
