//! The engine a sampling stage (rollout, evaluate) plays through: petting's own sampler,
//! or the run's vLLM server brought to the stage's versions first.

use std::path::PathBuf;

use crate::model::{GenerationSettings, KvBudget, SamplingConfig};
use crate::policies::{self, LoadedPolicies};
use crate::store::{RunStore, layout};

use super::{EngineKind, Error, ModelResponder, Responder, Served, ServerSlot, VllmClient, VllmConfig, VllmResponder};

/// How one stage samples.
pub enum StageEngine {
    Tch { kv_cache_gib: Option<f64> },
    Vllm { client: VllmClient, served: Served, max_concurrent_requests: usize },
}

impl StageEngine {
    /// For `kind`: with vLLM, the run's server (started in `server` when `vllm` says how)
    /// holding exactly the loaded versions, checked by fingerprint and probe. A server
    /// started for a run that is not on local disk logs under `run_name` in the cache.
    pub async fn prepare(
        kind: EngineKind,
        kv_cache_gib: Option<f64>,
        vllm: Option<&VllmConfig>,
        run_name: &str,
        store: &RunStore,
        loaded: &mut LoadedPolicies,
        server: &ServerSlot,
    ) -> Result<StageEngine, Error> {
        let vllm = match (kind, vllm) {
            (EngineKind::Tch, _) => return Ok(StageEngine::Tch { kv_cache_gib }),
            (EngineKind::Vllm, Some(vllm)) => vllm,
            (EngineKind::Vllm, None) => return Err(Error::Unsupported("engine: vllm needs a vllm: section".into())),
        };
        let client = server.client(vllm, &log_dir(store, run_name)).await?;
        let markers = store.markers().await?;
        let mut checkpoints = Vec::new();
        for member in loaded.refs() {
            // The checkpoint alone: an adapter's base is on the server already.
            let dir = policies::checkpoint_folder(store, &markers, &member.policy, member.version).await?;
            let tied_embeddings = loaded.model(&member.policy).is_some_and(|(p, _)| p.config().tie_word_embeddings);
            checkpoints.push(super::sync::Checkpoint {
                lora: loaded.is_lora(&member.policy),
                policy: member.policy,
                version: member.version,
                weights_sha256: member.weights_sha256,
                dir,
                tied_embeddings,
            });
        }
        let views = policies::cache_root().join("vllm");
        let served = super::sync::serve(&client, vllm, &checkpoints, loaded, &views).await?;
        Ok(StageEngine::Vllm { client, served, max_concurrent_requests: vllm.max_concurrent_requests })
    }

    /// The responder that answers the stage's prompts with `loaded`, sampling as
    /// `sampling` says.
    pub fn responder<'a>(
        &'a self,
        loaded: &'a mut LoadedPolicies,
        sampling: &'a SamplingConfig,
        max_prompt_tokens: usize,
    ) -> Box<dyn Responder + 'a> {
        match self {
            StageEngine::Tch { kv_cache_gib } => {
                let settings = GenerationSettings {
                    kv_budget: KvBudget::from_gib(*kv_cache_gib),
                    ..GenerationSettings::from_config(sampling)
                };
                Box::new(ModelResponder::new(loaded, settings, max_prompt_tokens))
            }
            StageEngine::Vllm { client, served, max_concurrent_requests } => Box::new(VllmResponder {
                policies: loaded,
                client,
                served,
                sampling,
                max_prompt_tokens,
                max_concurrent_requests: *max_concurrent_requests,
            }),
        }
    }
}

/// Where a server started for the run logs: beside a local run (`_logs/`), else in the
/// local cache under the run's name.
fn log_dir(store: &RunStore, run_name: &str) -> PathBuf {
    policies::local_dir(store, layout::LOGS_DIR).unwrap_or_else(|| policies::cache_root().join("logs").join(run_name))
}
