//! AdamW with float32 state, whatever dtype the model computes in.
//!
//! torch's AdamW (decoupled weight decay, bias-corrected moments), with the moments kept
//! in float32 and, for weights held in bf16 or f16, a float32 master copy that the step
//! updates and the model's weights are cast from. A step of lr 1e-6 on a bf16 weight of
//! 0.02 is 5e-5 relative, far below bf16's 2^-8: applied in bf16 it rounds away, and the
//! model silently learns nothing (tch's `nn::AdamW` steps in the weights' dtype).
//!
//! The state ([`AdamWState`]: moments, masters and the step count) is saved with every
//! checkpoint version, so the next iteration, a resumed run or a fork continues the very
//! same optimisation, bias correction included.
//!
//! Across the micro-batches of one step, the gradients of weights held in bf16 or f16
//! are summed in float32 ([`AdamW::accumulate`], as FSDP's mixed precision and
//! Megatron's `main_grad` do): summed in bf16, a micro-batch's gradient smaller than
//! 2^-8 of the running sum would round away.
//!
//! Gradients are released, not zeroed, between steps and when the optimiser is dropped
//! (torch's `zero_grad(set_to_none=True)`): a full model's float32 gradients are its
//! size again (2 GB at 0.5B), and zeroed ones would stay attached to the weights through
//! the next forward and, in `pipeline run`, through the rollout after the update.
//!
//! ```text
//!  g  = grad · clip                 (float32)
//!  w  = w · (1 − lr · wd)           (w: the float32 master, or the weight itself)
//!  m  = β1 · m + (1 − β1) · g
//!  v  = β2 · v + (1 − β2) · g²
//!  w  = w − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
//!  weight = w cast to the model's dtype
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::weights::{SafetensorsSet, read_header, write_safetensors_with};
use super::{Error, Result};
use crate::algo::schedule::{Schedule, learning_rate};
use crate::validate::{Invalid, check};

/// AdamW settings (`policies.<name>.optimizer`, `warm_start.optimizer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// The file a checkpoint folder keeps its optimiser state in.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// The optimiser state of one policy's trainable weights, by weight name.
#[derive(Debug)]
pub struct AdamWState {
    /// Optimiser steps taken so far (the t of the bias correction).
    pub step: u64,
    /// `exp_avg.<name>`, `exp_avg_sq.<name>` and, for weights held in a lower precision,
    /// `master.<name>`: float32 tensors on the CPU.
    pub tensors: BTreeMap<String, Tensor>,
}

impl AdamWState {
    /// Writes the state as safetensors, the step count in the header's metadata.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors: Vec<(String, Tensor)> = self.tensors.iter().map(|(k, t)| (k.clone(), t.shallow_clone())).collect();
        write_safetensors_with(path, &tensors, &[("petting", "adamw".into()), ("step", self.step.to_string())])
            .map(drop)
    }

    pub fn load(path: &Path) -> Result<AdamWState> {
        let bad = |reason: String| Error::Format { file: path.to_path_buf(), reason };
        let (metadata, _) = read_header(path)?;
        if metadata.get("petting").map(String::as_str) != Some("adamw") {
            return Err(bad("not petting's AdamW state (no petting: adamw in its metadata)".into()));
        }
        let step = metadata.get("step").and_then(|s| s.parse().ok()).ok_or_else(|| bad("no step count".into()))?;
        let files = SafetensorsSet::open_files(&[path.to_path_buf()])?;
        let mut tensors = BTreeMap::new();
        for name in files.names() {
            let (shape, _) = files.info(name).ok_or_else(|| bad(format!("tensor {name} has an unsupported dtype")))?;
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            tensors.insert(name.to_string(), files.tensor(name, &shape, Kind::Float, tch::Device::Cpu)?);
        }
        Ok(AdamWState { step, tensors })
    }
}

