//! Optimising a policy's trainable weights: AdamW ([`super::adamw`], float32 state)
//! over the whole model (full fine-tuning) or over one adapter, gradient-norm clipping
//! as torch's `clip_grad_norm_`, and the two steps the update stage takes: supervised
//! (the SFT warm start) and PPO-clip.
//!
//! `algo::loss` writes the PPO-clip terms as pure functions; [`ppo_clip_tensor`] is the
//! same on tensors, and a test keeps the two equal.

use std::collections::HashMap;
use std::sync::Arc;

use tch::{Kind, Tensor};

use super::adamw::{AdamW, AdamWState, OptimizerConfig, StateShard, StepChange};
use super::{LanguageModel, MicroBatch, MicroBatching, Result, ScoreRequest};
use crate::algo::loss::{Advantage, Aggregation, LOG_RATIO_LIMIT};
use crate::ranks::Ranks;

/// The PPO-clip objective's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PpoClip {
    pub epsilon: f64,
    pub aggregation: Aggregation,
    /// Weight each token by its truncated importance ratio trainer/engine, capped here
    /// (`algo::loss::truncated_importance_weight`); none: no correction.
    pub importance_cap: Option<f64>,
}

/// What one optimiser step saw and did.
#[derive(Debug)]
pub struct StepResult {
    /// Each request's response logprobs before the step (the forward it trained on).
    pub logprobs: Vec<Vec<f32>>,
    /// The loss the gradients were taken of.
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// How far the step moved the weights the policy samples with, relative to their norm.
    pub weights_change: f64,
    /// No step was taken, the weights and the optimiser state are as they were: the loss
    /// or the gradient norm was not finite, or no token was trained (all masked).
    pub skipped: bool,
    /// With ranks: what summing the gradients over them took.
    pub all_reduce: Option<AllReduce>,
}

/// One step's gradient all-reduce over the ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllReduce {
    pub ranks: u32,
    /// Bytes this rank summed (float32 gradients and the loss).
    pub bytes: u64,
    pub seconds: f64,
}

/// What the loss of one step is normalised by: the whole mini-batch's trained tokens
/// and sequences, also when each rank of a data-parallel update trains a shard of it
/// (a rank's own mean would weight its tokens by the size of its shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub tokens: usize,
    pub sequences: usize,
}

/// The ranks a trainer's steps are taken with.
#[derive(Debug, Clone)]
pub struct DataParallel {
    pub ranks: Arc<Ranks>,
    /// Each rank keeps 1/N of the optimiser state and steps only its weights, which it
    /// then gives the others (ZeRO-1).
    pub shard_state: bool,
}

/// AdamW over a policy's trainable variables: one adapter's for LoRA, else the whole
/// model's; with ranks, every step sums the gradients and the loss over them first, so
/// that each rank takes the same step.
pub struct Trainer {
    optimizer: AdamW,
    grad_clip: f64,
    parallel: Option<DataParallel>,
}

impl Trainer {
    /// A trainer that continues `state` (the optimiser state saved with the checkpoint the
    /// policy was loaded from), or starts afresh.
    pub fn new(
        model: &LanguageModel,
        adapter: Option<&str>,
        config: &OptimizerConfig,
        grad_clip: f64,
        state: Option<AdamWState>,
        parallel: Option<DataParallel>,
    ) -> Result<Trainer> {
        let vs = match adapter {
            Some(name) => model.adapter_var_store(name)?,
            None => model.var_store(),
        };
        let weights: HashMap<String, Tensor> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        let shard = parallel
            .as_ref()
            .filter(|p| p.shard_state)
            .map(|p| StateShard { rank: p.ranks.rank(), ranks: p.ranks.size() });
        Ok(Trainer { optimizer: AdamW::new(weights, config, state, shard)?, grad_clip, parallel })
    }

    /// Optimiser steps taken so far, across every version this state continues.
    pub fn steps_taken(&self) -> u64 {
        self.optimizer.steps_taken()
    }

    /// Names of the trainable weights holding a NaN or an infinity.
    pub fn non_finite_weights(&self) -> Vec<String> {
        self.optimizer.non_finite_weights()
    }

    /// sha256 of the trainable weights, which the ranks of an update compare.
    pub fn weights_digest(&self) -> String {
        self.optimizer.weights_digest()
    }

