//! Each agent's value head: loaded from and saved to its policy's checkpoint, the
//! features it reads, and its fit to the value targets.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::{CriticConfig, CriticInput};
use crate::algo::critic::{clipped_value_loss, explained_variance};
use crate::model::{AdamW, AdamWState, LanguageModel, Result, VALUE_HEAD_FILE, ValueHead};
use crate::rng::{Key, name_key, permutation, stream};

/// The folder of a policy checkpoint that holds its agents' value heads.
pub const CRITIC_DIR: &str = "critic";

/// One agent's head and the optimiser state its fit continues.
struct Critic {
    head: ValueHead,
    state: Option<AdamWState>,
}

/// The value heads of the agents one policy plays, by agent.
pub struct Critics {
    heads: BTreeMap<String, Critic>,
}

/// What a head is fitted on: the features of N valued positions (N, E), the values the
/// head gave them when they were sampled, and their value targets; `positions[i]` of
/// them, in order, are sample i's (one for a turn valued once, one per reply token).
#[derive(Clone, Copy)]
pub struct FitSet<'a> {
    pub features: &'a Tensor,
    pub old_values: &'a [f64],
    pub targets: &'a [f64],
    pub positions: &'a [usize],
}

/// What one step of a head's optimiser saw and did.
#[derive(Debug, Clone, PartialEq)]
pub struct FitStep {
    pub agent: String,
    pub step: u32,
    /// The clipped value loss the step took the gradient of (mean over its samples).
    pub loss: f64,
    /// The share of samples whose clipped prediction was the larger loss.
    pub clip_fraction: f64,
    /// Of the targets by the head's predictions before the step.
    pub explained_variance: Option<f64>,
    pub grad_norm: f64,
    pub weights_change: f64,
    pub learning_rate: f64,
    pub sequences: u32,
    /// The loss or the gradient norm was not finite: no step was taken.
    pub skipped: bool,
}

fn head_file(agent: &str) -> String {
    format!("{agent}.{VALUE_HEAD_FILE}")
}

fn optimizer_file(agent: &str) -> String {
    format!("{agent}.optimizer.safetensors")
}

impl Critics {
    /// The heads of `agents` saved in `dir` (a checkpoint's critic folder; absent in a
    /// version that has none), each one not there fresh from `seed`, for a trunk whose
    /// hidden states are `hidden_size` wide.
    pub fn load(dir: Option<&Path>, agents: &[&str], hidden_size: i64, seed: u64, device: Device) -> Result<Critics> {
        let mut heads = BTreeMap::new();
        for &agent in agents {
            let saved = dir.map(|d| (d.join(head_file(agent)), d.join(optimizer_file(agent))));
            let critic = match saved.filter(|(head, _)| head.is_file()) {
                Some((head, optimizer)) => Critic {
                    head: ValueHead::load(&head, hidden_size, device)?,
                    state: optimizer.is_file().then(|| AdamWState::load(&optimizer)).transpose()?,
                },
                None => Critic {
                    head: ValueHead::new(hidden_size, stream(&[seed, Key::CRITIC, name_key(agent)]), device),
                    state: None,
                },
            };
            heads.insert(agent.to_owned(), critic);
        }
        Ok(Critics { heads })
    }

    /// The values `agent`'s head gives the rows of `features` (N, E).
    pub fn values(&self, agent: &str, features: &Tensor) -> Vec<f64> {
        let values = tch::no_grad(|| self.head(agent).head.forward(features)).to_kind(Kind::Double);
        Vec::<f64>::try_from(values).expect("a float tensor")
    }

    fn head(&self, agent: &str) -> &Critic {
        self.heads.get(agent).unwrap_or_else(|| panic!("no value head was loaded for agent {agent}"))
    }

