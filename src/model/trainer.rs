//! Optimising a policy's trainable weights: AdamW ([`super::adamw`], float32 state)
//! over the whole model (full fine-tuning) or over one adapter, gradient-norm clipping
//! as torch's `clip_grad_norm_`, and the two steps the update stage takes: supervised
//! (the SFT warm start) and PPO-clip.
//!
//! `algo::loss` writes the PPO-clip terms as pure functions; [`ppo_clip_tensor`] is the
//! same on tensors, and a test keeps the two equal.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::adamw::{AdamW, AdamWState};
use super::{MicroBatch, MicroBatching, Policy, Result, ScoreRequest};
use crate::algo::loss::Aggregation;
use crate::algo::schedule::{Schedule, learning_rate};
use crate::validate::{Invalid, check};

/// AdamW settings (`policies.<name>.optimizer`, `warm_start.optimizer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Adam betas.
    pub betas: [f64; 2],
    /// Adam epsilon.
    pub eps: f64,
    /// Linear warm-up steps.
    pub warmup_steps: u32,
    /// Learning-rate schedule after warm-up.
    pub schedule: Schedule,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            lr: 1e-6,
            weight_decay: 0.01,
            betas: [0.9, 0.999],
            eps: 1e-8,
            warmup_steps: 0,
            schedule: Schedule::Constant,
        }
    }
}

impl OptimizerConfig {
    /// The learning rate of step `step` of `total`.
    pub fn learning_rate(&self, step: u64, total: u64) -> f64 {
        learning_rate(self.lr, self.warmup_steps, self.schedule, step, total)
    }

    pub fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(self.lr > 0.0, format!("{key}.lr"), "must be positive")?;
        let [b1, b2] = self.betas;
        check((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2), format!("{key}.betas"), "must both be in [0, 1)")
    }
}

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
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// How far the step moved the weights the policy samples with, relative to their norm.
    pub weights_change: f64,
}

/// AdamW over a policy's trainable variables: one adapter's for LoRA, else the whole model's.
pub struct Trainer {
    optimizer: AdamW,
    grad_clip: f64,
}

impl Trainer {
    /// A trainer that continues `state` (the optimiser state saved with the checkpoint the
    /// policy was loaded from), or starts afresh.
    pub fn new(
        policy: &Policy,
        adapter: Option<&str>,
        config: &OptimizerConfig,
        grad_clip: f64,
        state: Option<AdamWState>,
    ) -> Result<Trainer> {
        let vs = match adapter {
            Some(name) => policy.adapter_var_store(name)?,
            None => policy.var_store(),
        };
        let weights: HashMap<String, Tensor> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        Ok(Trainer { optimizer: AdamW::new(weights, config, state)?, grad_clip })
    }

    /// The optimiser state to save with the new checkpoint.
    pub fn state(&self) -> AdamWState {
        self.optimizer.state()
    }

    /// A supervised step: the token-mean negative log-likelihood of the responses.
    pub fn sft_step(
        &mut self,
        policy: &mut Policy,
        batch: &[ScoreRequest],
        micro: MicroBatching,
        seed: u64,
        lr: f64,
    ) -> Result<StepResult> {
        let tokens: usize = batch.iter().map(|r| r.response_ids.len()).sum();
        self.optimizer.zero_grad();
        let logprobs = policy.backward(batch, &micro, seed, &mut |mb: &MicroBatch| {
            Ok(-(&mb.logprobs * &mb.mask).sum(Kind::Float) / tokens as f64)
        })?;
        Ok(self.step(lr, logprobs))
    }