    /// The optimiser state to save with the new checkpoint: the whole of it, also when
    /// sharded (every rank takes part; rank 0 gets it, the others none).
    pub fn state(&self) -> Result<Option<AdamWState>> {
        match &self.parallel {
            Some(DataParallel { ranks, shard_state: true }) => {
                let broadcast =
                    &mut |t: &Tensor, owner| Ok(ranks.broadcast(t, owner, "the optimiser state's gather")?);
                self.optimizer.gathered_state(ranks.is_leader(), broadcast)
            }
            _ => Ok(Some(self.optimizer.state())),
        }
    }

    /// A supervised step: the token-mean negative log-likelihood of the responses.
    pub fn sft_step(
        &mut self,
        model: &mut LanguageModel,
        batch: &[ScoreRequest],
        micro: MicroBatching,
        seed: u64,
        lr: f64,
    ) -> Result<StepResult> {
        let tokens: usize = batch.iter().map(|r| r.response_ids.len()).sum();
        self.optimizer.zero_grad();
        let mut loss = 0.0;
        let optimizer = &mut self.optimizer;
        let logprobs = model.backward(batch, &micro, seed, &mut |mb: &MicroBatch| {
            // The previous micro-batch's backward is done: sum its gradients in float32.
            optimizer.accumulate();
            let value = -(&mb.logprobs * &mb.mask).sum(Kind::Float) / tokens as f64;
            loss += value.double_value(&[]);
            Ok(value)
        })?;
        self.step(lr, logprobs, loss, tokens)
    }

    /// A PPO-clip step on `batch`, whose request i has the old logprobs `old[i]` and the
    /// advantage `advantages[i]` (one for every response token, or one each), or none: a masked
    /// request, forwarded with its group but out of the loss and of its token count.
    /// Without `old`, the weights are the old policy's and the step's own forward gives
    /// the old logprobs (every ratio exactly 1), which saves a forward of the batch.
    /// `batch` is this rank's shard of a mini-batch of `totals` (the whole of it
    /// without ranks: [`Totals::of`]).
    #[allow(clippy::too_many_arguments)]
    pub fn ppo_step(
        &mut self,
        model: &mut LanguageModel,
        batch: &[ScoreRequest],
        old: Option<&[&[f32]]>,
        sampled: &[&[f32]],
        advantages: &[Option<Advantage>],
        totals: Totals,
        clip: PpoClip,
        micro: MicroBatching,
        seed: u64,
        lr: f64,
    ) -> Result<StepResult> {
        let weight = clip.aggregation.token_weight(totals.tokens, totals.sequences);
        let device = model.device();
        self.optimizer.zero_grad();
        let mut loss = 0.0;
        if batch.is_empty() {
            // A rank with no share of this mini-batch still sums its (zero) gradients.
            return self.step(lr, Vec::new(), loss, totals.tokens);
        }
        let optimizer = &mut self.optimizer;
        let logprobs = model.backward(batch, &micro, seed, &mut |mb: &MicroBatch| {
            optimizer.accumulate();
            let old_t = match old {
                Some(old) => padded(mb.indices.iter().map(|&i| old[i]), &mb.logprobs, device),
                None => mb.logprobs.detach(),
            };
            let adv: Vec<Vec<f32>> = mb.indices.iter().map(|&i| token_advantages(advantages[i], &batch[i])).collect();
            let adv_t = padded(adv.iter().map(Vec::as_slice), &mb.logprobs, device);
            let kept: Vec<f32> = mb.indices.iter().map(|&i| f32::from(u8::from(advantages[i].is_some()))).collect();
            let kept_mask = &mb.mask * Tensor::from_slice(&kept).view([-1, 1]).to_device(device);
            // The importance weights are constants: a weighted mask.
            let mask = match clip.importance_cap {
                Some(cap) => {
                    let engine = padded(mb.indices.iter().map(|&i| sampled[i]), &mb.logprobs, device);
                    kept_mask * (&old_t - engine).exp().clamp_max(cap)
                }
                None => kept_mask,
            };
            let value = ppo_clip_tensor(&mb.logprobs, &old_t, &adv_t, &mask, clip.epsilon) * weight;
            loss += value.double_value(&[]);
            Ok(value)
        })?;
        self.step(lr, logprobs, loss, totals.tokens)
    }

