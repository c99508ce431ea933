//! Per-token logprobs of given responses, with and without gradients.
//!
//! PPO needs log π(response token | prompt, earlier response tokens) for every response
//! token, under the current weights: [`LanguageModel::score`] without gradients (old logprobs,
//! drift checks), [`LanguageModel::backward`] with them (the loss is the caller's).
//!
//! Requests are packed into micro-batches of at most `max_tokens` padded tokens (longest
//! first, so rows of a micro-batch have similar lengths), which bounds memory whatever
//! the mini-batch size. Rows are right-padded: causal attention never lets a real token
//! see the padding after it, so no mask is needed, and positions are 0..L. Only the
//! hidden states that predict response tokens go through lm_head, which for long prompts
//! saves most of the (N, V) logits.
//!
//! Requests with the same prompt and adapter (a GRPO group's K candidates) share one row
//! when `share_prefix` is on: the prompt once, then every response, each at the
//! positions it would have after the prompt alone, attending to the prompt and to itself
//! only ("prefix grouper"). The loss and gradients are those of K separate rows, and the
//! prompt, usually most of the tokens, is forwarded once instead of K times:
//!
//! With LoRA dropout on, the one prompt forward draws one dropout mask, which the K
//! responses share, where K separate rows would draw K: the same loss in expectation,
//! not draw for draw.
//!
//! ```text
//!   row:       p0 p1 p2 | a0 a1 | b0 b1 b2
//!   position:   0  1  2 |  3  4 |  3  4  5
//!   b1 sees:   p0 p1 p2           b0 b1
//! ```
//!
//! Recomputing activations (gradient checkpointing) keeps only each layer's input (B, L, E) from a no-grad forward,
//! then walks the layers backwards, recomputing one layer at a time with gradients and
//! back-propagating the incoming gradient through it: one extra forward, and activation
//! memory of one layer instead of all.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use tch::{Kind, Tensor};

use super::decoder::{CacheStep, CausalLm, Pass};
use super::language_model::LanguageModel;
use super::lora::Route;
use super::vision::{ImagePrompt, PromptImages, RowImages};
use super::{Error, Result, guard};
use crate::rng::combine;

/// A prompt and a response whose tokens are scored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRequest {
    pub prompt_ids: Vec<i64>,
    pub response_ids: Vec<i64>,
    /// The adapter to score with; the base model when `None`.
    pub adapter: Option<String>,
    /// The images whose placeholder tokens `prompt_ids` holds, for a vision-language model.
    pub images: Option<Arc<PromptImages>>,
}

/// What makes two requests' prompts one computation: (prompt ids, adapter, images).
pub(crate) type PromptKey<'a> = (&'a [i64], Option<&'a str>, Option<&'a str>);

/// How [`LanguageModel::backward`] splits its requests: micro-batches of at most `max_tokens`
/// padded tokens, activations recomputed in the backward pass when `recompute`,
/// lm_head's logits projected at most `max_logits` (tokens × vocabulary) at a time, and
/// a prompt shared by several requests forwarded once when `share_prefix`. The logprobs
/// are those of softmax(logits / `temperature`): the distribution a rollout sampled at
/// that temperature drew from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MicroBatching {
    pub max_tokens: usize,
    pub recompute: bool,
    pub max_logits: i64,
    pub share_prefix: bool,
    pub temperature: f64,
}

impl MicroBatching {
    /// `max_tokens` per micro-batch, logits in chunks of 256 MiB, shared prompts once,
    /// temperature 1.
    pub fn new(max_tokens: usize, recompute: bool) -> MicroBatching {
        MicroBatching { max_tokens, recompute, max_logits: LOGIT_BUDGET, share_prefix: true, temperature: 1.0 }
    }
}

/// One micro-batch, as the loss function sees it.
#[derive(Debug)]
pub struct MicroBatch {
    /// Which requests (indices into the slice passed in) the rows are, in row order.
    pub indices: Vec<usize>,
    /// (b, T) float32 logprobs of response tokens, zero after each row's last token.
    pub logprobs: Tensor,
    /// (b, T) float32: 1 for a real response token, 0 for padding.
    pub mask: Tensor,
}

impl LanguageModel {
    /// Logprobs of every response token, in request order, without gradients.
    pub fn score(&mut self, requests: &[ScoreRequest], max_tokens: usize) -> Result<Vec<Vec<f32>>> {
        self.score_batched(requests, &MicroBatching::new(max_tokens, false))
    }

