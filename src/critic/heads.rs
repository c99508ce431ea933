//! Each agent's value head (and, with `critic.lora`, its adapter on the critic model's
//! trunk): loaded from and saved to its policy's checkpoint, the features it reads, and
//! its fit to the value targets.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tch::{Kind, Tensor};

use super::{CriticConfig, CriticInput};
use crate::algo::critic::{clipped_value_loss, explained_variance};
use crate::model::{AdamW, AdamWState, LanguageModel, Result, VALUE_HEAD_FILE, ValueHead, write_safetensors};
use crate::rng::{Key, name_key, permutation, stream};

/// The folder of a policy checkpoint that holds its agents' value heads.
pub const CRITIC_DIR: &str = "critic";

/// One agent's head, its adapter on the critic model's trunk if it trains one, and the
/// optimiser state their fit continues.
struct Critic {
    head: ValueHead,
    adapter: Option<TrunkAdapter>,
    state: Option<AdamWState>,
}

/// An agent's LoRA adapter on the critic model, trained with its head.
struct TrunkAdapter {
    /// Its name on the critic model.
    name: String,
    /// The model's own variables of it (shared storage): what the fit steps and saves.
    weights: HashMap<String, Tensor>,
}

/// The value heads of the agents one policy plays, by agent.
pub struct Critics {
    heads: BTreeMap<String, Critic>,
}

/// The trunk the heads read: `model` through `adapter` (the policy's own, or none),
/// forwarding at most `max_tokens` padded tokens at once. An agent that trains an
/// adapter of its own on it reads through that one instead.
pub struct Trunk<'a> {
    pub model: &'a mut LanguageModel,
    pub adapter: Option<&'a str>,
    pub max_tokens: usize,
}

/// What a head is fitted on: the critic inputs of its samples, the values the critic
/// gave their valued positions when they were sampled, and their value targets, the
/// positions of input i in order (one for a turn valued once, one per reply token).
/// Without old values the loss is not clipped: the head is fitted afresh, not held near
/// what it predicted before (the warm start), and nothing needs forwarding to know them.
#[derive(Clone, Copy)]
pub struct FitSet<'a> {
    pub inputs: &'a [CriticInput],
    pub old_values: Option<&'a [f64]>,
    pub targets: &'a [f64],
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

/// The file of an agent's trunk adapter: one safetensors file under PEFT's keys (the
/// checkpoint's critic folder is flat; its settings are the run's `critic.lora`).
fn adapter_file(agent: &str) -> String {
    format!("{agent}.lora.safetensors")
}

/// The name of an agent's trunk adapter on the critic model.
fn adapter_name(agent: &str) -> String {
    format!("critic.{agent}")
}

impl Critics {
    /// The heads of `agents` saved in `dir` (a checkpoint's critic folder; absent in a
    /// version that has none), each one not there fresh from `seed`, for `trunk`'s
    /// hidden states. With `critic.lora` (`trunk` is then the critic model) each agent's
    /// adapter is added to it, saved or fresh; a fresh adapter restarts its head's
    /// optimiser, whose state has no moments for it.
    pub fn load(
        trunk: &mut LanguageModel,
        dir: Option<&Path>,
        agents: &[&str],
        critic: &CriticConfig,
        seed: u64,
    ) -> Result<Critics> {
        let (hidden_size, device) = (trunk.config().hidden_size as i64, trunk.device());
        let mut heads = BTreeMap::new();
        for &agent in agents {
            let saved = |file: String| dir.map(|d| d.join(file)).filter(|path| path.is_file());
            let head = match saved(head_file(agent)) {
                Some(path) => ValueHead::load(&path, hidden_size, device)?,
                None => ValueHead::new(hidden_size, stream(&[seed, Key::CRITIC, name_key(agent)]), device),
            };
            let mut state = saved(optimizer_file(agent)).map(|path| AdamWState::load(&path)).transpose()?;
            let adapter = match (&critic.lora, saved(adapter_file(agent))) {
                (Some(lora), Some(path)) => {
                    Some(trunk_adapter(trunk, agent, |m, name| m.load_adapter_file(name, lora, &path))?)
                }
                (Some(lora), None) => {
                    state = None;
                    let key = stream(&[seed, Key::CRITIC, name_key(agent), Key::LORA]);
                    Some(trunk_adapter(trunk, agent, |m, name| m.add_adapter(name, lora, key))?)
                }
                (None, Some(path)) => {
                    return Err(crate::model::Error::Format {
                        file: path,
                        reason: "holds a critic trunk adapter trained with its head, which critic.lora is not set \
                                 to read: set critic.lora as the run that trained it did"
                            .into(),
                    });
                }
                (None, None) => None,
            };
            heads.insert(agent.to_owned(), Critic { head, adapter, state });
        }
        Ok(Critics { heads })
    }

