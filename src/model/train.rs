//! Per-token logprobs of given responses, with and without gradients.
//!
//! PPO needs log π(response token | prompt, earlier response tokens) for every response
//! token, under the current weights: [`Policy::score`] without gradients (old logprobs,
//! drift checks), [`Policy::backward`] with them (the loss is the caller's).
//!
//! Requests are packed into micro-batches of at most `max_tokens` padded tokens (longest
//! first, so rows of a micro-batch have similar lengths), which bounds memory whatever
//! the mini-batch size. Rows are right-padded: causal attention never lets a real token
//! see the padding after it, so no mask is needed, and positions are 0..L. Only the
//! hidden states that predict response tokens go through lm_head, which for long prompts
//! saves most of the (N, V) logits.
//!
//! Gradient checkpointing keeps only each layer's input (B, L, E) from a no-grad forward,
//! then walks the layers backwards, recomputing one layer at a time with gradients and
//! back-propagating the incoming gradient through it: one extra forward, and activation
//! memory of one layer instead of all.

use tch::{Kind, Tensor};

use super::decoder::{CausalLm, Pass};
use super::generate::prefill_mask;
use super::lora::Route;
use super::policy::Policy;
use super::{Error, Result, guard};
use crate::rng::combine;

/// A prompt and a response whose tokens are scored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRequest {
    pub prompt_ids: Vec<i64>,
    pub response_ids: Vec<i64>,
    /// The adapter to score with; the base model when `None`.
    pub adapter: Option<String>,
}

/// How [`Policy::backward`] splits its requests: micro-batches of at most `max_tokens`
/// padded tokens, activations recomputed in the backward pass when `checkpointing`, and
/// lm_head's logits projected at most `max_logits` (tokens × vocabulary) at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatching {
    pub max_tokens: usize,
    pub checkpointing: bool,
    pub max_logits: i64,
}