    /// [`LanguageModel::score`] split as `batching` says.
    pub fn score_batched(&mut self, requests: &[ScoreRequest], batching: &MicroBatching) -> Result<Vec<Vec<f32>>> {
        let during = || format!("scoring {} sequences with {batching:?}", requests.len());
        guard(during, || tch::no_grad(|| self.run_micro_batches(requests, batching, false, 0, &mut |_| Ok(None))))
    }

    /// Computes `loss(micro_batch)` for each micro-batch and back-propagates it,
    /// accumulating gradients in the trainable variables (the base model's, or the
    /// adapters' when the base is frozen). The loss should already carry the weight of its
    /// micro-batch in the mini-batch (e.g. sum of token terms / tokens in the mini-batch).
    /// `seed` keys LoRA dropout. Returns the detached logprobs, in request order.
    pub fn backward(
        &mut self,
        requests: &[ScoreRequest],
        batching: &MicroBatching,
        seed: u64,
        loss: &mut dyn FnMut(&MicroBatch) -> Result<Tensor>,
    ) -> Result<Vec<Vec<f32>>> {
        let mut wrapped = |mb: &MicroBatch| loss(mb).map(Some);
        let during = || format!("training on {} sequences with {batching:?}", requests.len());
        guard(during, || tch::with_grad(|| self.run_micro_batches(requests, batching, true, seed, &mut wrapped)))
    }