    /// The values `agent`'s critic gives the valued positions of `inputs`, in order.
    pub fn values(&self, trunk: &mut Trunk, agent: &str, inputs: &[CriticInput]) -> Result<Vec<f64>> {
        let critic = self.critic(agent);
        let adapter = critic.adapter.as_ref().map_or(trunk.adapter, |a| Some(a.name.as_str()));
        let x = features(trunk.model, adapter, inputs, trunk.max_tokens)?;
        Ok(head_values(&critic.head, &x))
    }

    fn critic(&self, agent: &str) -> &Critic {
        self.heads.get(agent).unwrap_or_else(|| panic!("no value head was loaded for agent {agent}"))
    }

    /// Fits `agent`'s head to `set`: `config.epochs` seeded passes in mini-batches of
    /// samples, each step on the clipped value loss (the mean over their positions)
    /// against the values predicted at sampling time, gradients clipped to a norm of
    /// `grad_clip`. A head on a frozen trunk reads features taken once; one with a
    /// trunk adapter forwards each mini-batch through it with gradients (in pieces of
    /// `trunk.max_tokens` padded tokens, their gradients summed) and steps both.
    pub fn fit(
        &mut self,
        trunk: &mut Trunk,
        agent: &str,
        set: &FitSet,
        config: &CriticConfig,
        grad_clip: f64,
        seed: u64,
    ) -> Result<Vec<FitStep>> {
        let FitSet { inputs, old_values: old, targets } = *set;
        let positions: Vec<usize> = inputs.iter().map(|i| i.positions).collect();
        assert_eq!(positions.iter().sum::<usize>(), targets.len(), "positions for every target");
        assert!(old.is_none_or(|old| old.len() == targets.len()), "an old value for every target");
        let critic = self.heads.get_mut(agent).unwrap_or_else(|| panic!("no value head was loaded for agent {agent}"));
        let mut weights = critic.head.var_store().variables();
        let reads = match &critic.adapter {
            Some(adapter) => {
                weights.extend(adapter.weights.iter().map(|(k, t)| (k.clone(), t.shallow_clone())));
                Reads::Adapter(adapter.name.clone())
            }
            None => Reads::Features(features(trunk.model, trunk.adapter, inputs, trunk.max_tokens)?),
        };
        let mut optimizer = AdamW::new(weights, &config.optimizer, critic.state.take(), None)?;
        let starts: Vec<usize> = positions.iter().scan(0, |at, &p| Some(std::mem::replace(at, *at + p))).collect();
        let rows_of = |samples: &[usize]| -> Vec<usize> {
            samples.iter().flat_map(|&i| starts[i]..starts[i] + positions[i]).collect()
        };
        let n = positions.len();
        let mini_batch = config.mini_batch_sequences as usize;
        let total = optimizer.steps_taken() + (n.div_ceil(mini_batch) * config.epochs as usize) as u64;
        let mut steps = Vec::new();
        for epoch in 0..config.epochs {
            for samples in permutation(n, stream(&[seed, u64::from(epoch)])).chunks(mini_batch) {
                optimizer.zero_grad();
                let mut step = StepLoss::new(samples.iter().map(|&i| positions[i]).sum(), old, targets, config);
                match &reads {
                    Reads::Features(x) => {
                        let rows = rows_of(samples);
                        let index: Vec<i64> = rows.iter().map(|&i| i as i64).collect();
                        let x = x.index_select(0, &Tensor::from_slice(&index).to_device(x.device()));
                        step.backward(&critic.head.forward(&x), &rows);
                    }
                    Reads::Adapter(adapter) => {
                        let dropout = stream(&[seed, u64::from(epoch), steps.len() as u64]);
                        for (piece, chunk) in by_length(samples, inputs, trunk.max_tokens).into_iter().enumerate() {
                            let chunk_inputs: Vec<&CriticInput> = chunk.iter().map(|&i| &inputs[i]).collect();
                            let seed = Some(stream(&[dropout, piece as u64]));
                            let states = valued_states(trunk.model, Some(adapter), &chunk_inputs, seed)?;
                            step.backward(&critic.head.forward(&Tensor::cat(&states, 0)), &rows_of(&chunk));
                        }
                    }
                }
                let grad_norm = optimizer.grad_norm();
                let lr = config.optimizer.learning_rate(optimizer.steps_taken(), total);
                let skipped = !(step.loss.is_finite() && grad_norm.is_finite());
                let weights_change = if skipped {
                    0.0
                } else {
                    optimizer.step(lr, (grad_clip / (grad_norm + 1e-6)).min(1.0)).relative()
                };
                steps.push(FitStep {
                    agent: agent.to_owned(),
                    step: steps.len() as u32,
                    loss: step.loss,
                    clip_fraction: clip_fraction(&step.predicted, &step.old, &step.targets, config.value_clip),
                    explained_variance: explained_variance(&step.predicted, &step.targets),
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

    /// Writes every head, its trunk adapter and its optimiser state into `dir` (created).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| crate::model::Error::io(dir, e))?;
        for (agent, critic) in &self.heads {
            critic.head.save(&dir.join(head_file(agent)))?;
            if let Some(adapter) = &critic.adapter {
                let tensors: Vec<(String, Tensor)> =
                    adapter.weights.iter().map(|(k, t)| (k.clone(), t.shallow_clone())).collect();
                write_safetensors(&dir.join(adapter_file(agent)), &tensors)?;
            }
            if let Some(state) = &critic.state {
                state.save(&dir.join(optimizer_file(agent)))?;
            }
        }
        Ok(())
    }
}

/// What a head's fit reads: features of a frozen trunk, taken once, or the critic
/// model through the agent's adapter (by name), forwarded at every step.
enum Reads {
    Features(Tensor),
    Adapter(String),
}

/// `agent`'s adapter on the critic model `trunk`, added by `add` under its name.
fn trunk_adapter(
    trunk: &mut LanguageModel,
    agent: &str,
    add: impl FnOnce(&mut LanguageModel, &str) -> Result<()>,
) -> Result<TrunkAdapter> {
    let name = adapter_name(agent);
    add(trunk, &name)?;
    let weights = trunk.adapter_var_store(&name)?.variables();
    Ok(TrunkAdapter { name, weights })
}

/// The values `head` gives the rows of `features` (N, E).
fn head_values(head: &ValueHead, features: &Tensor) -> Vec<f64> {
    let values = tch::no_grad(|| head.forward(features)).to_kind(Kind::Double);
    Vec::<f64>::try_from(values).expect("a float tensor")
}

/// The loss of one optimiser step, taken in pieces: each piece's clipped value loss,
/// weighted by its share of the step's positions, is backpropagated as it comes, and
/// its predictions kept (in the pieces' order) for the step's statistics.
struct StepLoss<'a> {
    positions: usize,
    all_old: Option<&'a [f64]>,
    all_targets: &'a [f64],
    clip: f64,
    loss: f64,
    predicted: Vec<f64>,
    old: Vec<f64>,
    targets: Vec<f64>,
}

impl<'a> StepLoss<'a> {
    fn new(positions: usize, old: Option<&'a [f64]>, targets: &'a [f64], config: &CriticConfig) -> StepLoss<'a> {
        StepLoss {
            positions,
            all_old: old,
            all_targets: targets,
            clip: config.value_clip,
            loss: 0.0,
            predicted: Vec::new(),
            old: Vec::new(),
            targets: Vec::new(),
        }
    }

    /// Backpropagates the piece whose predictions for the positions `rows` are `predicted`.
    fn backward(&mut self, predicted: &Tensor, rows: &[usize]) {
        let column = |xs: &[f64]| Tensor::from_slice(&xs.iter().map(|&x| x as f32).collect::<Vec<f32>>());
        let share = rows.len() as f64 / self.positions as f64;
        let values = Vec::<f64>::try_from(predicted.detach().to_kind(Kind::Double)).expect("floats");
        // Without old values a prediction is its own anchor: the clip never binds.
        let old: Vec<f64> = match self.all_old {
            Some(all) => rows.iter().map(|&i| all[i]).collect(),
            None => values.clone(),
        };
        let targets: Vec<f64> = rows.iter().map(|&i| self.all_targets[i]).collect();
        let device = predicted.device();
        let loss = clipped_value_loss_tensor(
            predicted,
            &column(&old).to_device(device),
            &column(&targets).to_device(device),
            self.clip,
        ) * share;
        loss.backward();
        self.loss += loss.double_value(&[]);
        self.predicted.extend(values);
        self.old.extend(old);
        self.targets.extend(targets);
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
/// of its ids, (Σ positions, E) float32 in input order, through `adapter`, without
/// gradients: what a head reads. Inputs are forwarded shortest first, as many at once as
/// fit `max_tokens` padded tokens.
pub fn features(
    model: &mut LanguageModel,
    adapter: Option<&str>,
    inputs: &[CriticInput],
    max_tokens: usize,
) -> Result<Tensor> {
    let width = model.config().hidden_size as i64;
    if inputs.is_empty() {
        return Ok(Tensor::zeros([0, width], (Kind::Float, model.device())));
    }
    let all: Vec<usize> = (0..inputs.len()).collect();
    let mut by_input: Vec<Option<Tensor>> = (0..inputs.len()).map(|_| None).collect();
    for chunk in by_length(&all, inputs, max_tokens) {
        let chunk_inputs: Vec<&CriticInput> = chunk.iter().map(|&i| &inputs[i]).collect();
        let states = tch::no_grad(|| valued_states(model, adapter, &chunk_inputs, None))?;
        for (&i, state) in chunk.iter().zip(states) {
            // A copy, not a view that would keep the chunk's whole (B, P, E) states alive.
            by_input[i] = Some(state.to_kind(Kind::Float).copy());
        }
    }
    let rows: Vec<Tensor> = by_input.into_iter().map(|t| t.expect("every input was forwarded")).collect();
    Ok(Tensor::cat(&rows, 0))
}

/// `samples` (indices of `inputs`) shortest first, cut into pieces of as many as fit
/// `max_tokens` padded tokens (at least one each).
fn by_length(samples: &[usize], inputs: &[CriticInput], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order = samples.to_vec();
    order.sort_by_key(|&i| inputs[i].ids.len());
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < order.len() {
        // Sorted by length: the last input of a piece is its longest.
        let mut end = start + 1;
        while end < order.len() && (end + 1 - start) * inputs[order[end]].ids.len() <= max_tokens {
            end += 1;
        }
        pieces.push(order[start..end].to_vec());
        start = end;
    }
    pieces
}

/// Each input's final hidden states at its valued positions (positions, E), forwarded
/// together through `adapter`, with gradients unless the caller holds them off (LoRA
/// dropout keyed by `dropout_seed`, if set).
fn valued_states(
    model: &mut LanguageModel,
    adapter: Option<&str>,
    inputs: &[&CriticInput],
    dropout_seed: Option<u64>,
) -> Result<Vec<Tensor>> {
    let ids: Vec<Vec<i64>> = inputs.iter().map(|input| input.ids.clone()).collect();
    let adapters = vec![adapter.map(str::to_owned); ids.len()];
    // Left-padded: every row ends at its last token.
    let hidden = model.padded_hidden_trained(&ids, &adapters, dropout_seed)?;
    let padded_length = hidden.size()[1];
    Ok(inputs
        .iter()
        .enumerate()
        .map(|(row, input)| {
            let positions = input.positions as i64;
            hidden.get(row as i64).narrow(0, padded_length - positions, positions)
        })
        .collect())
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
        let config = CriticConfig { epochs: 60, mini_batch_sequences: 4, value_clip: 10.0, ..CriticConfig::default() };
        let mut critics = Critics::load(&mut model, None, &["a"], &config, 3).unwrap();
        let targets: Vec<f64> = (0..8).map(|i| f64::from(i % 2)).collect();
        let mut trunk = Trunk { model: &mut model, adapter: None, max_tokens: 8 };
        let old = critics.values(&mut trunk, "a", &inputs).unwrap();
        let set = FitSet { inputs: &inputs, old_values: Some(&old), targets: &targets };
        let steps = critics.fit(&mut trunk, "a", &set, &config, 1.0, 9).unwrap();
        assert_eq!(steps.len(), 120);
        let (first, last) = (&steps[0], &steps[119]);
        assert!(last.loss < first.loss / 2.0, "the loss falls: {} then {}", first.loss, last.loss);
        let dir = tempfile::tempdir().unwrap();
        critics.save(dir.path()).unwrap();
        assert!(
            dir.path().join("a.value_head.safetensors").is_file()
                && dir.path().join("a.optimizer.safetensors").is_file()
        );
        let fitted = critics.values(&mut trunk, "a", &inputs).unwrap();
        let again = Critics::load(trunk.model, Some(dir.path()), &["a", "b"], &config, 3).unwrap();
        assert_eq!(again.values(&mut trunk, "a", &inputs).unwrap(), fitted);
        assert!(again.heads["a"].state.is_some(), "the optimiser state comes back with the head");
        assert!(again.heads["b"].state.is_none(), "an agent without a saved head starts afresh");
        // A fresh head is keyed by the seed and the agent.
        let fresh = Critics::load(trunk.model, None, &["a", "b"], &config, 3).unwrap();
        assert_eq!(fresh.values(&mut trunk, "a", &inputs).unwrap(), old);
        assert_ne!(fresh.values(&mut trunk, "b", &inputs).unwrap(), old);
    }

    #[test]
    fn without_old_values_the_fit_is_the_unclipped_one() {
        let mut model = LanguageModel::load(&fixture("hf-tiny-qwen3"), &LoadOptions::default()).unwrap();
        let inputs: Vec<CriticInput> =
            (0..6).map(|i| CriticInput { ids: (1..(3 + i % 3)).collect(), positions: 1 }).collect();
        let targets: Vec<f64> = (0..6).map(|i| 3.0 * f64::from(i % 2)).collect();
        let mut trunk = Trunk { model: &mut model, adapter: None, max_tokens: 100 };
        let fit = |trunk: &mut Trunk, old: Option<&[f64]>, clip: f64| {
            let config = CriticConfig { epochs: 3, mini_batch_sequences: 2, value_clip: clip, ..Default::default() };
            let mut critics = Critics::load(trunk.model, None, &["a"], &config, 3).unwrap();
            let set = FitSet { inputs: &inputs, old_values: old, targets: &targets };
            let steps = critics.fit(trunk, "a", &set, &config, 1.0, 9).unwrap();
            (steps, critics.values(trunk, "a", &inputs).unwrap())
        };
        let fresh = Critics::load(trunk.model, None, &["a"], &CriticConfig::default(), 3).unwrap();
        let old = fresh.values(&mut trunk, "a", &inputs).unwrap();
        let (unclipped, unclipped_values) = fit(&mut trunk, Some(&old), f64::INFINITY);
        let (without, without_values) = fit(&mut trunk, None, 0.01);
        assert_eq!(without_values, unclipped_values);
        assert!(without.iter().all(|s| s.clip_fraction == 0.0), "{without:?}");
        // The clip binds where old values are given: the same targets, another fit.
        let (clipped, clipped_values) = fit(&mut trunk, Some(&old), 0.01);
        assert!(clipped.iter().any(|s| s.clip_fraction > 0.0), "{clipped:?}");
        assert_ne!(clipped_values, unclipped_values);
        assert_eq!(without.len(), unclipped.len());
    }

    fn lora_critic() -> CriticConfig {
        let lora = crate::model::LoraConfig { rank: 4, alpha: 8.0, ..Default::default() };
        let config = CriticConfig { epochs: 1, mini_batch_sequences: 8, value_clip: 10.0, ..CriticConfig::default() };
        CriticConfig { model: Some("critic".into()), lora: Some(lora), ..config }
    }

    #[test]
    fn a_trunk_adapter_trains_with_its_head_in_pieces_that_sum_to_the_whole_and_saves_with_it() {
        let load = || LanguageModel::load(&fixture("hf-tiny-qwen3"), &LoadOptions::default()).unwrap();
        let ids = |i: i64| (0..(2 + i % 5)).map(|j| (7 * i + j) % 50 + 1).collect();
        let inputs: Vec<CriticInput> =
            (0..8).map(|i| CriticInput { ids: ids(i), positions: 1 + (i % 2) as usize }).collect();
        let values: usize = inputs.iter().map(|i| i.positions).sum();
        let targets: Vec<f64> = (0..values).map(|i| (i % 3) as f64).collect();
        let config = lora_critic();
        let (mut whole, mut pieces) = (load(), load());
        let mut frozen_model = load();
        let frozen = Critics::load(&mut frozen_model, None, &["a"], &CriticConfig::default(), 3).unwrap();
        let mut frozen_trunk = Trunk { model: &mut frozen_model, adapter: None, max_tokens: 1000 };
        let frozen_values = frozen.values(&mut frozen_trunk, "a", &inputs).unwrap();

        // A fresh adapter (B = 0) leaves the trunk as it was: the frozen head's values.
        let mut critics = Critics::load(&mut whole, None, &["a"], &config, 3).unwrap();
        let mut trunk = Trunk { model: &mut whole, adapter: None, max_tokens: 1000 };
        let old = critics.values(&mut trunk, "a", &inputs).unwrap();
        assert!(old.iter().zip(&frozen_values).all(|(a, b)| (a - b).abs() < 1e-6), "{old:?} {frozen_values:?}");
        let set = FitSet { inputs: &inputs, old_values: Some(&old), targets: &targets };
        let step = critics.fit(&mut trunk, "a", &set, &config, 1.0, 9).unwrap().remove(0);

        // The same step forwarded in pieces of at most 8 padded tokens: the same loss and move.
        let mut split = Critics::load(&mut pieces, None, &["a"], &config, 3).unwrap();
        let mut small = Trunk { model: &mut pieces, adapter: None, max_tokens: 8 };
        let in_pieces = split.fit(&mut small, "a", &set, &config, 1.0, 9).unwrap().remove(0);
        assert!((step.loss - in_pieces.loss).abs() < 1e-5, "{step:?} {in_pieces:?}");
        assert!((step.grad_norm - in_pieces.grad_norm).abs() < 1e-4 * step.grad_norm, "{step:?} {in_pieces:?}");
        let (a, b) =
            (critics.values(&mut trunk, "a", &inputs).unwrap(), split.values(&mut small, "a", &inputs).unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-4), "{a:?} {b:?}");

        // The trunk moved, not the head alone: B is no longer zero.
        let adapter = &critics.heads["a"].adapter.as_ref().unwrap().weights;
        let moved: f64 = adapter
            .iter()
            .filter(|(k, _)| k.contains("lora_B"))
            .map(|(_, t)| t.abs().sum(Kind::Double).double_value(&[]))
            .sum();
        assert!(moved > 0.0);

        // Saved beside the head and read back onto a fresh critic model: the same values.
        let dir = tempfile::tempdir().unwrap();
        critics.save(dir.path()).unwrap();
        assert!(dir.path().join("a.lora.safetensors").is_file());
        let mut fresh_model = load();
        let again = Critics::load(&mut fresh_model, Some(dir.path()), &["a"], &config, 3).unwrap();
        let mut fresh_trunk = Trunk { model: &mut fresh_model, adapter: None, max_tokens: 1000 };
        let back = again.values(&mut fresh_trunk, "a", &inputs).unwrap();
        assert!(back.iter().zip(&a).all(|(x, y)| (x - y).abs() < 1e-6), "{back:?} {a:?}");
        assert!(again.heads["a"].state.is_some());
        // A trained adapter is not silently dropped by a critic without critic.lora.
        let refused = Critics::load(&mut load(), Some(dir.path()), &["a"], &CriticConfig::default(), 3);
        let message = refused.err().expect("refused").to_string();
        assert!(message.contains("a.lora.safetensors") && message.contains("critic.lora is not set"), "{message}");
    }
}