impl MicroBatching {
    /// `max_tokens` per micro-batch, logits in chunks of 256 MiB.
    pub fn new(max_tokens: usize, checkpointing: bool) -> MicroBatching {
        MicroBatching { max_tokens, checkpointing, max_logits: LOGIT_BUDGET }
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

impl Policy {
    /// Logprobs of every response token, in request order, without gradients.
    pub fn score(&mut self, requests: &[ScoreRequest], max_tokens: usize) -> Result<Vec<Vec<f32>>> {
        let batching = MicroBatching::new(max_tokens, false);
        let during = || format!("scoring {} sequences in micro-batches of {max_tokens} tokens", requests.len());
        guard(during, || tch::no_grad(|| self.run_micro_batches(requests, &batching, false, 0, &mut |_| Ok(None))))
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
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); requests.len()];
        for (n, indices) in pack(requests, batching.max_tokens).into_iter().enumerate() {
            let dropout_seed = combine(seed, n as u64);
            let mb = self.micro_batch(requests, indices, training, batching, dropout_seed, loss)?;
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
    fn micro_batch(
        &mut self,
        requests: &[ScoreRequest],
        indices: Vec<usize>,
        training: bool,
        batching: &MicroBatching,
        dropout_seed: u64,
        loss: &mut dyn FnMut(&MicroBatch) -> Result<Option<Tensor>>,
    ) -> Result<MicroBatch> {
        let device = self.device();
        let kind = self.kind();
        let pad = self.pad_id();
        let rows: Vec<&ScoreRequest> = indices.iter().map(|&i| &requests[i]).collect();
        let b = rows.len() as i64;
        let l = rows.iter().map(|r| r.prompt_ids.len() + r.response_ids.len()).max().unwrap_or(0) as i64;
        let t = rows.iter().map(|r| r.response_ids.len()).max().unwrap_or(0) as i64;
        // Right-padded ids (b, L).
        let ids: Vec<Vec<i64>> = rows
            .iter()
            .map(|r| {
                let mut v: Vec<i64> = r.prompt_ids.iter().chain(&r.response_ids).copied().collect();
                v.resize(l as usize, pad);
                v
            })
            .collect();
        // For response token j of row i: the hidden state at i·L + P_i − 1 + j predicts it,
        // and it lands at i·T + j of the (b, T) output.
        let (mut source, mut target, mut slot) = (Vec::new(), Vec::new(), Vec::new());
        for (i, r) in rows.iter().enumerate() {
            let p = r.prompt_ids.len() as i64;
            for (j, &tok) in r.response_ids.iter().enumerate() {
                source.push(i as i64 * l + p - 1 + j as i64);
                target.push(tok);
                slot.push(i as i64 * t + j as i64);
            }
        }
        let to_dev = |v: &[i64]| Tensor::from_slice(v).to_device(device);
        let (source, target, slot) = (to_dev(&source), to_dev(&target), to_dev(&slot));
        let mask = Tensor::zeros([b * t], (Kind::Float, device)).index_fill(0, &slot, 1.0).view([b, t]);

        let slots: Vec<Option<usize>> = rows
            .iter()
            .map(|r| r.adapter.as_deref().map(|n| self.adapter_slot(n)).transpose())
            .collect::<Result<_>>()?;
        let route = Route::new(&slots, device, training.then_some(dropout_seed));
        let input = self.ids_tensor(&ids);
        let positions = Tensor::arange(l, (Kind::Int64, device)).unsqueeze(0).expand([b, l], false);
        let (cos, sin) = self.lm.model.rotary.cos_sin(&positions, kind);
        let pass = Pass { cos, sin, mask: None, causal: true, use_cache: false, route: &route };

        let rows = ResponseRows { source, target, slot, b, l, t, max_logits: batching.max_logits };
        if !(batching.checkpointing && training) {
            let hidden = self.lm.hidden(&input, &pass);
            return rows.logprobs_and_backward(&self.lm, &hidden, indices, mask, loss);
        }

        // Gradient checkpointing. 1. No-grad forward keeping each layer's input.
        let lm = &mut self.lm;
        let mut inputs = Vec::with_capacity(lm.model.layers.len() + 1);
        tch::no_grad(|| {
            let mut x = Tensor::embedding(&lm.model.embed_tokens, &input, -1, false, false);
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
        if lm.model.embed_tokens.requires_grad() {
            let e = Tensor::embedding(&lm.model.embed_tokens, &input, -1, false, false);
            (e * &grad).sum(Kind::Float).backward();
        }
        Ok(mb)
    }

    /// Logits of every position of each sequence, (len_i, V) float32, computed in one
    /// left-padded batch with the padding masked out (as a padded prefill).
    pub fn logits(&mut self, sequences: &[Vec<i64>], adapters: &[Option<String>]) -> Result<Vec<Tensor>> {
        tch::no_grad(|| {
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
            let route = Route::new(&slots, device, None);
            let (cos, sin) = self.lm.model.rotary.cos_sin(&positions, self.kind());
            let padded = sequences.iter().any(|s| s.len() < p);
            let pass = Pass {
                cos,
                sin,
                mask: padded.then(|| prefill_mask(&key_valid)),
                causal: true,
                use_cache: false,
                route: &route,
            };
            let logits = self.lm.logits_all(&self.ids_tensor(&rows), &pass).to_kind(Kind::Float);
            Ok(sequences
                .iter()
                .enumerate()
                .map(|(i, s)| logits.get(i as i64).narrow(0, (p - s.len()) as i64, s.len() as i64))
                .collect())
        })
    }
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
    b: i64,
    l: i64,
    t: i64,
    max_logits: i64,
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
        let (b, l, t) = (self.b, self.l, self.t);
        let e = hidden.size()[2];
        let chosen = hidden.reshape([b * l, e]).index_select(0, &self.source);
        let n = chosen.size()[0];
        let chunk = (self.max_logits / lm.config.vocab_size as i64).max(1);
        let to_bt =
            |lp: &Tensor| Tensor::zeros([b * t], (Kind::Float, lp.device())).index_add(0, &self.slot, lp).view([b, t]);
        if n <= chunk {
            let logprobs = to_bt(&token_logprobs(lm, &chosen, &self.target));
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
                    token_logprobs(lm, &detached.narrow(0, start, len), &self.target.narrow(0, start, len))
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
            let lp = token_logprobs(lm, &chosen_leaf.narrow(0, start, len), &self.target.narrow(0, start, len));
            (lp * upstream.narrow(0, start, len)).sum(Kind::Float).backward();
        }
        if chosen.requires_grad() {
            (chosen * chosen_leaf.grad()).sum(Kind::Float).backward();
        }
        Ok(MicroBatch { logprobs: mb.logprobs.detach(), ..mb })
    }
}

/// log softmax(head(hidden))[target] for rows (N, E) and targets (N,), in float32.
fn token_logprobs(lm: &CausalLm, hidden: &Tensor, target: &Tensor) -> Tensor {
    let logits = lm.head(hidden).to_kind(Kind::Float);
    logits.gather(1, &target.unsqueeze(1), false).squeeze_dim(1) - logits.logsumexp([1], false)
}

/// Groups requests into micro-batches of at most `max_tokens` padded tokens (b × longest),
/// longest first; a request longer than the budget gets a micro-batch of its own.
fn pack(requests: &[ScoreRequest], max_tokens: usize) -> Vec<Vec<usize>> {
    let len = |i: usize| requests[i].prompt_ids.len() + requests[i].response_ids.len();
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(len(i)));
    let mut batches: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match batches.last_mut() {
            // Sorted longest first: the batch's first row is its longest.
            Some(batch) if (batch.len() + 1) * len(batch[0]) <= max_tokens => batch.push(i),
            _ => batches.push(vec![i]),
        }
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(p: usize, r: usize) -> ScoreRequest {
        ScoreRequest { prompt_ids: vec![1; p], response_ids: vec![2; r], adapter: None }
    }

    #[test]
    fn packing_respects_the_budget_and_covers_every_request_once() {
        let reqs = vec![req(3, 2), req(10, 5), req(1, 1), req(4, 4), req(20, 30)];
        let batches = pack(&reqs, 32);
        // Longest first: [50] alone (over budget), then 15+8 → 2×15 = 30 ≤ 32, then 5, 2.
        assert_eq!(batches, vec![vec![4], vec![1, 3], vec![0, 2]]);
        let mut all: Vec<usize> = batches.concat();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
    }
}
