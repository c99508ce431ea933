//! Batched generation: a slot per running sequence, refilled as sequences finish.
//!
//! ```text
//!  requests ─ one entry per distinct (prompt, adapter) ─► waiting
//!                                                          │ admit while slots are free
//!                                                          ▼
//!  prefill the distinct prompts, ─────────────────► copy each one's cache to its other
//!  each run of tokens they share once                branches
//!                                                          │ sample each row's first token
//!                                                          ▼
//!  decode step: every running slot, one token ◄──┐  a finished row frees its slot,
//!                                                 └─ which the next waiting prompt fills
//! ```
//!
//! Memory is bounded by [`KvBudget`]: the caches hold `slots × (longest prompt +
//! max_new_tokens)` positions, with as many slots as the budget pays for, however many
//! requests come in. A sequence's positions start at its slot's column 0; prefill writes
//! a prompt's tokens after the prefix its slot holds (computed there, or copied from the
//! slot of a prompt that shares it), and a decode step masks each slot's columns past its
//! own length.
//! A row's sample depends only on its seed and its step, and each row computes what it
//! would compute alone, so results do not depend on the budget, the admission order or
//! the batch mates (up to float summation order).

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tch::{Device, Kind, Tensor};

use super::decode_attention::SharedColumns;
use super::decoder::{CacheStep, Pass};
use super::kv_cache::Placement;
use super::language_model::LanguageModel;
use super::lora::Route;
use super::prefill_plan::{self, Segment};
use super::sampler::{Sampler, Sampling};
use super::score::PromptKey;
use super::vision::{ImagePrompt, PromptImages, RowImages};
use super::{Error, Result};

/// One sequence to continue.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub prompt_ids: Vec<i64>,
    /// Seed of this sequence's stream: its draws depend on nothing else.
    pub seed: u64,
    /// The LoRA adapter to sample with; the base model when `None`.
    pub adapter: Option<String>,
    /// The images whose placeholder tokens `prompt_ids` holds, for a vision-language model.
    pub images: Option<Arc<PromptImages>>,
}

/// How much memory the key/value caches of one `generate` may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvBudget {
    /// A share of the device's free memory when generation starts: a quarter of the
    /// available RAM on CPU, 60% of the free GPU memory on CUDA.
    #[default]
    Auto,
    Bytes(u64),
}

impl KvBudget {
    /// From a config's `kv_cache_gib`: unset is [`KvBudget::Auto`].
    pub fn from_gib(gib: Option<f64>) -> KvBudget {
        gib.map_or(KvBudget::Auto, |g| KvBudget::Bytes((g * (1u64 << 30) as f64) as u64))
    }

    /// The budget in bytes on `device`.
    pub fn bytes(self, device: Device) -> u64 {
        match self {
            KvBudget::Bytes(bytes) => bytes,
            KvBudget::Auto => match device {
                Device::Cuda(index) => cuda_free_bytes(index).map_or(FALLBACK_BUDGET, |free| free / 10 * 6),
                _ => available_ram_bytes().map_or(FALLBACK_BUDGET, |available| available / 4),
            },
        }
    }
}

/// The budget when the device's free memory cannot be read.
const FALLBACK_BUDGET: u64 = 4 << 30;

/// Prompt tokens one prefill forward takes at most (a longer prompt is prefilled in
/// chunks): bounds the activations, whatever the number of requests.
const PREFILL_TOKENS: usize = 2048;

/// `MemAvailable` of /proc/meminfo.
fn available_ram_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Whether a packed copy of the weights (`weights` bytes) fits in the RAM available
/// beside the caches the call may fill: packing speeds sampling up, and must never be
/// what runs it out of memory.
fn room_to_pack(available: Option<u64>, weights: u64, kv_budget: u64) -> bool {
    available.is_some_and(|available| available >= weights.saturating_add(kv_budget))
}