    fn run_micro_batches(
        &mut self,
        requests: &[ScoreRequest],
        batching: &MicroBatching,
        training: bool,
        seed: u64,
        loss: &mut dyn FnMut(&MicroBatch) -> Result<Option<Tensor>>,
    ) -> Result<Vec<Vec<f32>>> {
        let vocab = self.lm.config.vocab_size as i64;
        for (i, r) in requests.iter().enumerate() {
            if r.prompt_ids.is_empty() {
                return Err(Error::Request { reason: format!("score request {i} has an empty prompt") });
            }
            if let Some(id) = r.prompt_ids.iter().chain(&r.response_ids).find(|&&id| id < 0 || id >= vocab) {
                return Err(Error::Request {
                    reason: format!("score request {i}: token id {id} is outside the vocabulary (size {vocab})"),
                });
            }
        }
        let images = self.image_prompts(requests.iter().map(|r| (r.prompt_ids.as_slice(), r.images.as_deref())))?;
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); requests.len()];
        let rows = rows(requests, batching.max_tokens, batching.share_prefix);
        for (n, batch) in micro_batches(&rows, batching.max_tokens).into_iter().enumerate() {
            let dropout_seed = combine(seed, n as u64);
            let batch: Vec<&Row> = batch.into_iter().map(|r| &rows[r]).collect();
            let mb = self.micro_batch(requests, &images, &batch, training, batching, dropout_seed, loss)?;
            let values =
                Vec::<f32>::try_from(&mb.logprobs.detach().to_device(tch::Device::Cpu).reshape([-1])).expect("f32");
            let t = mb.logprobs.size()[1] as usize;
            for (row, &i) in mb.indices.iter().enumerate() {
                out[i] = values[row * t..row * t + requests[i].response_ids.len()].to_vec();
            }
        }
        Ok(out)
    }

    /// One micro-batch: forward, logprobs, and (when `loss` gives one) backward.
    #[allow(clippy::too_many_arguments)]
    fn micro_batch(
        &mut self,
        requests: &[ScoreRequest],
        images: &[Option<Rc<ImagePrompt>>],
        batch: &[&Row],
        training: bool,
        batching: &MicroBatching,
        dropout_seed: u64,
        loss: &mut dyn FnMut(&MicroBatch) -> Result<Option<Tensor>>,
    ) -> Result<MicroBatch> {
        let device = self.device();
        let layout = Layout::new(requests, batch, self.pad_id());
        let to_dev = |v: &[i64]| Tensor::from_slice(v).to_device(device);
        let (b, l, t) = (batch.len() as i64, layout.width as i64, layout.response_width as i64);
        let n = layout.indices.len() as i64;
        let (source, target, slot) = (to_dev(&layout.source), to_dev(&layout.target), to_dev(&layout.slot));
        let mask = Tensor::zeros([n * t], (Kind::Float, device)).index_fill(0, &slot, 1.0).view([n, t]);

        let slots: Vec<Option<usize>> = batch
            .iter()
            .map(|row| requests[row.members[0]].adapter.as_deref().map(|n| self.adapter_slot(n)).transpose())
            .collect::<Result<_>>()?;
        let route = Route::new(&slots, device, training.then_some(dropout_seed));
        let input = self.ids_tensor(&layout.ids);
        let (rope, images) = image_rows(images, requests, batch, &layout.positions, l);
        let (cos, sin) = self.rope(&to_dev(&rope).view([3, b, l]));
        let embed = |lm: &LanguageModel| lm.embed_with_images(&input, &images);
        let attention_mask = layout.segments.as_ref().map(|s| shared_prefix_mask(&to_dev(s).view([b, l])));
        let pass =
            Pass { cos, sin, mask: attention_mask, causal: true, cache: CacheStep::None, route: &route, packed: false };

        let indices = layout.indices;
        let rows = ResponseRows {
            source,
            target,
            slot,
            b,
            l,
            n,
            t,
            max_logits: batching.max_logits,
            temperature: batching.temperature,
        };
        if !(batching.recompute && training) {
            let embeddings = embed(self);
            let hidden = self.lm.hidden_of_embeddings(embeddings, &pass);
            return rows.logprobs_and_backward(&self.lm, &hidden, indices, mask, loss);
        }

        // Recomputed activations. 1. No-grad forward keeping each layer's input.
        let embeddings = embed(self);
        let lm = &mut self.lm;
        let mut inputs = Vec::with_capacity(lm.model.layers.len() + 1);
        tch::no_grad(|| {
            let mut x = embeddings.detach();
            for layer in &mut lm.model.layers {
                let y = layer.forward(&x, &pass);
                inputs.push(x);
                x = y;
            }
            inputs.push(x);
        });
        // 2. Head and loss with gradients from the last hidden state.
        let last = inputs.pop().expect("the final hidden state").detach().set_requires_grad(true);
        let mb = rows.logprobs_and_backward(lm, &lm.model.norm.forward(&last), indices, mask, loss)?;
        let mut grad = last.grad();
        if !grad.defined() {
            return Ok(mb);
        }
        // 3. Each layer, last first: recompute with gradients, push the gradient through.
        for (layer, x) in lm.model.layers.iter_mut().zip(inputs).rev() {
            let x = x.detach().set_requires_grad(true);
            let y = layer.forward(&x, &pass);
            (y * &grad).sum(Kind::Float).backward();
            grad = x.grad();
        }
        // 4. The embedding rows.
        if embeddings.requires_grad() {
            (embeddings * &grad).sum(Kind::Float).backward();
        }
        Ok(mb)
    }

    /// Logits of every position of each sequence, (len_i, V) float32, computed in one
    /// left-padded batch with the padding masked out (as a padded prefill).
    pub fn logits(&mut self, sequences: &[Vec<i64>], adapters: &[Option<String>]) -> Result<Vec<Tensor>> {
        let hidden = self.padded_hidden(sequences, adapters)?;
        let logits = tch::no_grad(|| self.lm.head(&hidden).to_kind(Kind::Float));
        Ok(unpad(&logits, sequences))
    }

    /// Final hidden states (B, P, E) of `sequences` left-padded to the longest (P), each
    /// through its adapter, without gradients.
    pub(crate) fn padded_hidden(&mut self, sequences: &[Vec<i64>], adapters: &[Option<String>]) -> Result<Tensor> {
        tch::no_grad(|| self.padded_hidden_trained(sequences, adapters, None))
    }

    /// [`LanguageModel::padded_hidden`] with gradients, to train the adapters it passes
    /// through; their dropout draws from streams keyed by `dropout_seed`, if set.
    pub(crate) fn padded_hidden_trained(
        &mut self,
        sequences: &[Vec<i64>],
        adapters: &[Option<String>],
        dropout_seed: Option<u64>,
    ) -> Result<Tensor> {
        let device = self.device();
        let p = sequences.iter().map(Vec::len).max().unwrap_or(0);
        if sequences.iter().any(Vec::is_empty) {
            return Err(Error::Request { reason: "an empty sequence has no logits".into() });
        }
        let pad = self.pad_id();
        let rows: Vec<Vec<i64>> = sequences
            .iter()
            .map(|s| std::iter::repeat_n(pad, p - s.len()).chain(s.iter().copied()).collect())
            .collect();
        let valid: Vec<bool> = sequences.iter().flat_map(|s| (0..p).map(move |j| j >= p - s.len())).collect();
        let key_valid = Tensor::from_slice(&valid).view([sequences.len() as i64, p as i64]).to_device(device);
        let positions = (key_valid.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1).clamp_min(0);
        let slots: Vec<Option<usize>> = (0..sequences.len())
            .map(|i| adapters.get(i).cloned().flatten().map(|n| self.adapter_slot(&n)).transpose())
            .collect::<Result<_>>()?;
        let route = Route::new(&slots, device, dropout_seed);
        let (cos, sin) = self.lm.model.rotary.cos_sin(&positions, self.kind());
        let padded = sequences.iter().any(|s| s.len() < p);
        let pass = Pass {
            cos,
            sin,
            mask: padded.then(|| prefill_mask(&key_valid)),
            causal: true,
            cache: CacheStep::None,
            route: &route,
            packed: false,
        };
        Ok(self.lm.hidden(&self.ids_tensor(&rows), &pass))
    }
}

