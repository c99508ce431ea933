//! The model behind [`play`](super::play): prompts go through the policy's chat template
//! and tokenizer ([`Policy::agent_prompt`](crate::model::Policy::agent_prompt)), then one
//! batched generation per call.

use std::time::Instant;

use crate::model::{GenerationRequest, GenerationSettings};
use crate::policies::LoadedPolicies;

use super::{Prompt, Reply, Responder};

/// Answers prompts with loaded policies, by name.
pub struct ModelResponder<'a> {
    policies: &'a mut LoadedPolicies,
    settings: GenerationSettings,
    max_prompt_tokens: usize,
}

impl<'a> ModelResponder<'a> {
    pub fn new(
        policies: &'a mut LoadedPolicies,
        settings: GenerationSettings,
        max_prompt_tokens: usize,
    ) -> ModelResponder<'a> {
        ModelResponder { policies, settings, max_prompt_tokens }
    }
}

impl Responder for ModelResponder<'_> {
    fn respond(&mut self, name: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::model::Error> {
        let (policy, adapter) = self
            .policies
            .model(name)
            .ok_or_else(|| crate::model::Error::Request { reason: format!("policy {name:?} is not loaded") })?;
        let adapter = adapter.map(str::to_owned);
        let rendered: Vec<(String, Vec<i64>)> =
            prompts.iter().map(|p| policy.agent_prompt(&p.text, self.max_prompt_tokens)).collect::<Result<_, _>>()?;
        // One call for every prompt: the sampler sizes its batches from its memory budget
        // and refills finished rows' slots with waiting prompts.
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .zip(&rendered)
            .map(|(p, (_, ids))| GenerationRequest { prompt_ids: ids.clone(), seed: p.seed, adapter: adapter.clone() })
            .collect();
        let started = Instant::now();
        let (generations, stats) = policy.generate_with_stats(&requests, &self.settings)?;
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            policy = name,
            rows = requests.len(),
            slots = stats.slots,
            kv_cache_mib = stats.kv_cache_bytes >> 20,
            prefill_tokens = stats.prefill_tokens,
            shared_prefills = stats.shared_prefills,
            generated_tokens = stats.generated_tokens,
            seconds,
            prefill_seconds = stats.prefill_seconds,
            decode_seconds = stats.decode_seconds,
            tail_seconds = stats.tail_seconds,
            "generated"
        );
        let replies = rendered
            .into_iter()
            .zip(generations)
            .map(|((text, ids), generation)| Reply {
                prompt_text: text,
                prompt_tokens: ids.iter().map(|&t| t as i32).collect(),
                text: generation.text,
                tokens: generation.token_ids.iter().map(|&t| t as i32).collect(),
                logprobs: generation.logprobs,
                finish_reason: serde_json::to_value(generation.finish_reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                seconds,
            })
            .collect();
        Ok(replies)
    }
}
