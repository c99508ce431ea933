//! The model behind [`play`](super::play): prompts go through the policy's chat template
//! and tokenizer ([`Policy::agent_prompt`](crate::model::Policy::agent_prompt)), then one
//! batched generation per call.

use std::time::Instant;

use crate::model::{GenerationRequest, GenerationSettings};
use crate::policies::LoadedPolicies;

use super::{Prompt, Reply, Responder};

/// Sequences per generation batch: bounds the KV cache, not the result.
const MAX_BATCH: usize = 512;

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
        let mut replies = Vec::with_capacity(prompts.len());
        for (chunk, texts) in prompts.chunks(MAX_BATCH).zip(rendered.chunks(MAX_BATCH)) {
            let requests: Vec<GenerationRequest> = chunk
                .iter()
                .zip(texts)
                .map(|(p, (_, ids))| GenerationRequest {
                    prompt_ids: ids.clone(),
                    seed: p.seed,
                    adapter: adapter.clone(),
                })
                .collect();
            let started = Instant::now();
            let generations = policy.generate(&requests, &self.settings)?;
            let seconds = started.elapsed().as_secs_f64();
            for ((text, ids), generation) in texts.iter().zip(generations) {
                replies.push(Reply {
                    prompt_text: text.clone(),
                    prompt_tokens: ids.iter().map(|&t| t as i32).collect(),
                    text: generation.text,
                    tokens: generation.token_ids.iter().map(|&t| t as i32).collect(),
                    logprobs: generation.logprobs,
                    finish_reason: serde_json::to_value(generation.finish_reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    seconds,
                });
            }
        }
        Ok(replies)
    }
}