/// The rotary positions (3, b, L), flattened, of a micro-batch whose layout puts token
/// j of a row at `positions` (b·L) of its prompt and responses; and the features of
/// each row whose prompt holds images (`images`, by request), at their columns (the
/// prompt opens the row).
fn image_rows(
    images: &[Option<Rc<ImagePrompt>>],
    requests: &[ScoreRequest],
    batch: &[&Row],
    positions: &[i64],
    l: i64,
) -> (Vec<i64>, Vec<RowImages>) {
    let mut axes: [Vec<i64>; 3] = std::array::from_fn(|_| positions.to_vec());
    let mut features = Vec::new();
    for (b, row) in batch.iter().enumerate() {
        let Some(prompt) = &images[row.members[0]] else { continue };
        let span = b * l as usize..(b + 1) * l as usize;
        for (axis, all) in axes.iter_mut().enumerate() {
            for p in &mut all[span.clone()] {
                *p = prompt.position(axis, *p as usize);
            }
        }
        features.push(prompt.features_in(b as i64, 0, requests[row.members[0]].prompt_ids.len()));
    }
    (axes.concat(), features)
}

/// Each sequence's own positions of a left-padded batch (B, P, …).
pub(crate) fn unpad(padded: &Tensor, sequences: &[Vec<i64>]) -> Vec<Tensor> {
    let p = padded.size()[1];
    sequences
        .iter()
        .enumerate()
        .map(|(i, s)| padded.get(i as i64).narrow(0, p - s.len() as i64, s.len() as i64))
        .collect()
}

/// Logits one micro-batch materialises at once by default (tokens × vocabulary): 64 Mi
/// floats, 256 MiB. More response tokens than fit are projected in chunks.
const LOGIT_BUDGET: i64 = 64 << 20;

/// Where a micro-batch's response tokens are: the hidden state at `source[n]` (of the
/// flattened (b·L, E)) predicts token `target[n]`, whose logprob lands at `slot[n]` of
/// the flattened (b, T) output.
struct ResponseRows {
    source: Tensor,
    target: Tensor,
    slot: Tensor,
    /// Rows forwarded and their width: `hidden` is (b, L, E).
    b: i64,
    l: i64,
    /// Requests and their longest response: the output is (n, T).
    n: i64,
    t: i64,
    max_logits: i64,
    temperature: f64,
}