/// Free memory of a GPU, as `nvidia-smi` reports it (libtorch does not expose it).
fn cuda_free_bytes(index: usize) -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", &index.to_string()])
        .output()
        .ok()?;
    let mib: u64 = String::from_utf8(out.stdout).ok()?.trim().parse().ok()?;
    Some(mib << 20)
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
    /// Memory for the key/value caches.
    pub kv_budget: KvBudget,
}

impl GenerationSettings {
    pub fn new(sampling: Sampling, max_new_tokens: usize) -> GenerationSettings {
        GenerationSettings {
            sampling,
            max_new_tokens,
            min_new_tokens: 0,
            stop_strings: Vec::new(),
            eos_token_ids: None,
            kv_budget: KvBudget::Auto,
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
    /// Logprob of each sampled token under the distribution it was drawn from
    /// (softmax(logits / temperature); temperature 1 for greedy decoding).
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
}

/// Where the time and memory of one `generate` went.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerationStats {
    /// Sequences the caches held at once.
    pub slots: usize,
    /// Bytes of the key/value caches.
    pub kv_cache_bytes: u64,
    /// Prompt tokens computed (each run of tokens that prompts share once).
    pub prefill_tokens: usize,
    /// Rows that started from another row's prefilled prompt.
    pub shared_prefills: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Decode time with nothing waiting and fewer than half the slots running.
    pub tail_seconds: f64,
    pub decode_steps: usize,
    pub generated_tokens: usize,
}

/// The requests of a distinct (prompt, adapter) still waiting to start.
struct Waiting {
    requests: VecDeque<usize>,
}

/// A running sequence; its slot is its index among the running rows.
struct Row {
    request: usize,
    /// Positions in its cache.
    len: i64,
    /// The slot whose first columns this row's cache holds a copy of, and how many: the
    /// decode attention reads them there ([`SharedColumns`]). Cleared when that slot
    /// changes hands.
    shares: Option<(usize, i64)>,
    tokens: Vec<i64>,
    logprobs: Vec<f32>,
}

/// The generations finished so far, in request order, and who hears of each token.
struct Done<'a> {
    generations: Vec<Option<Generation>>,
    watch: &'a mut dyn FnMut(usize, usize, bool),
}

/// What stays fixed for one call.
struct Call<'a> {
    requests: &'a [GenerationRequest],
    settings: &'a GenerationSettings,
    adapters: Vec<Option<usize>>,
    /// Each request's images, checked against its prompt, with their features.
    images: Vec<Option<Rc<ImagePrompt>>>,
    eos: Vec<i64>,
    sampler: Sampler,
    /// Tokens of the longest stop string, plus one: a stop string that the newest token
    /// completes lies within that many last tokens.
    stop_window: usize,
}

impl LanguageModel {
    /// Continues every request; results are in request order. Runs under `no_grad`.
    pub fn generate(
        &mut self,
        requests: &[GenerationRequest],
        settings: &GenerationSettings,
    ) -> Result<Vec<Generation>> {
        self.generate_with_stats(requests, settings).map(|(generations, _)| generations)
    }

    /// [`generate`](LanguageModel::generate), with where its time and memory went.
    pub fn generate_with_stats(
        &mut self,
        requests: &[GenerationRequest],
        settings: &GenerationSettings,
    ) -> Result<(Vec<Generation>, GenerationStats)> {
        self.generate_watched(requests, settings, &mut |_, _, _| {})
    }

    /// [`generate_with_stats`](LanguageModel::generate_with_stats), telling `watch` of every
    /// token as it is sampled: the request's index, its tokens so far, and whether that
    /// was its last.
    pub fn generate_watched(
        &mut self,
        requests: &[GenerationRequest],
        settings: &GenerationSettings,
        watch: &mut dyn FnMut(usize, usize, bool),
    ) -> Result<(Vec<Generation>, GenerationStats)> {
        let during = || {
            let longest = requests.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(0);
            format!(
                "generating {} sequences (prompts up to {longest} tokens, {} new tokens)",
                requests.len(),
                settings.max_new_tokens
            )
        };
        let device = self.device();
        let result = super::guard(during, || {
            tch::no_grad(|| {
                self.lm.pack_weights(|weights| {
                    room_to_pack(available_ram_bytes(), weights, settings.kv_budget.bytes(device))
                })?;
                self.generate_inner(requests, settings, watch)
            })
        });
        self.lm.unpack_weights();
        self.lm.clear_kv_cache();
        result
    }