    /// A PPO-clip step on `batch`, whose request i has the old logprobs `old[i]` and the
    /// advantage `advantages[i]` (broadcast to every response token). Without `old`, the
    /// weights are the old policy's and the step's own forward gives the old logprobs
    /// (every ratio exactly 1), which saves a forward of the batch.
    #[allow(clippy::too_many_arguments)]
    pub fn ppo_step(
        &mut self,
        policy: &mut Policy,
        batch: &[ScoreRequest],
        old: Option<&[&[f32]]>,
        sampled: &[&[f32]],
        advantages: &[f64],
        clip: PpoClip,
        micro: MicroBatching,
        seed: u64,
        lr: f64,
    ) -> Result<StepResult> {
        let tokens: usize = batch.iter().map(|r| r.response_ids.len()).sum();
        let weight = clip.aggregation.token_weight(tokens, batch.len());
        let device = policy.device();
        self.optimizer.zero_grad();
        let logprobs = policy.backward(batch, &micro, seed, &mut |mb: &MicroBatch| {
            let old_t = match old {
                Some(old) => padded(mb.indices.iter().map(|&i| old[i]), &mb.logprobs, device),
                None => mb.logprobs.detach(),
            };
            let adv: Vec<f32> = mb.indices.iter().map(|&i| advantages[i] as f32).collect();
            let adv_t = Tensor::from_slice(&adv).view([-1, 1]).to_device(device);
            // The importance weights are constants: a weighted mask.
            let mask = match clip.importance_cap {
                Some(cap) => {
                    let engine = padded(mb.indices.iter().map(|&i| sampled[i]), &mb.logprobs, device);
                    &mb.mask * (&old_t - engine).exp().clamp_max(cap)
                }
                None => mb.mask.shallow_clone(),
            };
            Ok(ppo_clip_tensor(&mb.logprobs, &old_t, &adv_t, &mask, clip.epsilon) * weight)
        })?;
        Ok(self.step(lr, logprobs))
    }

    /// Takes the optimiser step at `lr` on the accumulated gradients, clipped to a global
    /// norm of `grad_clip`.
    fn step(&mut self, lr: f64, logprobs: Vec<Vec<f32>>) -> StepResult {
        let grad_norm = grad_norm(self.optimizer.weights());
        let clip = (self.grad_clip / (grad_norm + 1e-6)).min(1.0);
        let change = self.optimizer.step(lr, clip);
        StepResult { logprobs, grad_norm, weights_change: change.relative }
    }
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
/// mask are (b, T), advantage is (b, 1), broadcast to every token.
pub fn ppo_clip_tensor(logp: &Tensor, old: &Tensor, advantage: &Tensor, mask: &Tensor, clip_epsilon: f64) -> Tensor {
    let ratio = (logp - old).exp();
    let pg_loss1 = -advantage * &ratio;
    let pg_loss2 = -advantage * ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon);
    (pg_loss1.maximum(&pg_loss2) * mask).sum(Kind::Float)
}

/// The global L2 norm of the weights' gradients, as torch's `clip_grad_norm_` computes it
/// before clipping (the step scales the gradients by max_norm / (norm + 1e-6) when that
/// is below 1).
pub fn grad_norm<'a>(weights: impl Iterator<Item = &'a Tensor>) -> f64 {
    tch::no_grad(|| {
        let squares: Vec<Tensor> = weights
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double))
            .collect();
        if squares.is_empty() {
            return 0.0;
        }
        Tensor::stack(&squares, 0).sum(Kind::Double).sqrt().double_value(&[])
    })
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
        let seqs: Vec<(&[(f64, f64)], f64)> = pairs.iter().zip(adv).map(|(p, a)| (p.as_slice(), a)).collect();
        for aggregation in [Aggregation::TokenMean, Aggregation::SequenceSum { normaliser: 5.0 }] {
            let expected = ppo_clip_loss(&seqs, 0.2, aggregation);
            let sum = ppo_clip_tensor(&t(&new), &t(&old), &adv_t, &mask, 0.2);
            let got = sum.double_value(&[]) * aggregation.token_weight(4, 2);
            assert!((got - expected.loss).abs() < 1e-6, "{aggregation:?}: {got} vs {}", expected.loss);
        }
        // And by hand for the token mean: ratios e^0.3, 1, e^-1 (A = 1.5), e^-0.1 (A = -0.7).
        let by_hand = (-1.5 * 1.2 - 1.5 - 1.5 * (-1.0f64).exp() + 0.7 * (-0.1f64).exp()) / 4.0;
        let expected = ppo_clip_loss(&seqs, 0.2, Aggregation::TokenMean).loss;
        assert!((by_hand - expected).abs() < 1e-6, "{by_hand} vs {expected}");
    }

    #[test]
    fn the_gradient_norm_spans_every_weight() {
        let a = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let untouched = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        // Gradients (3, 0) and (4): global norm 5; a weight without a gradient adds nothing.
        let loss = (&a * Tensor::from_slice(&[3f32, 0.])).sum(Kind::Float) + (&b * 4.0).sum(Kind::Float);
        loss.backward();
        assert!((grad_norm([&a, &b, &untouched].into_iter()) - 5.0).abs() < 1e-9);
    }
}