impl ResponseRows {
    /// The response tokens' logprobs under `hidden` (b, L, E), and the loss's gradient
    /// pushed back into `hidden`'s graph when `loss` gives one.
    ///
    /// lm_head's (N, V) float32 logits are the largest tensor of a training step at a
    /// real vocabulary (8,192 tokens × 151,936 is 4.6 GiB, about three times that in
    /// backward). Where N·V exceeds `max_logits`, the logprobs are computed chunk
    /// by chunk without a graph, the loss's gradient with respect to them is taken on
    /// its own, then each chunk is projected again with a graph and back-propagated
    /// with that gradient: one more lm_head forward, and the logits of one chunk alive.
    fn logprobs_and_backward(
        &self,
        lm: &CausalLm,
        hidden: &Tensor,
        indices: Vec<usize>,
        mask: Tensor,
        loss: &mut dyn FnMut(&MicroBatch) -> Result<Option<Tensor>>,
    ) -> Result<MicroBatch> {
        let (b, l, rows, t) = (self.b, self.l, self.n, self.t);
        let e = hidden.size()[2];
        let chosen = hidden.reshape([b * l, e]).index_select(0, &self.source);
        let n = chosen.size()[0];
        let chunk = (self.max_logits / lm.config.vocab_size as i64).max(1);
        let to_bt = |lp: &Tensor| {
            Tensor::zeros([rows * t], (Kind::Float, lp.device())).index_add(0, &self.slot, lp).view([rows, t])
        };
        if n <= chunk {
            let logprobs = to_bt(&token_logprobs(lm, &chosen, &self.target, self.temperature));
            let mb = MicroBatch { indices, logprobs, mask };
            if let Some(value) = loss(&mb)? {
                value.backward();
            }
            return Ok(MicroBatch { logprobs: mb.logprobs.detach(), ..mb });
        }
        let detached = chosen.detach();
        let flat = tch::no_grad(|| {
            let parts: Vec<Tensor> = (0..n)
                .step_by(chunk as usize)
                .map(|start| {
                    let len = chunk.min(n - start);
                    token_logprobs(
                        lm,
                        &detached.narrow(0, start, len),
                        &self.target.narrow(0, start, len),
                        self.temperature,
                    )
                })
                .collect();
            Tensor::cat(&parts, 0)
        });
        let flat = flat.set_requires_grad(true);
        let mb = MicroBatch { indices, logprobs: to_bt(&flat), mask };
        let Some(value) = loss(&mb)? else { return Ok(MicroBatch { logprobs: mb.logprobs.detach(), ..mb }) };
        value.backward();
        let upstream = flat.grad();
        let chosen_leaf = detached.set_requires_grad(true);
        for start in (0..n).step_by(chunk as usize) {
            let len = chunk.min(n - start);
            let lp = token_logprobs(
                lm,
                &chosen_leaf.narrow(0, start, len),
                &self.target.narrow(0, start, len),
                self.temperature,
            );
            (lp * upstream.narrow(0, start, len)).sum(Kind::Float).backward();
        }
        if chosen.requires_grad() {
            (chosen * chosen_leaf.grad()).sum(Kind::Float).backward();
        }
        Ok(MicroBatch { logprobs: mb.logprobs.detach(), ..mb })
    }
}

/// log softmax(head(hidden))[target] for rows (N, E) and targets (N,), in float32.
fn token_logprobs(lm: &CausalLm, hidden: &Tensor, target: &Tensor, temperature: f64) -> Tensor {
    let logits = lm.head(hidden).to_kind(Kind::Float);
    let logits = if temperature == 1.0 { logits } else { logits / temperature };
    logits.gather(1, &target.unsqueeze(1), false).squeeze_dim(1) - logits.logsumexp([1], false)
}

/// One row of a micro-batch: the requests whose prompt it forwards once, then each
/// response in turn.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    members: Vec<usize>,
    len: usize,
}

/// The rows `requests` are forwarded as: with `share`, requests with the same prompt and
/// adapter share a row up to `max_tokens` tokens (more of them start another row);
/// otherwise, one row each.
fn rows(requests: &[ScoreRequest], max_tokens: usize, share: bool) -> Vec<Row> {
    let groups = if share { prompt_groups(requests) } else { (0..requests.len()).map(|i| vec![i]).collect() };
    let mut rows = Vec::new();
    for group in groups {
        let prompt = requests[group[0]].prompt_ids.len();
        let mut row = Row { members: Vec::new(), len: prompt };
        for i in group {
            let response = requests[i].response_ids.len();
            if !row.members.is_empty() && row.len + response > max_tokens {
                rows.push(std::mem::replace(&mut row, Row { members: Vec::new(), len: prompt }));
            }
            row.members.push(i);
            row.len += response;
        }
        rows.push(row);
    }
    rows
}