    fn generate_inner(
        &mut self,
        requests: &[GenerationRequest],
        settings: &GenerationSettings,
        watch: &mut dyn FnMut(usize, usize, bool),
    ) -> Result<(Vec<Generation>, GenerationStats)> {
        let mut stats = GenerationStats::default();
        if requests.is_empty() {
            return Ok((Vec::new(), stats));
        }
        let call = self.call(requests, settings)?;
        let slots = self.reserve_slots(requests, settings)?;
        stats.slots = slots;
        let mut waiting = distinct_prompts(requests);
        let mut running: Vec<Row> = Vec::with_capacity(slots);
        let mut done = Done { generations: vec![None; requests.len()], watch };
        loop {
            let started = Instant::now();
            let joined = self.admit(&mut waiting, &mut running, slots, &mut stats);
            if !joined.sources.is_empty() {
                let logits = self.prefill(&call, &mut running, &joined, &mut stats);
                self.sample_and_retire(&call, &logits, &mut running, joined.first, &mut done)?;
                stats.prefill_seconds += started.elapsed().as_secs_f64();
                stats.kv_cache_bytes = stats.kv_cache_bytes.max(self.lm.kv_cache_bytes());
                continue;
            }
            if running.is_empty() {
                break;
            }
            let started = Instant::now();
            let tail = waiting.is_empty() && running.len() * 2 < slots;
            let logits = self.decode_step(&call, &mut running);
            self.sample_and_retire(&call, &logits, &mut running, 0, &mut done)?;
            let seconds = started.elapsed().as_secs_f64();
            stats.decode_seconds += seconds;
            stats.decode_steps += 1;
            if tail {
                stats.tail_seconds += seconds;
            }
        }
        let generations: Vec<Generation> =
            done.generations.into_iter().map(|g| g.expect("every request finishes")).collect();
        stats.generated_tokens = generations.iter().map(|g| g.token_ids.len()).sum();
        Ok((generations, stats))
    }

    /// Checks the requests and settles what every step needs.
    fn call<'a>(&self, requests: &'a [GenerationRequest], settings: &'a GenerationSettings) -> Result<Call<'a>> {
        if let Some(r) = requests.iter().find(|r| r.prompt_ids.is_empty()) {
            return Err(Error::Request { reason: format!("request with seed {} has an empty prompt", r.seed) });
        }
        let vocab = self.lm.config.vocab_size as i64;
        if let Some(id) = requests.iter().flat_map(|r| &r.prompt_ids).find(|&&id| id < 0 || id >= vocab) {
            return Err(Error::Request {
                reason: format!("prompt token id {id} is outside the vocabulary (size {vocab})"),
            });
        }
        let stop_window = match settings.stop_strings.iter().map(String::len).max() {
            None => 0,
            // Every token of a byte-level vocabulary is at least one byte.
            Some(bytes) => {
                self.require_tokenizer()?;
                bytes + 1
            }
        };
        let adapters = requests
            .iter()
            .map(|r| r.adapter.as_deref().map(|n| self.adapter_slot(n)).transpose())
            .collect::<Result<_>>()?;
        Ok(Call {
            requests,
            settings,
            adapters,
            images: self.image_prompts(requests.iter().map(|r| (r.prompt_ids.as_slice(), r.images.as_deref())))?,
            eos: settings.eos_token_ids.clone().unwrap_or_else(|| self.lm.config.eos_token_ids.clone()),
            sampler: Sampler::new(settings.sampling),
            stop_window,
        })
    }

