//! The model behind [`play`](super::play): prompts go through the policy's chat template
//! and tokenizer, then one batched generation per call.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::model::{ChatMessage, GenerationRequest, GenerationSettings, Policy, TemplateOptions};

use super::play::{Prompt, Reply, Responder};

/// Sequences per generation batch: bounds the KV cache, not the result.
const MAX_BATCH: usize = 512;

/// Answers prompts with loaded policies, by name.
pub struct ModelResponder<'a> {
    policies: BTreeMap<String, &'a mut Policy>,
    settings: GenerationSettings,
    max_prompt_tokens: usize,
}

impl<'a> ModelResponder<'a> {
    pub fn new(
        policies: BTreeMap<String, &'a mut Policy>,
        settings: GenerationSettings,
        max_prompt_tokens: usize,
    ) -> ModelResponder<'a> {
        ModelResponder { policies, settings, max_prompt_tokens }
    }
}

/// The chat rendering every agent prompt gets: one user message, answer directly
/// (Qwen3's non-thinking mode; other templates ignore the flag).
pub fn chat_prompt(policy: &Policy, text: &str) -> Result<(String, Vec<i64>), crate::model::Error> {
    let options = TemplateOptions { add_generation_prompt: true, enable_thinking: Some(false) };
    policy.encode_chat(&[ChatMessage::new("user", text)], &options)
}

/// The one adapter a LoRA policy samples and trains with; None for full models.
pub fn adapter_of(policy: &Policy) -> Option<String> {
    policy.adapter_names().into_iter().next()
}

impl Responder for ModelResponder<'_> {
    fn respond(&mut self, name: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, crate::model::Error> {
        let policy = self
            .policies
            .get_mut(name)
            .ok_or_else(|| crate::model::Error::Request { reason: format!("policy {name:?} is not loaded") })?;
        let adapter = adapter_of(policy);
        let mut rendered = Vec::with_capacity(prompts.len());
        for prompt in prompts {
            let (text, mut ids) = chat_prompt(policy, &prompt.text)?;
            if ids.len() > self.max_prompt_tokens {
                ids.drain(..ids.len() - self.max_prompt_tokens);
            }
            rendered.push((text, ids));
        }
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