    /// Takes the optimiser step at `lr` on the accumulated gradients, clipped to a global
    /// norm of `grad_clip`; or, when the loss or the gradient norm is not finite (a NaN
    /// would reach the moments and the float32 masters, and stay there) or no token was
    /// trained (AdamW's momentum would still move the weights), drops the gradients and
    /// takes none. With ranks, the gradients and the loss are first summed over them, so
    /// every rank decides alike and steps alike.
    fn step(&mut self, lr: f64, logprobs: Vec<Vec<f32>>, loss: f64, trained_tokens: usize) -> Result<StepResult> {
        self.optimizer.accumulate();
        let (loss, all_reduce) = match self.parallel.as_ref().map(|p| &p.ranks) {
            Some(ranks) => {
                let started = std::time::Instant::now();
                let mut bytes = 0;
                self.optimizer.reduce_gradients(&mut |bucket| {
                    bytes += bucket.numel() as u64 * 4;
                    Ok(ranks.sum(bucket, "the gradients' all-reduce")?)
                })?;
                let total = Tensor::from_slice(&[loss]);
                ranks.sum(&total, "the loss's all-reduce")?;
                let seconds = started.elapsed().as_secs_f64();
                (total.double_value(&[0]), Some(AllReduce { ranks: ranks.size(), bytes: bytes + 8, seconds }))
            }
            None => (loss, None),
        };
        let grad_norm = self.optimizer.grad_norm();
        if !(loss.is_finite() && grad_norm.is_finite()) || trained_tokens == 0 {
            self.optimizer.zero_grad();
            return Ok(StepResult { logprobs, loss, grad_norm, weights_change: 0.0, skipped: true, all_reduce });
        }
        let clip = clip_factor(self.grad_clip, grad_norm);
        let change = self.optimizer.step(lr, clip);
        let weights_change = match &self.parallel {
            Some(DataParallel { ranks, shard_state: true }) => {
                let broadcast =
                    &mut |w: &Tensor, owner| Ok(ranks.broadcast(w, owner, "the stepped weights' broadcast")?);
                self.optimizer.share_weights(broadcast)?;
                let sums = Tensor::from_slice(&[change.moved_squared, change.norm_squared]);
                ranks.sum(&sums, "the weights change's all-reduce")?;
                StepChange { moved_squared: sums.double_value(&[0]), norm_squared: sums.double_value(&[1]) }.relative()
            }
            _ => change.relative(),
        };
        Ok(StepResult { logprobs, loss, grad_norm, weights_change, skipped: false, all_reduce })
    }
}

/// The advantage of each response token of `request` (0 for a masked request).
fn token_advantages(advantage: Option<Advantage>, request: &ScoreRequest) -> Vec<f32> {
    let n = request.response_ids.len();
    match advantage {
        Some(Advantage::Tokens(a)) => {
            assert_eq!(a.len(), n, "one advantage per response token");
            a.to_vec()
        }
        Some(Advantage::Sequence(a)) => vec![a as f32; n],
        None => vec![0.0; n],
    }
}

impl Totals {
    /// The trained tokens and sequences of `batch`, whose request i trains when
    /// `advantages[i]` is some.
    pub fn of<A>(batch: &[ScoreRequest], advantages: &[Option<A>]) -> Totals {
        let trained: Vec<&ScoreRequest> =
            batch.iter().zip(advantages).filter(|(_, a)| a.is_some()).map(|(r, _)| r).collect();
        Totals { tokens: trained.iter().map(|r| r.response_ids.len()).sum(), sequences: trained.len() }
    }
}

/// The factor the gradients are scaled by, as torch's `clip_grad_norm_`: max_norm /
/// (norm + 1e-6) where that is below 1, for a finite norm.
fn clip_factor(max_norm: f64, grad_norm: f64) -> f64 {
    debug_assert!(grad_norm.is_finite());
    (max_norm / (grad_norm + 1e-6)).min(1.0)
}