    /// Sizes the caches from the budget: as many slots as it pays for, at most one per request.
    fn reserve_slots(&mut self, requests: &[GenerationRequest], settings: &GenerationSettings) -> Result<usize> {
        let longest = requests.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(0);
        let capacity = (longest + settings.max_new_tokens) as u64;
        let per_slot = capacity * self.lm.kv_bytes_per_position(self.kind());
        let budget = settings.kv_budget.bytes(self.device());
        let slots = (budget / per_slot).min(requests.len() as u64) as usize;
        if slots == 0 {
            return Err(Error::Request {
                reason: format!(
                    "the key/value cache budget of {budget} bytes holds no sequence: one of {longest} prompt + {} new \
                     tokens needs {per_slot} bytes (raise kv_cache_gib or lower max_new_tokens)",
                    settings.max_new_tokens
                ),
            });
        }
        self.lm.reserve_kv_cache(slots as i64, capacity as i64);
        Ok(slots)
    }

    /// Moves waiting requests into free slots, each distinct prompt's branches together:
    /// the first branch of each prompt in one run of slots (what is prefilled), the other
    /// branches after them. A prompt with more branches than free slots waits, unless
    /// nothing runs, when it takes what is free.
    fn admit(
        &self,
        waiting: &mut VecDeque<Waiting>,
        running: &mut Vec<Row>,
        slots: usize,
        stats: &mut GenerationStats,
    ) -> Joined {
        let mut free = slots - running.len();
        let mut firsts = Vec::new();
        let mut others = Vec::new();
        for w in waiting.iter_mut() {
            let alone = running.is_empty() && firsts.is_empty();
            if free == 0 || !(w.requests.len() <= free || alone) {
                break;
            }
            let take = w.requests.len().min(free);
            free -= take;
            let source = firsts.len();
            firsts.push(w.requests.pop_front().expect("a waiting prompt has requests"));
            others.extend(w.requests.drain(..take - 1).map(|r| (r, source)));
            stats.shared_prefills += take - 1;
        }
        waiting.retain(|w| !w.requests.is_empty());
        let joined = Joined {
            first: running.len(),
            distinct: firsts.len(),
            sources: (0..firsts.len()).chain(others.iter().map(|&(_, s)| s)).collect(),
        };
        for request in firsts.into_iter().chain(others.into_iter().map(|(r, _)| r)) {
            running.push(Row { request, len: 0, shares: None, tokens: Vec::new(), logprobs: Vec::new() });
        }
        joined
    }

    /// Prefills the distinct prompts of the rows that joined and copies each one's cache
    /// to its other branches; returns every joined row's next-token logits, (joined, V).
    fn prefill(&mut self, call: &Call, running: &mut [Row], joined: &Joined, stats: &mut GenerationStats) -> Tensor {
        let rows = &mut running[joined.first..];
        for row in rows.iter_mut() {
            row.len = call.requests[row.request].prompt_ids.len() as i64;
        }
        let distinct = &rows[..joined.distinct];
        let prompts = Prompts {
            ids: distinct.iter().map(|r| call.requests[r.request].prompt_ids.as_slice()).collect(),
            adapters: distinct.iter().map(|r| call.adapters[r.request]).collect(),
            images: distinct.iter().map(|r| call.images[r.request].as_deref()).collect(),
            image_keys: distinct.iter().map(|r| call.requests[r.request].images.as_ref().map(|i| &*i.key)).collect(),
        };
        let (last_hidden, computed, copied) = self.prefill_prompts(&prompts, joined.first as i64);
        stats.prefill_tokens += computed;
        for (row, shares) in rows.iter_mut().zip(copied) {
            row.shares = shares;
        }
        for (k, &source) in joined.sources.iter().enumerate().skip(joined.distinct) {
            let (from, to) = (joined.first + source, joined.first + k);
            self.lm.copy_kv_slot(from as i64, to as i64, rows[k].len);
            rows[k].shares = Some((from, rows[k].len));
        }
        let logits = self.lm.sampling_head(&last_hidden);
        let sources: Vec<i64> = joined.sources.iter().map(|&s| s as i64).collect();
        logits.index_select(0, &Tensor::from_slice(&sources).to_device(logits.device()))
    }

