//! LoRA adapters on a frozen base, several per base (one per role), chosen per batch row.
//!
//! An adapter adds `scale · B(A(dropout(x)))` to the output of each linear layer it
//! targets, with A (r, in) and B (out, r) and `scale = alpha / r` (PEFT's `LoraLayer`).
//! Each adapter lives in its own VarStore whose paths are PEFT's saved keys
//! (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), so an optimizer
//! built on it trains that adapter only, and saving it writes PEFT's
//! `adapter_model.safetensors`. A is kaiming-uniform (bound 1/√in) and B zero, so a new
//! adapter leaves the model's output unchanged.
//!
//! A batch row picks its adapter through a [`Route`]: rows are grouped by adapter, and
//! each group's update is computed on its rows only and added back with `index_add`.
//!
//! Adapters live in float32 whatever the base computes in: the branch casts its input up
//! and its update back down to the base's dtype, so an optimiser step on an adapter is
//! never rounded to bf16.

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use crate::rng::{combine, tensor_key, uniform_tensor};
use crate::validate::{Invalid, check};

/// `lora:` of a policy: train a low-rank adapter on a frozen base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// Rank of the low-rank update.
    pub rank: u32,
    /// Scaling numerator: the update is scaled by alpha / rank.
    pub alpha: f64,
    /// Dropout on the adapter's input during training.
    pub dropout: f64,
    /// Linear layers that get an adapter, by their last name segment; all of them when empty.
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig { rank: 16, alpha: 32.0, dropout: 0.0, targets: Vec::new() }
    }
}

impl LoraConfig {
    pub fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(self.rank >= 1, format!("{key}.rank"), "must be at least 1")?;
        check(self.alpha > 0.0, format!("{key}.alpha"), "must be positive")?;
        check((0.0..1.0).contains(&self.dropout), format!("{key}.dropout"), "must be in [0, 1)")
    }
}

/// The two low-rank factors of one adapted linear layer.
#[derive(Debug)]
pub(crate) struct LoraWeights {
    /// (r, in).
    pub(crate) a: Tensor,
    /// (out, r).
    pub(crate) b: Tensor,
    /// alpha / r.
    pub(crate) scale: f64,
    /// Probability of zeroing an input element during training.
    pub(crate) dropout: f64,
}

/// Rows of one adapter: all rows of the batch, or some of them.
#[derive(Debug)]
enum Rows {
    All,
    Some(Tensor),
}

/// Which adapter each batch row uses, for one forward.
#[derive(Debug, Default)]
pub(crate) struct Route {
    /// (adapter slot, its rows); rows without an adapter are in no group.
    groups: Vec<(usize, Rows)>,
    /// Training forward: LoRA dropout draws its masks from streams keyed by this seed.
    dropout_seed: Option<u64>,
}

impl Route {
    /// Row i uses adapter `slots[i]` (or none); `dropout_seed` is set for training forwards.
    pub(crate) fn new(slots: &[Option<usize>], device: Device, dropout_seed: Option<u64>) -> Route {
        let mut used: Vec<usize> = slots.iter().flatten().copied().collect();
        used.sort_unstable();
        used.dedup();
        let groups = used
            .into_iter()
            .map(|slot| {
                let rows: Vec<i64> = (0..slots.len() as i64).filter(|&i| slots[i as usize] == Some(slot)).collect();
                if rows.len() == slots.len() {
                    (slot, Rows::All)
                } else {
                    (slot, Rows::Some(Tensor::from_slice(&rows).to_device(device)))
                }
            })
            .collect();
        Route { groups, dropout_seed }
    }

    /// Adds each routed adapter's update to `y` = base(x). x (B, …, in), y (B, …, out).
    pub(crate) fn apply(&self, adapters: &[Option<LoraWeights>], prefix: &str, x: &Tensor, mut y: Tensor) -> Tensor {
        for (slot, rows) in &self.groups {
            let Some(Some(lora)) = adapters.get(*slot) else { continue };
            let xs = match rows {
                Rows::All => x.shallow_clone(),
                Rows::Some(rows) => x.index_select(0, rows),
            };
            let xs = xs.to_kind(lora.a.kind());
            let xs = match self.dropout_seed {
                Some(seed) if lora.dropout > 0.0 => {
                    dropout(&xs, lora.dropout, combine(combine(seed, *slot as u64), tensor_key(prefix)))
                }
                _ => xs,
            };
            let update = xs.linear::<Tensor>(&lora.a, None).linear::<Tensor>(&lora.b, None) * lora.scale;
            let update = update.to_kind(y.kind());
            y = match rows {
                Rows::All => y + update,
                Rows::Some(rows) => y.index_add(0, rows, &update),
            };
        }
        y
    }
}

/// Inverted dropout with a mask drawn on the device from the stream `key` (same key, same
/// mask, so a recomputed forward matches the first one).
fn dropout(x: &Tensor, p: f64, key: u64) -> Tensor {
    let keep = uniform_tensor(key, &x.size(), x.device()).ge(p);
    x * keep.to_kind(x.kind()) * (1.0 / (1.0 - p))
}

/// The default targets: every linear layer of the decoder (PEFT's "all-linear", which
/// leaves lm_head out).
pub const ALL_LINEAR: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// Whether a linear layer named `name` is adapted, given `targets` (empty means all).
pub(crate) fn targets_layer(targets: &[String], name: &str) -> bool {
    if targets.is_empty() || targets.iter().any(|t| t == "all-linear") {
        ALL_LINEAR.contains(&name)
    } else {
        targets.iter().any(|t| t == name)
    }
}

/// Kaiming-uniform bound with a = √5 (PEFT's and nn.Linear's default): 1/√fan_in.
pub(crate) fn lora_a_bound(fan_in: i64) -> f64 {
    1.0 / (fan_in as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn routed_rows_get_their_own_adapter_only() {
        let x = Tensor::ones([3, 1, 2], (Kind::Float, Device::Cpu));
        let base = Tensor::zeros([3, 1, 2], (Kind::Float, Device::Cpu));
        let lora = |v: f64| LoraWeights {
            a: Tensor::full([1, 2], v, (Kind::Float, Device::Cpu)),
            b: Tensor::ones([2, 1], (Kind::Float, Device::Cpu)),
            scale: 1.0,
            dropout: 0.0,
        };
        let adapters = vec![Some(lora(1.0)), Some(lora(10.0))];
        // Row 0: adapter 1; row 1: none; row 2: adapter 0. Update = 2·v per output.
        let route = Route::new(&[Some(1), None, Some(0)], Device::Cpu, None);
        let y = route.apply(&adapters, "q_proj", &x, base);
        let got: Vec<f64> = (0..3).map(|i| y.double_value(&[i, 0, 0])).collect();
        assert_eq!(got, vec![20.0, 0.0, 2.0]);
    }

    #[test]
    fn dropout_masks_repeat_for_a_key_and_keep_the_mean() {
        let x = Tensor::ones([1000], (Kind::Float, Device::Cpu));
        let (a, b) = (dropout(&x, 0.25, 9), dropout(&x, 0.25, 9));
        assert!(a.equal(&b));
        assert!(!a.equal(&dropout(&x, 0.25, 10)));
        let mean = a.mean(Kind::Float).double_value(&[]);
        assert!((mean - 1.0).abs() < 0.1, "{mean}");
    }

    #[test]
    fn empty_targets_mean_every_linear_layer_but_lm_head() {
        assert!(targets_layer(&[], "down_proj") && !targets_layer(&[], "lm_head"));
        assert!(targets_layer(&["q_proj".into()], "q_proj") && !targets_layer(&["q_proj".into()], "v_proj"));
    }
}
