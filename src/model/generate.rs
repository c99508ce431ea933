//! Batched generation with a KV cache.
//!
//! ```text
//! prompts ─ left-pad ─► prefill (B, P) ─► logits_last ─► sample ─┐
//!                                ▲                               │ append token; stop on
//!                                └── decode step (B, 1) ◄────────┘ EOS / stop string / length
//! ```
//!
//! Prompts of different lengths are left-padded so every row's last prompt token sits
//! in the last column. Padding is masked out of attention, and positions count only real
//! tokens (`cumsum(mask) − 1`, as transformers' `generate`), so a padded row computes
//! what it would compute alone. Rows that finish leave the batch (their cache rows are
//! dropped), so the remaining steps cost only what is still running.

use tch::{Device, Kind, Tensor};

use super::decoder::Pass;
use super::lora::Route;
use super::policy::Policy;
use super::sampler::{Sampler, Sampling};
use super::{Error, Result};

/// One sequence to continue.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub prompt_ids: Vec<i64>,
    /// Seed of this sequence's stream: its draws depend on nothing else.
    pub seed: u64,
    /// The LoRA adapter to sample with; the base model when `None`.
    pub adapter: Option<String>,
}

/// Settings shared by the requests of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationSettings {
    pub sampling: Sampling,
    /// New tokens at most per sequence.
    pub max_new_tokens: usize,
    /// EOS cannot end a sequence before this many tokens (transformers' `min_new_tokens`).
    pub min_new_tokens: usize,
    /// A sequence ends after the token that completes any of these strings.
    pub stop_strings: Vec<String>,
    /// Ids that end a sequence; the config's `eos_token_id` when `None`.
    pub eos_token_ids: Option<Vec<i64>>,
}

impl GenerationSettings {
    pub fn new(sampling: Sampling, max_new_tokens: usize) -> GenerationSettings {
        GenerationSettings {
            sampling,
            max_new_tokens,
            min_new_tokens: 0,
            stop_strings: Vec::new(),
            eos_token_ids: None,
        }
    }

    /// From petting's `sampling` settings (temperature 0 is greedy).
    pub fn from_config(cfg: &super::SamplingConfig) -> GenerationSettings {
        GenerationSettings {
            stop_strings: cfg.stop.clone(),
            ..GenerationSettings::new(Sampling::from_config(cfg), cfg.max_new_tokens as usize)
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// It sampled an EOS id (the EOS token is the last of `token_ids`).
    Eos,
    /// Its text came to contain a stop string (the completing token is the last).
    Stop,
    /// It reached `max_new_tokens`.
    Length,
}

/// One generated continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The sampled tokens, EOS or stop-completing token included.
    pub token_ids: Vec<i64>,
    /// `token_ids` decoded without special tokens (empty when the policy has no tokenizer).
    pub text: String,
    /// Logprob of each sampled token under the unmodified distribution.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
}

/// Bookkeeping of one sequence still in the batch.
struct Running {
    request: usize,
    tokens: Vec<i64>,
    logprobs: Vec<f32>,
    /// Characters of decoded text already searched for stop strings.
    searched: usize,
}

impl Policy {
    /// Continues every request; results are in request order. Runs under `no_grad`.
    pub fn generate(
        &mut self,
        requests: &[GenerationRequest],
        settings: &GenerationSettings,
    ) -> Result<Vec<Generation>> {
        let during = || {
            let longest = requests.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(0);
            format!(
                "generating {} sequences (prompts up to {longest} tokens, {} new tokens)",
                requests.len(),
                settings.max_new_tokens
            )
        };
        super::guard(during, || tch::no_grad(|| self.generate_inner(requests, settings)))
    }

    fn generate_inner(
        &mut self,
        requests: &[GenerationRequest],
        settings: &GenerationSettings,
    ) -> Result<Vec<Generation>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(r) = requests.iter().find(|r| r.prompt_ids.is_empty()) {
            return Err(Error::Request { reason: format!("request with seed {} has an empty prompt", r.seed) });
        }
        let vocab = self.lm.config.vocab_size as i64;
        if let Some(id) = requests.iter().flat_map(|r| &r.prompt_ids).find(|&&id| id < 0 || id >= vocab) {
            return Err(Error::Request {
                reason: format!("prompt token id {id} is outside the vocabulary (size {vocab})"),
            });
        }
        if !settings.stop_strings.is_empty() {
            self.require_tokenizer()?;
        }
        let request_slots: Vec<Option<usize>> = requests
            .iter()
            .map(|r| r.adapter.as_deref().map(|n| self.adapter_slot(n)).transpose())
            .collect::<Result<_>>()?;
        let eos: Vec<i64> = settings.eos_token_ids.clone().unwrap_or_else(|| self.lm.config.eos_token_ids.clone());
        let device = self.device();
        let kind = self.kind();
        let sampler = Sampler::new(settings.sampling);

        // 1. Left-pad: (B, P) ids and the mask of real tokens.
        let p = requests.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(0);
        let pad = self.pad_id();
        let rows: Vec<Vec<i64>> = requests
            .iter()
            .map(|r| std::iter::repeat_n(pad, p - r.prompt_ids.len()).chain(r.prompt_ids.iter().copied()).collect())
            .collect();
        let valid: Vec<Vec<bool>> =
            requests.iter().map(|r| (0..p).map(|j| j >= p - r.prompt_ids.len()).collect()).collect();
        let padded = requests.iter().any(|r| r.prompt_ids.len() < p);
        let mut key_valid = bool_tensor(&valid, device); // (B, S)
        let input = self.ids_tensor(&rows);
        // Positions of real tokens count from 0; padding gets 1 (never attended to).
        let mut positions = (key_valid.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0); // (B, P)