    /// Runs the prompts through the model into slots `first..`, each run of tokens that
    /// prompts share computed once ([`prefill_plan`]), at most [`PREFILL_TOKENS`]
    /// positions per forward; returns each prompt's last hidden state, (B, E), the tokens
    /// computed, and the slot each prompt's first columns were copied from, with how many.
    fn prefill_prompts(&mut self, prompts: &Prompts, first: i64) -> (Tensor, usize, Vec<Option<(usize, i64)>>) {
        let mut last: Vec<Option<Tensor>> = (0..prompts.ids.len()).map(|_| None).collect();
        let mut copied = vec![None; prompts.ids.len()];
        let mut computed = 0;
        // Prompts share computed tokens only with the same adapter and the same images.
        let groups: Vec<_> = prompts.adapters.iter().zip(&prompts.image_keys).collect();
        for level in prefill_plan::plan(&prompts.ids, &groups) {
            computed += level.iter().map(|s| s.end - s.start).sum::<usize>();
            for segment in &level {
                if let Some(from) = segment.copy_from {
                    let (from, len) = (first + from as i64, segment.start as i64);
                    self.lm.copy_kv_slot(from, first + segment.prompt as i64, len);
                    copied[segment.prompt] = Some((from as usize, len));
                }
            }
            for forward in prefill_plan::forwards(&level, PREFILL_TOKENS) {
                let hidden = self.prefill_forward(prompts, first, &forward);
                for (row, segment) in forward.iter().enumerate() {
                    if segment.end == prompts.ids[segment.prompt].len() {
                        let at = (segment.end - segment.start - 1) as i64;
                        last[segment.prompt] = Some(hidden.get(row as i64).get(at));
                    }
                }
            }
        }
        let last: Vec<Tensor> = last.into_iter().map(|t| t.expect("every prompt ends in a segment")).collect();
        (Tensor::stack(&last, 0), computed, copied)
    }

    /// One forward over segments of prompts, right-padded, each into its prompt's slot on
    /// top of the columns that slot holds; returns the hidden states, (B, L, E).
    fn prefill_forward(&mut self, prompts: &Prompts, first: i64, segments: &[Segment]) -> Tensor {
        let device = self.device();
        let l = segments.iter().map(|s| s.end - s.start).max().unwrap_or(0);
        let pad = self.pad_id();
        let ids: Vec<Vec<i64>> = segments
            .iter()
            .map(|s| {
                let tokens = &prompts.ids[s.prompt][s.start..s.end];
                tokens.iter().copied().chain(std::iter::repeat_n(pad, l - tokens.len())).collect()
            })
            .collect();
        let positions: Vec<i64> = segments.iter().flat_map(|s| (s.start..s.start + l).map(|p| p as i64)).collect();
        let positions = Tensor::from_slice(&positions).view([segments.len() as i64, l as i64]).to_device(device);
        let (cos, sin) = self.rope(&rope_positions(prompts, segments, l).to_device(device));
        let placed: Vec<(i64, i64, i64)> =
            segments.iter().map(|s| (first + s.prompt as i64, s.start as i64, (s.end - s.start) as i64)).collect();
        let placement = Placement::new(&placed, l as i64, device);
        // Rows on top of cached columns see all of them and their own positions causally.
        let mask = (!placement.fresh()).then(|| {
            let keys = Tensor::arange(placement.span(), (Kind::Int64, device)).view([1, 1, 1, -1]);
            keys.le_tensor(&positions.unsqueeze(1).unsqueeze(-1))
        });
        let row_adapters: Vec<Option<usize>> = segments.iter().map(|s| prompts.adapters[s.prompt]).collect();
        let route = Route::new(&row_adapters, device, None);
        let pass =
            Pass { cos, sin, mask, causal: true, cache: CacheStep::Placed(&placement), route: &route, packed: true };
        let images: Vec<RowImages> = segments
            .iter()
            .enumerate()
            .filter_map(|(row, s)| Some(prompts.images[s.prompt]?.features_in(row as i64, s.start, s.end)))
            .collect();
        let embeddings = self.embed_with_images(&self.ids_tensor(&ids), &images);
        self.lm.hidden_of_embeddings(embeddings, &pass)
    }

