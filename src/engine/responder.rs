//! The two responders: prompts go through the policy's chat template and tokenizer
//! ([`LanguageModel::agent_prompt`](crate::model::LanguageModel::agent_prompt)), then petting's own
//! sampler ([`ModelResponder`]: one batched generation per call) or a vLLM server
//! ([`VllmResponder`]: the rendered token ids, one request each, all in flight).

use std::time::Instant;

use futures::StreamExt;
use serde_json::Value;

use crate::model::{GenerationRequest, GenerationSettings, SamplingConfig};
use crate::policies::LoadedPolicies;

use super::client::CompletionRequest;
use super::{EngineKind, Error, Prompt, Reply, Responder, Served, VllmClient};

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
    fn fits(&mut self, name: &str, text: &str) -> Result<bool, Error> {
        let (policy, _) = self.policies.model(name).ok_or_else(|| not_loaded(name))?;
        fits(policy, text, self.max_prompt_tokens)
    }

    fn prompt_limit(&self) -> usize {
        self.max_prompt_tokens
    }

    fn chat_text(&mut self, name: &str, messages: &Value, tools: Option<&Value>) -> Result<String, Error> {
        chat_text(self.policies, name, messages, tools)
    }

    fn encode(&mut self, name: &str, text: &str) -> Result<Vec<i64>, Error> {
        encode(self.policies, name, text)
    }

    fn respond(&mut self, name: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, Error> {
        self.respond_watched(name, prompts, &mut |_, _, _| {})
    }

    fn respond_watched(
        &mut self,
        name: &str,
        prompts: &[Prompt],
        watch: &mut dyn FnMut(usize, f64, u64),
    ) -> Result<Vec<Reply>, Error> {
        let (policy, adapter) = self.policies.model(name).ok_or_else(|| not_loaded(name))?;
        let adapter = adapter.map(str::to_owned);
        let rendered = render(policy, prompts, self.max_prompt_tokens)?;
        // One call for every prompt: the sampler sizes its batches from its memory budget
        // and refills finished rows' slots with waiting prompts.
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .zip(&rendered)
            .map(|(p, (_, ids))| GenerationRequest {
                prompt_ids: ids.clone(),
                seed: p.seed,
                adapter: adapter.clone(),
                images: None,
            })
            .collect();
        let started = Instant::now();
        // A reply is done by its last token, or by a token-limit's worth of tokens.
        let per_token = 1.0 / self.settings.max_new_tokens.max(1) as f64;
        let (generations, stats) = policy.generate_watched(&requests, &self.settings, &mut |index, tokens, last| {
            let part = if last { 1.0 - (tokens - 1) as f64 * per_token } else { per_token };
            watch(index, part, 1)
        })?;
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
                engine: EngineKind::Tch,
                engine_model: name.to_string(),
            })
            .collect();
        Ok(replies)
    }
}

/// Each prompt as the model sees it: (text, ids), rendered here unless the caller did.
fn render(
    policy: &crate::model::LanguageModel,
    prompts: &[Prompt],
    max_tokens: usize,
) -> Result<Vec<(String, Vec<i64>)>, Error> {
    let one = |p: &Prompt| match &p.tokens {
        None => policy.agent_prompt(&p.text, max_tokens),
        Some(ids) if ids.len() > max_tokens => Err(crate::model::Error::PromptTooLong {
            tokens: ids.len(),
            limit: max_tokens,
            start: p.text.chars().take(80).collect(),
        }),
        Some(ids) => Ok((p.text.clone(), ids.clone())),
    };
    Ok(prompts.iter().map(one).collect::<Result<_, _>>()?)
}

fn chat_text(
    policies: &mut LoadedPolicies,
    name: &str,
    messages: &Value,
    tools: Option<&Value>,
) -> Result<String, Error> {
    let (policy, _) = policies.model(name).ok_or_else(|| not_loaded(name))?;
    Ok(policy.chat_text(messages, tools)?)
}

fn encode(policies: &mut LoadedPolicies, name: &str, text: &str) -> Result<Vec<i64>, Error> {
    let (policy, _) = policies.model(name).ok_or_else(|| not_loaded(name))?;
    Ok(policy.require_tokenizer()?.encode(text, false)?)
}

