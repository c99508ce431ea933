//! `rollout.engine`, `evaluation.engine` and `vllm:`: who samples a stage's prompts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::{Invalid, check};

/// `rollout.engine` and `evaluation.engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Largest mean |Δ logprob| between the server and petting's copy of the same weights
    /// on the probe each stage scores before it samples; more, and the stage refuses. A
    /// server in bf16 probed against float32 weights needs more than the default (0.06 was
    /// measured at v0 of SmolLM2-135M).
    #[serde(default = "default_probe_tolerance")]
    pub probe_tolerance: f64,
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
fn default_probe_tolerance() -> f64 {
    0.05
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
        check(self.max_concurrent_requests >= 1, "vllm.max_concurrent_requests", "must be at least 1")?;
        check(
            self.probe_tolerance > 0.0 && self.probe_tolerance.is_finite(),
            "vllm.probe_tolerance",
            "must be a positive mean logprob gap, e.g. 0.05",
        )
    }
}