    /// Feeds every running row its last sampled token; returns the next-token logits, (n, V).
    fn decode_step(&mut self, call: &Call, running: &mut [Row]) -> Tensor {
        let device = self.device();
        let n = running.len() as i64;
        let lens: Vec<i64> = running.iter().map(|r| r.len).collect();
        let next: Vec<i64> = running.iter().map(|r| *r.tokens.last().expect("a running row has sampled")).collect();
        let columns = Tensor::from_slice(&lens).to_device(device);
        let span = lens.iter().max().copied().unwrap_or(0) + 1;
        // Rows of equal length attend to every column; otherwise each only to its own.
        let mask = lens.iter().any(|&l| l != lens[0]).then(|| {
            Tensor::arange(span, (Kind::Int64, device)).view([1, 1, 1, span]).le_tensor(&columns.view([n, 1, 1, 1]))
        });
        // A row after images is at its column plus its prompt's delta, on every axis.
        let deltas: Vec<i64> =
            running.iter().map(|r| call.images[r.request].as_ref().map_or(0, |i| i.delta())).collect();
        let rope = (&columns + Tensor::from_slice(&deltas).to_device(device)).view([1, n, 1]).expand([3, n, 1], false);
        let (cos, sin) = self.rope(&rope);
        let slots: Vec<Option<usize>> = running.iter().map(|r| call.adapters[r.request]).collect();
        let route = Route::new(&slots, device, None);
        let shared = SharedColumns::new(&running.iter().map(|r| r.shares).collect::<Vec<_>>());
        let pass = Pass {
            cos,
            sin,
            mask,
            causal: false,
            cache: CacheStep::Columns { columns: &columns, span, shared: &shared },
            route: &route,
            packed: true,
        };
        let logits = self.lm.logits_last(&Tensor::from_slice(&next).view([n, 1]).to_device(device), &pass);
        for row in running.iter_mut() {
            row.len += 1;
        }
        logits
    }

    /// Samples the next token of rows `first..` from their logits, then retires the rows
    /// that finished: each one's slot takes the last running row (and its cache).
    fn sample_and_retire(
        &mut self,
        call: &Call,
        logits: &Tensor,
        running: &mut Vec<Row>,
        first: usize,
        done: &mut Done,
    ) -> Result<()> {
        let rows = &running[first..];
        let seeds: Vec<u64> = rows.iter().map(|r| call.requests[r.request].seed).collect();
        let steps: Vec<u64> = rows.iter().map(|r| r.tokens.len() as u64).collect();
        let banned: Vec<(usize, i64)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.tokens.len() < call.settings.min_new_tokens)
            .flat_map(|(i, _)| call.eos.iter().map(move |&id| (i, id)))
            .collect();
        let (tokens, logprobs) = call.sampler.sample(logits, &seeds, &steps, &banned);
        let mut finished = Vec::new();
        for (i, (token, logprob)) in tokens.into_iter().zip(logprobs).enumerate() {
            let slot = first + i;
            let row = &mut running[slot];
            row.tokens.push(token);
            row.logprobs.push(logprob);
            let reason = self.finish_reason(call, row)?;
            (done.watch)(row.request, row.tokens.len(), reason.is_some());
            if let Some(reason) = reason {
                done.generations[row.request] = Some(self.finish(row, reason)?);
                finished.push(slot);
            }
        }
        // Highest slot first, so that the row moved into a freed slot is still running.
        for &slot in finished.iter().rev() {
            let last = running.len() - 1;
            if slot != last {
                self.lm.copy_kv_slot(last as i64, slot as i64, running[last].len);
            }
            running.swap_remove(slot);
            // Rows that read the finished row's columns read their own copies now; those
            // that read the moved row's read them in its new slot.
            for row in running.iter_mut() {
                row.shares = match row.shares {
                    Some((from, _)) if from == slot => None,
                    Some((from, len)) if from == last => Some((slot, len)),
                    shares => shares,
                };
            }
        }
        Ok(())
    }

    fn finish_reason(&self, call: &Call, row: &Row) -> Result<Option<FinishReason>> {
        let token = *row.tokens.last().expect("a token was just pushed");
        Ok(if call.eos.contains(&token) {
            Some(FinishReason::Eos)
        } else if self.hit_stop_string(call, &row.tokens)? {
            Some(FinishReason::Stop)
        } else if row.tokens.len() >= call.settings.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        })
    }

    /// Whether the newest tokens' text contains a stop string: only the last
    /// `stop_window` tokens are decoded, so a check costs the same at every length.
    fn hit_stop_string(&self, call: &Call, tokens: &[i64]) -> Result<bool> {
        if call.stop_window == 0 {
            return Ok(false);
        }
        let tail = &tokens[tokens.len().saturating_sub(call.stop_window)..];
        let text = self.require_tokenizer()?.decode(tail, false)?;
        Ok(call.settings.stop_strings.iter().any(|s| text.contains(s.as_str())))
    }

    fn finish(&self, row: &mut Row, reason: FinishReason) -> Result<Generation> {
        let text = match &self.tokenizer {
            Some(t) => t.decode(&row.tokens, true)?,
            None => String::new(),
        };
        Ok(Generation {
            token_ids: std::mem::take(&mut row.tokens),
            text,
            logprobs: std::mem::take(&mut row.logprobs),
            finish_reason: reason,
        })
    }
}