/// One trainable weight and its state.
struct Param {
    name: String,
    /// The model's variable (a shallow clone: the same storage).
    weight: Tensor,
    /// Held in bf16 or f16: its gradients are summed in float32, its step is taken on a
    /// float32 master.
    low_precision: bool,
    /// The rank whose optimiser state this is, when the state is sharded (ZeRO-1); the
    /// others keep no moments or master of it, and receive its stepped weight.
    owner: u32,
    owned: bool,
    /// Float32 copy the step updates, when the weight is held in a lower precision.
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Float32 sum of the gradients of the step's earlier micro-batches, for a weight
    /// held in a lower precision.
    grad_sum: Option<Tensor>,
}

impl Param {
    /// The state tensor saved as `kind.<name>`.
    fn state(&self, kind: &str) -> &Tensor {
        match kind {
            "exp_avg" => &self.exp_avg,
            "exp_avg_sq" => &self.exp_avg_sq,
            _ => self.master.as_ref().expect("a low-precision weight has a master"),
        }
    }

    /// The step's gradient in float32, or none when the weight got no gradient.
    fn gradient(&self) -> Option<Tensor> {
        let grad = self.weight.grad();
        match (&self.grad_sum, grad.defined()) {
            (Some(sum), true) => Some(sum + grad.to_kind(Kind::Float)),
            (Some(sum), false) => Some(sum.shallow_clone()),
            (None, true) => Some(if grad.kind() == Kind::Float { grad } else { grad.to_kind(Kind::Float) }),
            (None, false) => None,
        }
    }
}

/// What one [`AdamW::step`] did to the weights the model computes with (those whose
/// state this rank owns, when sharded: the sums add up over the ranks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepChange {
    /// ‖w_after − w_before‖² and ‖w_before‖² over the trainable weights, after any cast.
    pub moved_squared: f64,
    pub norm_squared: f64,
}

impl StepChange {
    /// ‖w_after − w_before‖ / ‖w_before‖: 0 when the step rounded away.
    pub fn relative(&self) -> f64 {
        if self.norm_squared > 0.0 { (self.moved_squared / self.norm_squared).sqrt() } else { 0.0 }
    }
}

/// Which part of the optimiser state a rank keeps (ZeRO-1): `rank` of `ranks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateShard {
    pub rank: u32,
    pub ranks: u32,
}

/// The rank that owns each weight's state (weights in name order): each weight goes to
/// the rank with the fewest elements so far, so the shards are about equal.
fn owners(sizes: &[i64], ranks: u32) -> Vec<u32> {
    let mut load = vec![0i64; ranks as usize];
    sizes
        .iter()
        .map(|&size| {
            let lightest = (0..ranks as usize).min_by_key(|&r| (load[r], r)).expect("a rank");
            load[lightest] += size;
            lightest as u32
        })
        .collect()
}

pub struct AdamW {
    config: OptimizerConfig,
    params: Vec<Param>,
    step: u64,
    /// libtorch's own optimiser over the same weights, used only to release their
    /// gradients: tch has no other way to reset a tensor's `grad` to undefined.
    grad_releaser: tch::COptimizer,
    /// The same over the weights held in a lower precision only, whose gradients
    /// [`AdamW::accumulate`] moves into their float32 sums.
    low_precision_releaser: tch::COptimizer,
}