/// The requests by prompt, adapter and images: indices of the requests that can share a row, in
/// order of first appearance.
pub fn prompt_groups(requests: &[ScoreRequest]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut by_prompt: HashMap<PromptKey, usize> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        let images = r.images.as_ref().map(|i| i.key.as_str());
        let g = *by_prompt.entry((&r.prompt_ids, r.adapter.as_deref(), images)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// Groups rows into micro-batches of at most `max_tokens` padded tokens (rows × longest),
/// longest first; a row longer than the budget gets a micro-batch of its own.
fn micro_batches(rows: &[Row], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].len));
    let mut batches: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match batches.last_mut() {
            // Sorted longest first: the batch's first row is its longest.
            Some(batch) if (batch.len() + 1) * rows[batch[0]].len <= max_tokens => batch.push(i),
            _ => batches.push(vec![i]),
        }
    }
    batches
}

/// A micro-batch laid out as tensors' contents: (b, L) right-padded ids and positions,
/// and for the n requests' response tokens where their logprobs come from and go.
#[derive(Debug, PartialEq)]
struct Layout {
    ids: Vec<Vec<i64>>,
    /// Flattened (b, L).
    positions: Vec<i64>,
    /// Flattened (b, L): 0 for a prompt token, m + 1 for member m's response, −1 for
    /// padding; `None` when no row is shared (plain causal attention).
    segments: Option<Vec<i64>>,
    width: usize,
    /// The requests, in output row order.
    indices: Vec<usize>,
    response_width: usize,
    /// For response token j of request row r: the hidden state at `source` (of the
    /// flattened (b·L, E)) predicts `target`, whose logprob lands at `slot` = r·T + j.
    source: Vec<i64>,
    target: Vec<i64>,
    slot: Vec<i64>,
}

impl Layout {
    fn new(requests: &[ScoreRequest], batch: &[&Row], pad: i64) -> Layout {
        let width = batch.iter().map(|row| row.len).max().unwrap_or(0);
        let indices: Vec<usize> = batch.iter().flat_map(|row| row.members.iter().copied()).collect();
        let response_width = indices.iter().map(|&i| requests[i].response_ids.len()).max().unwrap_or(0);
        let shared = batch.iter().any(|row| row.members.len() > 1);
        let mut layout = Layout {
            ids: Vec::with_capacity(batch.len()),
            positions: Vec::with_capacity(batch.len() * width),
            segments: shared.then(|| Vec::with_capacity(batch.len() * width)),
            width,
            indices,
            response_width,
            source: Vec::new(),
            target: Vec::new(),
            slot: Vec::new(),
        };
        let mut request_row = 0;
        for (b, row) in batch.iter().enumerate() {
            let prompt = &requests[row.members[0]].prompt_ids;
            let p = prompt.len();
            let mut ids = prompt.clone();
            let mut segments = vec![0; p];
            layout.positions.extend(0..p as i64);
            for (m, &i) in row.members.iter().enumerate() {
                let response = &requests[i].response_ids;
                for (j, &token) in response.iter().enumerate() {
                    // Token j is predicted by the one before it: the prompt's last for j = 0.
                    let previous = if j == 0 { p - 1 } else { ids.len() - 1 };
                    layout.source.push((b * width + previous) as i64);
                    layout.target.push(token);
                    layout.slot.push((request_row * response_width + j) as i64);
                    ids.push(token);
                }
                segments.extend(std::iter::repeat_n(m as i64 + 1, response.len()));
                layout.positions.extend((p..p + response.len()).map(|x| x as i64));
                request_row += 1;
            }
            layout.positions.extend(std::iter::repeat_n(0, width - ids.len()));
            segments.resize(width, -1);
            ids.resize(width, pad);
            if let Some(all) = layout.segments.as_mut() {
                all.extend(segments);
            }
            layout.ids.push(ids);
        }
        layout
    }
}

/// (b, 1, L, L) boolean attention mask of shared-prefix rows from their (b, L) segments:
/// a token sees the prompt and its own response up to itself, and itself (so padding,
/// segment −1, never has an empty row).
fn shared_prefix_mask(segments: &Tensor) -> Tensor {
    let (b, l) = segments.size2().expect("(b, L) segments");
    let causal = Tensor::ones([l, l], (Kind::Bool, segments.device())).tril(0);
    let query = segments.view([b, l, 1]);
    let key = segments.view([b, 1, l]);
    let visible = key.eq(0).logical_or(&key.eq_tensor(&query));
    let eye = Tensor::eye(l, (Kind::Bool, segments.device()));
    causal.logical_and(&visible).logical_or(&eye).unsqueeze(1)
}