/// Whether `text`, rendered as `policy` renders agent prompts, is at most `max_tokens`.
fn fits(policy: &crate::model::LanguageModel, text: &str, max_tokens: usize) -> Result<bool, Error> {
    match policy.agent_prompt(text, max_tokens) {
        Ok(_) => Ok(true),
        Err(crate::model::Error::PromptTooLong { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn not_loaded(name: &str) -> crate::model::Error {
    crate::model::Error::Request { reason: format!("policy {name:?} is not loaded") }
}

/// Answers prompts through a vLLM server that holds the stage's versions ([`Served`]).
pub struct VllmResponder<'a> {
    pub policies: &'a mut LoadedPolicies,
    pub client: &'a VllmClient,
    pub served: &'a Served,
    pub sampling: &'a SamplingConfig,
    pub max_prompt_tokens: usize,
    pub max_concurrent_requests: usize,
}

impl Responder for VllmResponder<'_> {
    fn fits(&mut self, name: &str, text: &str) -> Result<bool, Error> {
        let (policy, _) = self.policies.model(name).ok_or_else(|| not_loaded(name))?;
        fits(policy, text, self.max_prompt_tokens)
    }

    fn prompt_limit(&self) -> usize {
        self.max_prompt_tokens
    }

    fn chat_text(&mut self, name: &str, messages: &Value, tools: Option<&Value>) -> Result<String, Error> {
        chat_text(self.policies, name, messages, tools)
    }

    fn encode(&mut self, name: &str, text: &str) -> Result<Vec<i64>, Error> {
        encode(self.policies, name, text)
    }

    fn respond(&mut self, name: &str, prompts: &[Prompt]) -> Result<Vec<Reply>, Error> {
        self.respond_watched(name, prompts, &mut |_, _, _| {})
    }

    fn respond_watched(
        &mut self,
        name: &str,
        prompts: &[Prompt],
        watch: &mut dyn FnMut(usize, f64, u64),
    ) -> Result<Vec<Reply>, Error> {
        let served = self.served.name(name).ok_or_else(|| not_loaded(name))?.to_string();
        let (policy, _) = self.policies.model(name).ok_or_else(|| not_loaded(name))?;
        let stop_token_ids = policy.config().eos_token_ids.clone();
        let rendered = render(policy, prompts, self.max_prompt_tokens)?;
        let requests: Vec<CompletionRequest> = prompts
            .iter()
            .zip(&rendered)
            .map(|(p, (_, ids))| CompletionRequest {
                model: &served,
                prompt_ids: ids,
                sampling: self.sampling,
                seed: p.seed,
                stop_token_ids: &stop_token_ids,
            })
            .collect();
        let started = Instant::now();
        let client = self.client;
        let completions: Vec<_> = tokio::runtime::Handle::current().block_on(
            futures::stream::iter(&requests)
                .map(|r| client.complete(r))
                .buffered(self.max_concurrent_requests)
                .enumerate()
                .inspect(|(index, completion)| {
                    if let Ok(completion) = completion {
                        watch(*index, 1.0, completion.token_ids.len() as u64);
                    }
                })
                .map(|(_, completion)| completion)
                .collect(),
        );
        let seconds = started.elapsed().as_secs_f64();
        let tokenizer = policy.require_tokenizer()?;
        let mut replies = Vec::with_capacity(prompts.len());
        for ((text, ids), completion) in rendered.into_iter().zip(completions) {
            let completion = completion?;
            replies.push(Reply {
                prompt_text: text,
                prompt_tokens: ids.iter().map(|&t| t as i32).collect(),
                text: tokenizer.decode(&completion.token_ids, true)?,
                tokens: completion.token_ids.iter().map(|&t| t as i32).collect(),
                logprobs: completion.logprobs,
                finish_reason: completion.finish_reason,
                seconds,
                engine: EngineKind::Vllm,
                engine_model: served.clone(),
            });
        }
        tracing::info!(policy = name, served, rows = replies.len(), seconds, "generated through vLLM");
        Ok(replies)
    }
}