impl AdamW {
    /// An optimiser for `weights` (name → the model's variable), continuing `state` when
    /// given (every weight must have its moments there, with the right shapes). With
    /// `shard`, this rank keeps only the state of the weights it owns (ZeRO-1); `state`
    /// is still the whole, as saved by any number of ranks.
    pub fn new(
        weights: HashMap<String, Tensor>,
        config: &OptimizerConfig,
        state: Option<AdamWState>,
        shard: Option<StateShard>,
    ) -> Result<AdamW> {
        let mut names: Vec<String> = weights.keys().cloned().collect();
        names.sort();
        let (step, mut saved) = match state {
            Some(state) => (state.step, state.tensors),
            None => (0, BTreeMap::new()),
        };
        let sizes: Vec<i64> = names.iter().map(|n| weights[n].numel() as i64).collect();
        let owner_of = shard.map_or_else(|| vec![0; names.len()], |s| owners(&sizes, s.ranks));
        let rank = shard.map_or(0, |s| s.rank);
        let mut params = Vec::with_capacity(names.len());
        for (name, owner) in names.into_iter().zip(owner_of) {
            let owned = owner == rank;
            let weight = weights[&name].shallow_clone();
            let device = weight.device();
            let fresh = || Tensor::zeros(weight.size(), (Kind::Float, device));
            let mut restored = |kind: &str| -> Result<Option<Tensor>> {
                let Some(t) = saved.remove(&format!("{kind}.{name}")) else { return Ok(None) };
                if t.size() != weight.size() {
                    return Err(Error::Request {
                        reason: format!(
                            "optimizer state {kind}.{name} has shape {:?}, the weight {:?}",
                            t.size(),
                            weight.size()
                        ),
                    });
                }
                Ok(Some(t.to_kind(Kind::Float).to_device(device)))
            };
            let (exp_avg, exp_avg_sq) = match (restored("exp_avg")?, restored("exp_avg_sq")?) {
                (Some(m), Some(v)) => (m, v),
                (None, None) if step == 0 => (fresh(), fresh()),
                _ => {
                    return Err(Error::Request {
                        reason: format!("optimizer state at step {step} has no moments of {name}"),
                    });
                }
            };
            let low_precision = weight.kind() != Kind::Float;
            let master = low_precision.then(|| -> Result<Tensor> {
                Ok(restored("master")?.unwrap_or_else(|| tch::no_grad(|| weight.to_kind(Kind::Float))))
            });
            let mut master = master.transpose()?;
            let (mut exp_avg, mut exp_avg_sq) = (exp_avg, exp_avg_sq);
            if !owned {
                let none = || Tensor::zeros([0], (Kind::Float, device));
                (exp_avg, exp_avg_sq, master) = (none(), none(), None);
            }
            params.push(Param {
                name,
                weight,
                low_precision,
                owner,
                owned,
                master,
                exp_avg,
                exp_avg_sq,
                grad_sum: None,
            });
        }
        if let Some(extra) = saved.keys().next() {
            return Err(Error::Request { reason: format!("optimizer state {extra} names no trainable weight") });
        }
        let torch = |source| Error::Torch { context: "an optimiser to release gradients".into(), source };
        let mut grad_releaser = tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false).map_err(torch)?;
        let mut low_precision_releaser = tch::COptimizer::sgd(0.0, 0.0, 0.0, 0.0, false).map_err(torch)?;
        for p in &params {
            grad_releaser.add_parameters(&p.weight, 0).map_err(torch)?;
            if p.low_precision {
                low_precision_releaser.add_parameters(&p.weight, 0).map_err(torch)?;
            }
        }
        Ok(AdamW { config: config.clone(), params, step, grad_releaser, low_precision_releaser })
    }

    /// Optimiser steps taken so far, across every version this state continues.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// Names of the weights holding a NaN or an infinity.
    pub fn non_finite_weights(&self) -> Vec<String> {
        tch::no_grad(|| {
            self.params
                .iter()
                .filter(|p| p.weight.isfinite().all().int64_value(&[]) == 0)
                .map(|p| p.name.clone())
                .collect()
        })
    }

    /// Drops the weights' gradients (the next backward allocates them afresh).
    pub fn zero_grad(&mut self) {
        self.grad_releaser.zero_grad().expect("releasing gradients does not fail");
        self.params.iter_mut().for_each(|p| p.grad_sum = None);
    }

    /// Moves the low-precision weights' gradients into their float32 sums: called
    /// between micro-batches, so that each micro-batch's gradient starts from zero in
    /// the weight's dtype and is added in float32.
    pub fn accumulate(&mut self) {
        tch::no_grad(|| {
            for p in self.params.iter_mut().filter(|p| p.low_precision) {
                if p.weight.grad().defined() {
                    p.grad_sum = p.gradient();
                }
            }
        });
        self.low_precision_releaser.zero_grad().expect("releasing gradients does not fail");
    }

    /// The global L2 norm of the step's gradients, as torch's `clip_grad_norm_`
    /// computes it before clipping.
    pub fn grad_norm(&self) -> f64 {
        tch::no_grad(|| {
            let squares: Vec<Tensor> = self
                .params
                .iter()
                .filter_map(Param::gradient)
                .map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double))
                .collect();
            if squares.is_empty() {
                return 0.0;
            }
            Tensor::stack(&squares, 0).sum(Kind::Double).sqrt().double_value(&[])
        })
    }

    /// One step at learning rate `lr`, the gradients scaled by `clip` (1: unclipped).
    pub fn step(&mut self, lr: f64, clip: f64) -> StepChange {
        self.step += 1;
        let [beta1, beta2] = self.config.betas;
        let t = self.step as i32;
        let bias_correction1 = 1.0 - beta1.powi(t);
        let bias_correction2_sqrt = (1.0 - beta2.powi(t)).sqrt();
        let step_size = lr / bias_correction1;
        let decay = 1.0 - lr * self.config.weight_decay;
        let (mut moved, mut norm) = (0.0, 0.0);
        // In place where torch allows it: at a real vocabulary the embedding and lm_head
        // are the largest tensors, and each temporary of their size is ~0.5 GiB at 0.5B.
        tch::no_grad(|| {
            for p in self.params.iter_mut().filter(|p| p.owned) {
                let Some(grad) = p.gradient() else { continue };
                let g = if clip == 1.0 { grad } else { grad * clip };
                // A copy: to_kind of a float32 weight would alias the storage stepped below.
                let mut before = p.weight.to_kind(Kind::Float).copy();
                norm += before.norm().double_value(&[]).powi(2);
                let mut w = p.master.as_ref().map_or_else(|| p.weight.shallow_clone(), Tensor::shallow_clone);
                let _ = w.g_mul_scalar_(decay);
                let _ = p.exp_avg.lerp_(&g, 1.0 - beta1);
                let _ = p.exp_avg_sq.g_mul_scalar_(beta2);
                let _ = p.exp_avg_sq.addcmul_(&g, &(&g * (1.0 - beta2)));
                drop(g);
                // w += exp_avg / denom with denom = (sqrt(v) / bc2 + eps) / −step_size.
                let mut denom = p.exp_avg_sq.sqrt();
                let _ = denom.g_div_scalar_(bias_correction2_sqrt);
                let _ = denom.g_add_scalar_(self.config.eps);
                let _ = denom.g_div_scalar_(-step_size);
                let _ = w.addcdiv_(&p.exp_avg, &denom);
                drop(denom);
                if p.master.is_some() {
                    p.weight.copy_(&w);
                }
                let _ = before.g_sub_(&p.weight.to_kind(Kind::Float));
                moved += before.norm().double_value(&[]).powi(2);
            }
        });
        StepChange { moved_squared: moved, norm_squared: norm }
    }

    /// Gives every rank each weight as its owner stepped it, by `broadcast(weight,
    /// owner)` (with the state sharded).
    pub fn share_weights(&mut self, broadcast: &mut dyn FnMut(&Tensor, u32) -> Result<()>) -> Result<()> {
        tch::no_grad(|| self.params.iter().try_for_each(|p| broadcast(&p.weight, p.owner)))
    }

    /// The whole state, each weight's from its owner by `broadcast(tensor, owner)`, on
    /// the rank that `keeps` it (every rank takes part; the others keep nothing).
    pub fn gathered_state(
        &self,
        keeps: bool,
        broadcast: &mut dyn FnMut(&Tensor, u32) -> Result<()>,
    ) -> Result<Option<AdamWState>> {
        let mut tensors = BTreeMap::new();
        for p in &self.params {
            let kinds: &[&str] =
                if p.low_precision { &["exp_avg", "exp_avg_sq", "master"] } else { &["exp_avg", "exp_avg_sq"] };
            for &kind in kinds {
                let part = match p.owned {
                    true => p.state(kind).shallow_clone(),
                    false => Tensor::zeros(p.weight.size(), (Kind::Float, p.weight.device())),
                };
                broadcast(&part, p.owner)?;
                if keeps {
                    tensors.insert(format!("{kind}.{}", p.name), part.to_device(tch::Device::Cpu));
                }
            }
        }
        Ok(keeps.then_some(AdamWState { step: self.step, tensors }))
    }

    /// Replaces the step's gradients by `sum` of them over the ranks of a data-parallel
    /// update: the float32 gradients (zeros for a weight this rank's micro-batches did
    /// not reach) flattened into buckets of about [`BUCKET_BYTES`] in the weights' name
    /// order, as DDP's reducer flattens them, each summed in place.
    pub fn reduce_gradients(&mut self, sum: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        let gradients: Vec<Tensor> = tch::no_grad(|| {
            self.params
                .iter()
                .map(|p| {
                    p.gradient().unwrap_or_else(|| Tensor::zeros(p.weight.size(), (Kind::Float, p.weight.device())))
                })
                .collect()
        });
        self.zero_grad();
        let mut start = 0;
        while start < gradients.len() {
            let end = bucket_end(&gradients, start);
            let flat = tch::no_grad(|| {
                Tensor::cat(&gradients[start..end].iter().map(|g| g.reshape([-1])).collect::<Vec<_>>(), 0)
            });
            sum(&flat)?;
            let mut offset = 0;
            for (p, g) in self.params[start..end].iter_mut().zip(&gradients[start..end]) {
                let n = g.numel() as i64;
                p.grad_sum = Some(flat.narrow(0, offset, n).view(g.size().as_slice()));
                offset += n;
            }
            start = end;
        }
        Ok(())
    }

    /// sha256 over the trainable weights (names, shapes, dtypes and bytes), as the ranks
    /// of a data-parallel update compare them.
    pub fn weights_digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for p in &self.params {
            let bytes = Vec::<u8>::try_from(
                p.weight.detach().to_device(tch::Device::Cpu).contiguous().view_dtype(Kind::Uint8).reshape([-1]),
            )
            .expect("a weight's bytes");
            hasher.update(format!("{} {:?} {:?} {}\n", p.name, p.weight.size(), p.weight.kind(), bytes.len()));
            hasher.update(&bytes);
        }
        format!("{:x}", hasher.finalize())
    }

    /// The state to save with the checkpoint, on the CPU (of an unsharded optimiser:
    /// a sharded one's is [`AdamW::gathered_state`]).
    pub fn state(&self) -> AdamWState {
        assert!(self.params.iter().all(|p| p.owned), "a sharded optimiser's state is gathered");
        let mut tensors = BTreeMap::new();
        for p in &self.params {
            let cpu = |t: &Tensor| t.to_device(tch::Device::Cpu);
            tensors.insert(format!("exp_avg.{}", p.name), cpu(&p.exp_avg));
            tensors.insert(format!("exp_avg_sq.{}", p.name), cpu(&p.exp_avg_sq));
            if let Some(master) = &p.master {
                tensors.insert(format!("master.{}", p.name), cpu(master));
            }
        }
        AdamWState { step: self.step, tensors }
    }
}