/// Values of `rows` right-padded with zeros to the (b, T) shape of `like`.
fn padded<'a>(rows: impl Iterator<Item = &'a [f32]>, like: &Tensor, device: tch::Device) -> Tensor {
    let (b, t) = like.size2().expect("(b, T) logprobs");
    let mut flat = vec![0f32; (b * t) as usize];
    for (r, values) in rows.enumerate() {
        flat[r * t as usize..r * t as usize + values.len()].copy_from_slice(values);
    }
    Tensor::from_slice(&flat).view([b, t]).to_device(device)
}

/// `algo::loss::ppo_clip_token` on tensors, summed over the real tokens: logp, old and
/// mask are (b, T), advantage is (b, T), or (b, 1) broadcast to every token.
pub fn ppo_clip_tensor(logp: &Tensor, old: &Tensor, advantage: &Tensor, mask: &Tensor, clip_epsilon: f64) -> Tensor {
    let ratio = (logp - old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp();
    let pg_loss1 = -advantage * &ratio;
    let pg_loss2 = -advantage * ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon);
    (pg_loss1.maximum(&pg_loss2) * mask).sum(Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::loss::ppo_clip_loss;

    #[test]
    fn the_tensor_loss_equals_the_pure_function() {
        // Two sequences of 3 and 1 tokens, ratios on both sides of the clip range.
        let new = [[-1.0f32, -0.5, -2.0], [-0.3, 0.0, 0.0]];
        let old = [[-1.3f32, -0.5, -1.0], [-0.2, 0.0, 0.0]];
        let lens = [3usize, 1];
        let adv = [1.5f64, -0.7];
        let t = |v: &[[f32; 3]; 2]| Tensor::from_slice(&v.concat()).view([2, 3]);
        let mask = Tensor::from_slice(&[1f32, 1., 1., 1., 0., 0.]).view([2, 3]);
        let adv_t = Tensor::from_slice(&[adv[0] as f32, adv[1] as f32]).view([2, 1]);
        let pairs: Vec<Vec<(f64, f64)>> =
            (0..2).map(|r| (0..lens[r]).map(|j| (f64::from(new[r][j]), f64::from(old[r][j]))).collect()).collect();
        let seqs: Vec<(&[(f64, f64)], Advantage)> =
            pairs.iter().zip(adv).map(|(p, a)| (p.as_slice(), Advantage::Sequence(a))).collect();
        for aggregation in [Aggregation::TokenMean, Aggregation::SequenceSum { normaliser: 5.0 }] {
            let expected = ppo_clip_loss(&seqs, None, 0.2, aggregation);
            let sum = ppo_clip_tensor(&t(&new), &t(&old), &adv_t, &mask, 0.2);
            let got = sum.double_value(&[]) * aggregation.token_weight(4, 2);
            assert!((got - expected.loss).abs() < 1e-6, "{aggregation:?}: {got} vs {}", expected.loss);
        }
        // And by hand for the token mean: ratios e^0.3, 1, e^-1 (A = 1.5), e^-0.1 (A = -0.7).
        let by_hand = (-1.5 * 1.2 - 1.5 - 1.5 * (-1.0f64).exp() + 0.7 * (-0.1f64).exp()) / 4.0;
        let expected = ppo_clip_loss(&seqs, None, 0.2, Aggregation::TokenMean).loss;
        assert!((by_hand - expected).abs() < 1e-6, "{by_hand} vs {expected}");
    }

    #[test]
    fn a_huge_log_ratio_gives_a_finite_loss() {
        // 100 nats apart with A = 0: an unclamped exp overflows f32 and 0 · inf is NaN.
        let logp = Tensor::from_slice(&[0f32, -1.0]).view([1, 2]);
        let old = Tensor::from_slice(&[-100f32, -1.0]).view([1, 2]);
        let adv = Tensor::from_slice(&[0f32]).view([1, 1]);
        let mask = Tensor::ones([1, 2], (Kind::Float, tch::Device::Cpu));
        let loss = ppo_clip_tensor(&logp, &old, &adv, &mask, 0.2).double_value(&[]);
        assert!(loss.is_finite(), "{loss}");
    }

    #[test]
    fn the_clip_factor_scales_only_norms_above_the_limit() {
        assert_eq!(clip_factor(1.0, 0.5), 1.0);
        assert!((clip_factor(1.0, 4.0) - 1.0 / (4.0 + 1e-6)).abs() < 1e-15);
    }
}