/// Mask (B, 1, P, P) of left-padded rows: causal, real keys only; each padding query sees
/// itself so that no row of the softmax is empty (its output is never used).
fn prefill_mask(key_valid: &Tensor) -> Tensor {
    let (b, p) = key_valid.size2().expect("(B, P) mask");
    let device = key_valid.device();
    let causal = Tensor::ones([p, p], (Kind::Bool, device)).tril(0);
    let eye = Tensor::eye(p, (Kind::Bool, device));
    let keys = key_valid.view([b, 1, 1, p]);
    causal.logical_and(&keys).logical_or(&eye)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(p: usize, r: usize) -> ScoreRequest {
        ScoreRequest { prompt_ids: vec![1; p], response_ids: vec![2; r], adapter: None, images: None }
    }

    #[test]
    fn packing_respects_the_budget_and_covers_every_request_once() {
        let reqs = vec![req(3, 2), req(10, 5), req(1, 1), req(4, 4), req(20, 30)];
        let batches = micro_batches(&rows(&reqs, 32, false), 32);
        // Longest first: [50] alone (over budget), then 15+8 → 2×15 = 30 ≤ 32, then 5, 2.
        assert_eq!(batches, vec![vec![4], vec![1, 3], vec![0, 2]]);
        let mut all: Vec<usize> = batches.concat();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn requests_share_a_row_when_prompt_and_adapter_agree_and_it_fits() {
        let lora = ScoreRequest { adapter: Some("a".into()), ..req(4, 2) };
        let reqs = vec![req(4, 2), req(3, 1), req(4, 3), lora, req(4, 5)];
        let rows = |max, share| -> Vec<(Vec<usize>, usize)> {
            super::rows(&reqs, max, share).into_iter().map(|r| (r.members, r.len)).collect()
        };
        assert_eq!(rows(100, true), vec![(vec![0, 2, 4], 14), (vec![1], 4), (vec![3], 6)]);
        // 4 + 2 + 3 fits 10; request 4's 5 tokens start a row with the prompt again.
        assert_eq!(rows(10, true), vec![(vec![0, 2], 9), (vec![4], 9), (vec![1], 4), (vec![3], 6)]);
        assert_eq!(rows(100, false).len(), 5);
    }

    #[test]
    fn a_shared_row_places_each_response_after_the_prompt() {
        let reqs = vec![
            ScoreRequest { prompt_ids: vec![10, 11, 12], response_ids: vec![20, 21], adapter: None, images: None },
            ScoreRequest { prompt_ids: vec![10, 11, 12], response_ids: vec![30, 31, 32], adapter: None, images: None },
            ScoreRequest { prompt_ids: vec![40], response_ids: vec![41], adapter: None, images: None },
        ];
        let all = rows(&reqs, 100, true);
        let layout = Layout::new(&reqs, &[&all[0], &all[1]], 0);
        assert_eq!(layout.ids, vec![vec![10, 11, 12, 20, 21, 30, 31, 32], vec![40, 41, 0, 0, 0, 0, 0, 0]]);
        assert_eq!(layout.positions, vec![0, 1, 2, 3, 4, 3, 4, 5, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(layout.segments, Some(vec![0, 0, 0, 1, 1, 2, 2, 2, 0, 1, -1, -1, -1, -1, -1, -1]));
        // 30 is predicted by the prompt's last token (2), not by the response before it.
        assert_eq!(layout.source, vec![2, 3, 2, 5, 6, 8]);
        assert_eq!(layout.target, vec![20, 21, 30, 31, 32, 41]);
        assert_eq!(layout.slot, vec![0, 1, 3, 4, 5, 6]);
        assert_eq!((layout.indices, layout.response_width), (vec![0, 1, 2], 3));
        let unshared = rows(&reqs, 100, false);
        assert_eq!(Layout::new(&reqs, &[&unshared[0]], 0).segments, None);
    }

    #[test]
    fn the_mask_shows_the_prompt_and_the_own_response_only() {
        let segments = Tensor::from_slice(&[0i64, 0, 1, 2, 2, -1]).view([1, 6]);
        let mask = shared_prefix_mask(&segments).squeeze();
        let expected = [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 1, 1, 0],
            [1, 1, 0, 0, 0, 1],
        ];
        let got: Vec<Vec<i64>> = Vec::try_from(mask.to_kind(Kind::Int64)).unwrap();
        assert_eq!(got, expected.map(Vec::from).to_vec());
    }
}