    /// Fits `agent`'s head to `set`: `config.epochs` seeded passes in mini-batches of
    /// samples, each step on the clipped value loss (the mean over their positions)
    /// against the values predicted at sampling time, gradients clipped to a norm of
    /// `grad_clip`.
    pub fn fit(
        &mut self,
        agent: &str,
        set: &FitSet,
        config: &CriticConfig,
        grad_clip: f64,
        seed: u64,
    ) -> Result<Vec<FitStep>> {
        let FitSet { features, old_values: old, targets, positions } = *set;
        assert_eq!(positions.iter().sum::<usize>(), old.len(), "positions for every value");
        let critic = self.heads.get_mut(agent).unwrap_or_else(|| panic!("no value head was loaded for agent {agent}"));
        let weights = critic.head.var_store().variables();
        let mut optimizer = AdamW::new(weights, &config.optimizer, critic.state.take(), None)?;
        let starts: Vec<usize> = positions.iter().scan(0, |at, &p| Some(std::mem::replace(at, *at + p))).collect();
        let n = positions.len();
        let mini_batch = config.mini_batch_sequences as usize;
        let total = optimizer.steps_taken() + (n.div_ceil(mini_batch) * config.epochs as usize) as u64;
        let device = features.device();
        let column = |xs: &[f64], rows: &[usize]| {
            let picked: Vec<f32> = rows.iter().map(|&i| xs[i] as f32).collect();
            Tensor::from_slice(&picked).to_device(device)
        };
        let mut steps = Vec::new();
        for epoch in 0..config.epochs {
            for samples in permutation(n, stream(&[seed, u64::from(epoch)])).chunks(mini_batch) {
                let rows: Vec<usize> = samples.iter().flat_map(|&i| starts[i]..starts[i] + positions[i]).collect();
                let rows = rows.as_slice();
                let index: Vec<i64> = rows.iter().map(|&i| i as i64).collect();
                let x = features.index_select(0, &Tensor::from_slice(&index).to_device(device));
                let (old_t, target_t) = (column(old, rows), column(targets, rows));
                optimizer.zero_grad();
                let predicted = critic.head.forward(&x);
                let loss = clipped_value_loss_tensor(&predicted, &old_t, &target_t, config.value_clip);
                loss.backward();
                let before: Vec<f64> = Vec::try_from(predicted.detach().to_kind(Kind::Double)).expect("floats");
                let picked = |xs: &[f64]| rows.iter().map(|&i| xs[i]).collect::<Vec<f64>>();
                let (old_rows, target_rows) = (picked(old), picked(targets));
                let loss = loss.double_value(&[]);
                let grad_norm = optimizer.grad_norm();
                let lr = config.optimizer.learning_rate(optimizer.steps_taken(), total);
                let skipped = !(loss.is_finite() && grad_norm.is_finite());
                let weights_change = if skipped {
                    0.0
                } else {
                    optimizer.step(lr, (grad_clip / (grad_norm + 1e-6)).min(1.0)).relative()
                };
                steps.push(FitStep {
                    agent: agent.to_owned(),
                    step: steps.len() as u32,
                    loss,
                    clip_fraction: clip_fraction(&before, &old_rows, &target_rows, config.value_clip),
                    explained_variance: explained_variance(&before, &target_rows),
                    grad_norm,
                    weights_change,
                    learning_rate: lr,
                    sequences: samples.len() as u32,
                    skipped,
                });
            }
        }
        critic.state = Some(optimizer.state());
        Ok(steps)
    }

    /// Writes every head and its optimiser state into `dir` (created).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| crate::model::Error::io(dir, e))?;
        for (agent, critic) in &self.heads {
            critic.head.save(&dir.join(head_file(agent)))?;
            if let Some(state) = &critic.state {
                state.save(&dir.join(optimizer_file(agent)))?;
            }
        }
        Ok(())
    }
}

/// The share of predictions for which the clipped one gave the larger loss.
fn clip_fraction(values: &[f64], old: &[f64], targets: &[f64], clip: f64) -> f64 {
    let clipped = values
        .iter()
        .zip(old)
        .zip(targets)
        .filter(|((v, o), r)| clipped_value_loss(**v, **o, **r, clip) > 0.5 * (**v - **r).powi(2))
        .count();
    clipped as f64 / values.len().max(1) as f64
}

/// `algo::critic::clipped_value_loss` on tensors, the mean over the (b,) predictions.
pub fn clipped_value_loss_tensor(values: &Tensor, old: &Tensor, targets: &Tensor, clip: f64) -> Tensor {
    let clipped = old + (values - old).clamp(-clip, clip);
    let free = (values - targets).square();
    let held = (clipped - targets).square();
    free.maximum(&held).mean(Kind::Float) * 0.5
}

