//! The model behind [`play`](super::play): prompts go through the policy's chat template
//! and tokenizer, then one batched generation per call.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::model::{ChatMessage, GenerationRequest, GenerationSettings, Policy, TemplateOptions};

use super::checkpoints::LoadedPolicy;
use super::play::{Prompt, Reply, Responder};

/// Sequences per generation batch: bounds the KV cache, not the result.
const MAX_BATCH: usize = 512;

/// Answers prompts with loaded policies, by name.
pub struct ModelResponder<'a> {
    policies: &'a mut BTreeMap<String, LoadedPolicy>,
    settings: GenerationSettings,
    max_prompt_tokens: usize,
}

impl<'a> ModelResponder<'a> {
    pub fn new(
        policies: &'a mut BTreeMap<String, LoadedPolicy>,
        settings: GenerationSettings,
        max_prompt_tokens: usize,
    ) -> ModelResponder<'a> {
        ModelResponder { policies, settings, max_prompt_tokens }
    }
}

/// How every agent prompt reaches a model, in rollout, evaluation and the SFT warm start
/// alike: one user message, answer directly (Qwen3's non-thinking mode; other templates
/// ignore the flag), tokens beyond `max_tokens` cut from the left.
pub fn agent_prompt(policy: &Policy, text: &str, max_tokens: usize) -> Result<(String, Vec<i64>), crate::model::Error> {
    let options = TemplateOptions { add_generation_prompt: true, enable_thinking: Some(false) };
    let (text, mut ids) = policy.encode_chat(&[ChatMessage::new("user", text)], &options)?;
    if ids.len() > max_tokens {
        ids.drain(..ids.len() - max_tokens);
    }
    Ok((text, ids))
}

impl Responder for ModelResponder<'_> {
    fn respond(&mut self, name: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::model::Error> {
        let policy = self
            .policies
            .get_mut(name)
            .ok_or_else(|| crate::model::Error::Request { reason: format!("policy {name:?} is not loaded") })?;
        let adapter = policy.adapter().map(str::to_owned);
        let policy = &mut policy.policy;
        let rendered: Vec<(String, Vec<i64>)> =
            prompts.iter().map(|p| agent_prompt(policy, &p.text, self.max_prompt_tokens)).collect::<Result<_, _>>()?;
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