/// The gradient bucket size of a data-parallel update: DDP's default.
pub const BUCKET_BYTES: usize = 25 << 20;

/// The end of the bucket that starts at gradient `start`: as many gradients as fit in
/// [`BUCKET_BYTES`] of float32, one at least.
fn bucket_end(gradients: &[Tensor], start: usize) -> usize {
    let mut bytes = 0;
    let mut end = start;
    while end < gradients.len() {
        let size = gradients[end].numel() * 4;
        if end > start && bytes + size > BUCKET_BYTES {
            break;
        }
        bytes += size;
        end += 1;
    }
    end
}

impl Drop for AdamW {
    /// The weights outlive their optimiser (the policy samples next); their gradients
    /// must not.
    fn drop(&mut self) {
        self.zero_grad();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(values: &[f32], kind: Kind) -> Tensor {
        Tensor::from_slice(values).to_kind(kind).set_requires_grad(true)
    }

    /// Gradient of sum(w · c): c.
    fn set_grad(w: &Tensor, c: &[f32]) {
        (w * Tensor::from_slice(c).to_kind(w.kind())).sum(w.kind()).backward();
    }

    #[test]
    fn each_weights_state_goes_to_the_rank_with_the_fewest_elements_so_far() {
        // 5 → 0 (5, 0), 3 → 1 (5, 3), 3 → 1 (5, 6), 1 → 0 (6, 6).
        assert_eq!(owners(&[5, 3, 3, 1], 2), vec![0, 1, 1, 0]);
        assert_eq!(owners(&[5, 3], 1), vec![0, 0]);
    }

    #[test]
    fn a_rank_keeps_only_the_state_it_owns_and_gathers_the_whole() {
        let config = OptimizerConfig { lr: 0.1, ..Default::default() };
        let weights = || {
            HashMap::from([
                ("a".to_string(), weight(&[1.0, 2.0, 3.0], Kind::Float)),
                ("b".to_string(), weight(&[4.0], Kind::BFloat16)),
            ])
        };
        // Rank 1 of 2 owns b (a, the larger, went to rank 0).
        let adamw = AdamW::new(weights(), &config, None, Some(StateShard { rank: 1, ranks: 2 })).unwrap();
        let owned: Vec<(&str, bool, i64)> =
            adamw.params.iter().map(|p| (p.name.as_str(), p.owned, p.exp_avg.numel() as i64)).collect();
        assert_eq!(owned, vec![("a", false, 0), ("b", true, 1)]);
        // Gathered, with the "broadcast" marking which owner each part came from.
        let mut from = Vec::new();
        let record = &mut |_: &Tensor, owner| {
            from.push(owner);
            Ok(())
        };
        let state = adamw.gathered_state(true, record).unwrap().unwrap();
        assert_eq!(from, vec![0, 0, 1, 1, 1], "a's two moments from rank 0, b's and its master from rank 1");
        let names: Vec<&String> = state.tensors.keys().collect();
        assert_eq!(names, ["exp_avg.a", "exp_avg.b", "exp_avg_sq.a", "exp_avg_sq.b", "master.b"]);
        // The whole state loads on a rank of any other number of ranks.
        assert!(AdamW::new(weights(), &config, Some(state), Some(StateShard { rank: 0, ranks: 3 })).is_ok());
    }

    #[test]
    fn gradients_are_summed_in_buckets_in_name_order_and_step_as_summed() {
        // A gradient as large as a whole bucket gets one of its own; small ones share.
        let big = (BUCKET_BYTES / 4) as i64;
        let sizes = [3i64, big, 2, 5];
        let grads: Vec<Tensor> = sizes.iter().map(|&n| Tensor::zeros([n], (Kind::Float, tch::Device::Cpu))).collect();
        assert_eq!((bucket_end(&grads, 0), bucket_end(&grads, 1), bucket_end(&grads, 2)), (1, 2, 4));

        let config = OptimizerConfig { lr: 0.1, weight_decay: 0.0, ..Default::default() };
        let a = weight(&[1.0, 2.0], Kind::Float);
        let b = weight(&[3.0], Kind::BFloat16);
        let weights = HashMap::from([("a".to_string(), a.shallow_clone()), ("b".to_string(), b.shallow_clone())]);
        let mut adamw = AdamW::new(weights, &config, None, None).unwrap();
        set_grad(&a, &[0.5, -1.0]);
        adamw.accumulate();
        // `b` got no gradient on this rank: it is summed as zeros. The "other rank" adds 1.
        let mut seen = Vec::new();
        adamw
            .reduce_gradients(&mut |bucket| {
                seen.push(Vec::<f32>::try_from(bucket).unwrap());
                let _ = bucket.shallow_clone().g_add_scalar_(1.0);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, vec![vec![0.5, -1.0, 0.0]], "one bucket, a then b");
        assert!((adamw.grad_norm() - (1.5f64.powi(2) + 0.0 + 1.0).sqrt()).abs() < 1e-6);
        let before = adamw.weights_digest();
        adamw.step(0.1, 1.0);
        assert_ne!(adamw.weights_digest(), before);
        // Adam's first step moves each weight by lr against its gradient's sign: 1.5, 0, 1.
        let a_now = Vec::<f32>::try_from(&a).unwrap();
        assert!((a_now[0] - 0.9).abs() < 1e-6 && (a_now[1] - 2.0).abs() < 1e-6, "{a_now:?}");
    }

    #[test]
    fn a_step_matches_adamw_by_hand() {
        let config =
            OptimizerConfig { lr: 0.1, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1e-8, ..Default::default() };
        let w = weight(&[1.0, -2.0], Kind::Float);
        let mut adamw = AdamW::new(HashMap::from([("w".to_string(), w.shallow_clone())]), &config, None, None).unwrap();
        set_grad(&w, &[0.5, -4.0]);
        let change = adamw.step(0.1, 1.0).relative();
        // t = 1: m̂ = g, v̂ = g², so each weight moves by lr · sign(g) after decay.
        let expected = [1.0 * (1.0 - 0.001) - 0.1, -2.0 * (1.0 - 0.001) + 0.1];
        let got = Vec::<f32>::try_from(&w).unwrap();
        for (g, e) in got.iter().zip(expected) {
            assert!((f64::from(*g) - e).abs() < 1e-6, "{got:?}");
        }
        let moved = ((expected[0] - 1.0f64).powi(2) + (expected[1] + 2.0f64).powi(2)).sqrt() / 5f64.sqrt();
        assert!((change - moved).abs() < 1e-6, "{change:?} vs {moved}");
    }

    #[test]
    fn a_small_step_on_bf16_weights_accumulates_in_the_master() {
        let config = OptimizerConfig { lr: 1e-6, weight_decay: 0.0, ..Default::default() };
        let w = weight(&[0.02, 0.03], Kind::BFloat16);
        let start = Vec::<f32>::try_from(w.to_kind(Kind::Float)).unwrap();
        let mut adamw = AdamW::new(HashMap::from([("w".to_string(), w.shallow_clone())]), &config, None, None).unwrap();
        let mut first = None;
        for _ in 0..2000 {
            adamw.zero_grad();
            set_grad(&w, &[1.0, 1.0]);
            let change = adamw.step(1e-6, 1.0);
            first.get_or_insert(change.relative());
        }
        // One step is 1e-6: invisible in bf16, so the first step moved nothing…
        assert_eq!(first, Some(0.0));
        // …but 2000 of them (2e-3) add up in the float32 master and reach the weights.
        let master = Vec::<f32>::try_from(&adamw.state().tensors["master.w"]).unwrap();
        assert!((f64::from(master[0]) - (0.02 - 2e-3)).abs() < 2e-4, "{master:?}");
        let now = Vec::<f32>::try_from(w.to_kind(Kind::Float)).unwrap();
        assert!(now[0] < start[0] - 1e-3 && now[1] < start[1] - 1e-3, "{start:?} -> {now:?}");
    }

    #[test]
    fn the_gradient_norm_spans_every_weight() {
        let (a, b, untouched) =
            (weight(&[0.0, 0.0], Kind::Float), weight(&[0.0], Kind::Float), weight(&[0.0; 3], Kind::Float));
        let weights = HashMap::from([
            ("a".to_string(), a.shallow_clone()),
            ("b".into(), b.shallow_clone()),
            ("u".into(), untouched),
        ]);
        let adamw = AdamW::new(weights, &OptimizerConfig::default(), None, None).unwrap();
        // Gradients (3, 0) and (4): global norm 5; a weight without a gradient adds nothing.
        set_grad(&a, &[3.0, 0.0]);
        set_grad(&b, &[4.0]);
        assert!((adamw.grad_norm() - 5.0).abs() < 1e-9);
    }

    #[test]
    fn bf16_gradients_of_micro_batches_are_summed_in_float32() {
        let config = OptimizerConfig::default();
        let w = weight(&[1.0, 1.0], Kind::BFloat16);
        let mut adamw = AdamW::new(HashMap::from([("w".to_string(), w.shallow_clone())]), &config, None, None).unwrap();
        // 1 + 2^-9 is 1 in bf16 (8 bits of mantissa), 1.001953125 in float32.
        set_grad(&w, &[1.0, 0.5]);
        adamw.accumulate();
        assert!(!w.grad().defined(), "the bf16 gradient moved into the float32 sum");
        set_grad(&w, &[1.0 / 512.0, 0.5]);
        let sum = Vec::<f32>::try_from(adamw.params[0].gradient().unwrap()).unwrap();
        assert_eq!(sum, [1.0 + 1.0 / 512.0, 1.0]);
        let norm = ((1.0f64 + 1.0 / 512.0).powi(2) + 1.0).sqrt();
        assert!((adamw.grad_norm() - norm).abs() < 1e-9, "{} vs {norm}", adamw.grad_norm());
        // Left in bf16, the same two gradients lose the small one.
        let v = weight(&[1.0, 1.0], Kind::BFloat16);
        set_grad(&v, &[1.0, 0.5]);
        set_grad(&v, &[1.0 / 512.0, 0.5]);
        assert_eq!(Vec::<f32>::try_from(v.grad().to_kind(Kind::Float)).unwrap(), [1.0, 1.0]);
        adamw.zero_grad();
        assert!(adamw.params[0].gradient().is_none(), "zero_grad clears the sums too");
    }

    #[test]
    fn the_state_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = BTreeMap::from([
            ("exp_avg.w".to_string(), Tensor::from_slice(&[0.5f32, -1.25])),
            ("master.w".to_string(), Tensor::from_slice(&[1e-7f32, 3.0])),
        ]);
        let path = dir.path().join(OPTIMIZER_FILE);
        AdamWState { step: 42, tensors }.save(&path).unwrap();
        let back = AdamWState::load(&path).unwrap();
        assert_eq!(back.step, 42);
        assert_eq!(Vec::<f32>::try_from(&back.tensors["master.w"]).unwrap(), [1e-7, 3.0]);
        assert_eq!(back.tensors.len(), 2);
    }

    #[test]
    fn gradients_are_released_between_steps_and_with_the_optimiser() {
        let w = weight(&[1.0, 2.0], Kind::Float);
        let config = OptimizerConfig::default();
        let mut adamw = AdamW::new(HashMap::from([("w".to_string(), w.shallow_clone())]), &config, None, None).unwrap();
        set_grad(&w, &[1.0, 1.0]);
        adamw.zero_grad();
        assert!(!w.grad().defined());
        // Micro-batches still accumulate into the gradient the first one allocates.
        set_grad(&w, &[3.0, -1.0]);
        set_grad(&w, &[0.5, 0.5]);
        assert_eq!(Vec::<f32>::try_from(&w.grad()).unwrap(), [3.5, -0.5]);
        adamw.step(0.1, 1.0);
        drop(adamw);
        assert!(!w.grad().defined(), "the weights keep no gradient after their optimiser");
    }

    #[test]
    fn a_restored_state_continues_the_same_optimisation() {
        let config = OptimizerConfig { lr: 0.05, ..Default::default() };
        let grads = [[0.3f32, -1.0], [0.1, 0.4], [-0.7, 0.2]];
        let run = |split: bool| -> Vec<f32> {
            let w = weight(&[0.5, 0.25], Kind::Float);
            let weights = || HashMap::from([("w".to_string(), w.shallow_clone())]);
            let mut adamw = AdamW::new(weights(), &config, None, None).unwrap();
            for (i, g) in grads.iter().enumerate() {
                if split && i == 2 {
                    let state = adamw.state();
                    adamw = AdamW::new(weights(), &config, Some(state), None).unwrap();
                }
                adamw.zero_grad();
                set_grad(&w, g);
                adamw.step(0.05, 1.0);
            }
            Vec::<f32>::try_from(&w).unwrap()
        };
        assert_eq!(run(true), run(false));
    }
}