        // 2. Prefill.
        self.lm.clear_kv_cache();
        self.lm.reserve_kv_cache((p + settings.max_new_tokens) as i64);
        let route = Route::new(&request_slots, device, None);
        let (cos, sin) = self.lm.model.rotary.cos_sin(&positions, kind);
        let mask = padded.then(|| prefill_mask(&key_valid));
        let pass = Pass { cos, sin, mask, causal: true, use_cache: true, route: &route };
        let mut logits = self.lm.logits_last(&input, &pass); // (B, V)

        // 3. Decode until every row has finished.
        let mut running: Vec<Running> = (0..requests.len())
            .map(|i| Running { request: i, tokens: Vec::new(), logprobs: Vec::new(), searched: 0 })
            .collect();
        let mut done: Vec<Option<Generation>> = vec![None; requests.len()];
        let mut route = route;
        let mut step = 0usize;
        loop {
            let seeds: Vec<u64> = running.iter().map(|r| requests[r.request].seed).collect();
            let steps = vec![step as u64; running.len()];
            let banned: &[i64] = if step < settings.min_new_tokens { &eos } else { &[] };
            let (tokens, logprobs) = sampler.sample(&logits, &seeds, &steps, banned);
            step += 1;
            let mut keep = Vec::with_capacity(running.len());
            for (row, (token, logprob)) in tokens.iter().zip(&logprobs).enumerate() {
                let run = &mut running[row];
                run.tokens.push(*token);
                run.logprobs.push(*logprob);
                let finish = if eos.contains(token) {
                    Some(FinishReason::Eos)
                } else if self.hit_stop_string(run, &settings.stop_strings)? {
                    Some(FinishReason::Stop)
                } else if run.tokens.len() >= settings.max_new_tokens {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                match finish {
                    Some(reason) => done[run.request] = Some(self.finish(run, reason)?),
                    None => keep.push(row),
                }
            }
            if keep.is_empty() {
                break;
            }
            // Rows that finished leave the batch: cache, masks, routing and bookkeeping.
            let mut next: Vec<i64> = keep.iter().map(|&row| tokens[row]).collect();
            if keep.len() < running.len() {
                let rows = Tensor::from_slice(&keep.iter().map(|&r| r as i64).collect::<Vec<_>>()).to_device(device);
                self.lm.select_kv_rows(&rows);
                key_valid = key_valid.index_select(0, &rows);
                positions = positions.index_select(0, &rows);
                let mut kept = Vec::with_capacity(keep.len());
                for (row, run) in running.drain(..).enumerate() {
                    if keep.contains(&row) {
                        kept.push(run);
                    }
                }
                running = kept;
                let slots: Vec<Option<usize>> = running.iter().map(|r| request_slots[r.request]).collect();
                route = Route::new(&slots, device, None);
            }
            // One new position per row: the next real position, attending to every real key.
            let b = running.len() as i64;
            key_valid = Tensor::cat(&[&key_valid, &Tensor::ones([b, 1], (Kind::Bool, device))], 1);
            positions = positions.narrow(1, positions.size()[1] - 1, 1) + 1;
            let (cos, sin) = self.lm.model.rotary.cos_sin(&positions, kind);
            let mask = padded.then(|| key_valid.view([b, 1, 1, -1]));
            let pass = Pass { cos, sin, mask, causal: false, use_cache: true, route: &route };
            let input = Tensor::from_slice(&next).view([b, 1]).to_device(device);
            next.clear();
            logits = self.lm.logits_last(&input, &pass);
        }
        self.lm.clear_kv_cache();
        Ok(done.into_iter().map(|g| g.expect("every request finishes")).collect())
    }

    /// Decodes the new tail of a row's text and looks for a stop string in it.
    fn hit_stop_string(&self, run: &mut Running, stops: &[String]) -> Result<bool> {
        if stops.is_empty() {
            return Ok(false);
        }
        let text = self.require_tokenizer()?.decode(&run.tokens, false)?;
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        // A stop string may straddle tokens: search from `longest` bytes before the new text.
        let mut from = run.searched.saturating_sub(longest);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = stops.iter().any(|s| text[from..].contains(s.as_str()));
        // The last character may still change as more bytes of it arrive.
        run.searched = text.len().saturating_sub(4);
        Ok(hit)
    }

    fn finish(&self, run: &mut Running, reason: FinishReason) -> Result<Generation> {
        let text = match &self.tokenizer {
            Some(t) => t.decode(&run.tokens, true)?,
            None => String::new(),
        };
        Ok(Generation {
            token_ids: std::mem::take(&mut run.tokens),
            text,
            logprobs: std::mem::take(&mut run.logprobs),
            finish_reason: reason,
        })
    }
}

/// (B, S) booleans as a tensor.
fn bool_tensor(rows: &[Vec<bool>], device: Device) -> Tensor {
    let s = rows.first().map_or(0, Vec::len) as i64;
    let flat: Vec<bool> = rows.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).reshape([rows.len() as i64, s]).to_device(device)
}

/// Prefill mask (B, 1, P, P): causal, real keys only; each padding query sees itself so
/// that no row of the softmax is empty (its output is never used).
pub(crate) fn prefill_mask(key_valid: &Tensor) -> Tensor {
    let (b, p) = key_valid.size2().expect("(B, P) mask");
    let device = key_valid.device();
    let causal = Tensor::ones([p, p], (Kind::Bool, device)).tril(0);
    let eye = Tensor::eye(p, (Kind::Bool, device));
    let keys = key_valid.view([b, 1, 1, p]);
    causal.logical_and(&keys).logical_or(&eye)
}