/// The distinct prompts one prefill computes, and what each is computed with.
struct Prompts<'a> {
    ids: Vec<&'a [i64]>,
    adapters: Vec<Option<usize>>,
    images: Vec<Option<&'a ImagePrompt>>,
    image_keys: Vec<Option<&'a str>>,
}

/// Rotary positions (3, B, L) of a prefill forward's segments, padded to `l`: a text
/// prompt's token i is at i on every axis, an image prompt's where its images put it.
fn rope_positions(prompts: &Prompts, segments: &[Segment], l: usize) -> Tensor {
    let mut axes: [Vec<i64>; 3] = Default::default();
    for s in segments {
        let rows = match prompts.images[s.prompt] {
            Some(image) => image.positions(s.start, l),
            None => std::array::from_fn(|_| (s.start..s.start + l).map(|p| p as i64).collect()),
        };
        for (axis, row) in axes.iter_mut().zip(rows) {
            axis.extend(row);
        }
    }
    Tensor::from_slice(&axes.concat()).view([3, segments.len() as i64, l as i64])
}

/// The rows that joined in one admission: slots `first..first + sources.len()`, the
/// first `distinct` of them the prompts to prefill; row k copies prompt `sources[k]`.
struct Joined {
    first: usize,
    distinct: usize,
    sources: Vec<usize>,
}

/// The requests grouped by (prompt, adapter), in order of first appearance.
fn distinct_prompts(requests: &[GenerationRequest]) -> VecDeque<Waiting> {
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut index: HashMap<PromptKey, usize> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        let key = (r.prompt_ids.as_slice(), r.adapter.as_deref(), r.images.as_ref().map(|i| i.key.as_str()));
        match index.get(&key) {
            Some(&w) => waiting[w].requests.push_back(i),
            None => {
                index.insert(key, waiting.len());
                waiting.push(Waiting { requests: VecDeque::from([i]) });
            }
        }
    }
    waiting.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_packed_only_where_the_copy_fits_beside_the_caches() {
        let gib = 1u64 << 30;
        assert!(room_to_pack(Some(10 * gib), 2 * gib, 8 * gib));
        assert!(!room_to_pack(Some(10 * gib), 2 * gib + 1, 8 * gib));
        // Unknown free memory (no /proc/meminfo): keep to the plain weights.
        assert!(!room_to_pack(None, 1, 0));
        assert!(!room_to_pack(Some(u64::MAX - 1), u64::MAX, 1));
    }
}