/// The final hidden states at the valued positions of each input, the last `positions`
/// of its ids, (Σ positions, E) float32 in input order, through the policy's `adapter`,
/// without gradients: what a head reads. Inputs are forwarded shortest first, as many at
/// once as fit `max_tokens` padded tokens.
pub fn features(
    model: &mut LanguageModel,
    adapter: Option<&str>,
    inputs: &[CriticInput],
    max_tokens: usize,
) -> Result<Tensor> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| inputs[i].ids.len());
    let width = model.config().hidden_size as i64;
    let mut by_input: Vec<Option<Tensor>> = (0..inputs.len()).map(|_| None).collect();
    let mut start = 0;
    while start < order.len() {
        // Sorted by length: the last row of a chunk is its longest.
        let mut end = start + 1;
        while end < order.len() && (end + 1 - start) * inputs[order[end]].ids.len() <= max_tokens {
            end += 1;
        }
        let chunk: Vec<Vec<i64>> = order[start..end].iter().map(|&i| inputs[i].ids.clone()).collect();
        let adapters = vec![adapter.map(str::to_owned); chunk.len()];
        // Left-padded: every row ends at its last token.
        let hidden = model.padded_hidden(&chunk, &adapters)?;
        let padded_length = hidden.size()[1];
        for (row, &i) in order[start..end].iter().enumerate() {
            let positions = inputs[i].positions as i64;
            // A copy, not a view that would keep the chunk's whole (B, P, E) states alive.
            let valued = hidden.get(row as i64).narrow(0, padded_length - positions, positions);
            by_input[i] = Some(valued.to_kind(Kind::Float).copy());
        }
        start = end;
    }
    if inputs.is_empty() {
        return Ok(Tensor::zeros([0, width], (Kind::Float, model.device())));
    }
    let rows: Vec<Tensor> = by_input.into_iter().map(|t| t.expect("every input was forwarded")).collect();
    Ok(Tensor::cat(&rows, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LoadOptions;
    use crate::model::testing::fixture;

    #[test]
    fn the_tensor_value_loss_is_the_mean_of_the_pure_function() {
        let (values, old, targets) = ([0.6, 0.9, 0.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0]);
        let t = |xs: &[f64; 3]| Tensor::from_slice(&xs.map(|x| x as f32));
        let got = clipped_value_loss_tensor(&t(&values), &t(&old), &t(&targets), 0.2).double_value(&[]);
        let expected: f64 = (0..3).map(|i| clipped_value_loss(values[i], old[i], targets[i], 0.2)).sum::<f64>() / 3.0;
        assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
        // By hand (algo::critic's cases): (0.08 + 0.045 + 0.5) / 3.
        assert!((expected - 0.625 / 3.0).abs() < 1e-12);
        assert!((clip_fraction(&values, &old, &targets, 0.2) - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn a_head_fits_its_targets_and_saves_and_loads_back_with_its_optimiser() {
        let mut model = LanguageModel::load(&fixture("hf-tiny-qwen3"), &LoadOptions::default()).unwrap();
        let ids = |i: i64| (0..(2 + i % 3)).map(|j| (7 * i + j) % 50 + 1).collect();
        let inputs: Vec<CriticInput> = (0..8).map(|i| CriticInput { ids: ids(i), positions: 1 }).collect();
        let x = features(&mut model, None, &inputs, 8).unwrap();
        // Batched in chunks or one at a time: the same features, in input order.
        let alone = features(&mut model, None, &inputs[5..6], 1000).unwrap();
        assert!((x.get(5) - alone.get(0)).abs().max().double_value(&[]) < 1e-5);
        // Every position of an input: its last row is the input's state, the one before
        // it that of the input without its last token.
        let all = CriticInput { ids: inputs[5].ids.clone(), positions: inputs[5].ids.len() };
        let shorter = CriticInput { ids: inputs[5].ids[..inputs[5].ids.len() - 1].to_vec(), positions: 1 };
        let both = features(&mut model, None, &[shorter, all.clone(), inputs[0].clone()], 1000).unwrap();
        let n = all.positions as i64;
        assert_eq!(both.size(), [1 + n + 1, model.config().hidden_size as i64]);
        assert!((both.get(n) - alone.get(0)).abs().max().double_value(&[]) < 1e-5);
        assert!((both.get(n - 1) - both.get(0)).abs().max().double_value(&[]) < 1e-5);
        assert!((both.get(n + 1) - x.get(0)).abs().max().double_value(&[]) < 1e-5);
        let width = model.config().hidden_size as i64;
        let mut critics = Critics::load(None, &["a"], width, 3, Device::Cpu).unwrap();
        let targets: Vec<f64> = (0..8).map(|i| f64::from(i % 2)).collect();
        let config = CriticConfig { epochs: 60, mini_batch_sequences: 4, value_clip: 10.0, ..CriticConfig::default() };
        let old = critics.values("a", &x);
        let set = FitSet { features: &x, old_values: &old, targets: &targets, positions: &[1; 8] };
        let steps = critics.fit("a", &set, &config, 1.0, 9).unwrap();
        assert_eq!(steps.len(), 120);
        let (first, last) = (&steps[0], &steps[119]);
        assert!(last.loss < first.loss / 2.0, "the loss falls: {} then {}", first.loss, last.loss);
        let dir = tempfile::tempdir().unwrap();
        critics.save(dir.path()).unwrap();
        assert!(
            dir.path().join("a.value_head.safetensors").is_file()
                && dir.path().join("a.optimizer.safetensors").is_file()
        );
        let again = Critics::load(Some(dir.path()), &["a", "b"], width, 3, Device::Cpu).unwrap();
        assert_eq!(again.values("a", &x), critics.values("a", &x));
        assert!(again.heads["a"].state.is_some(), "the optimiser state comes back with the head");
        assert!(again.heads["b"].state.is_none(), "an agent without a saved head starts afresh");
        // A fresh head is keyed by the seed and the agent.
        let fresh = Critics::load(None, &["a", "b"], width, 3, Device::Cpu).unwrap();
        assert_eq!(fresh.values("a", &x), old);
        assert_ne!(fresh.values("b", &x), old);
    }
}
