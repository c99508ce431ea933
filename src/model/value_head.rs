//! A critic's value head: one linear map from a decoder's final hidden state to a
//! scalar, the value of the state the tokens so far describe. It sits on a trunk (a
//! policy's own base, through an adapter of its own or none, or a separate critic model)
//! and is saved as `value_head.safetensors` under TRL's keys (`v_head.summary.weight`
//! (1, E), `v_head.summary.bias` (1)), the file `AutoModelForCausalLMWithValueHead` reads.

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::language_model::LanguageModel;
use super::score::unpad;
use super::weights::{Init, SafetensorsSet, Weights, write_safetensors};
use super::{Error, Result};

/// The file of a checkpoint that holds its value head.
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";

const WEIGHT: &str = "v_head.summary.weight";
const BIAS: &str = "v_head.summary.bias";

/// The trainable head, in float32 whatever the trunk's dtype.
pub struct ValueHead {
    vs: VarStore,
    weight: Tensor,
    bias: Tensor,
}

impl std::fmt::Debug for ValueHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueHead").field("hidden_size", &self.hidden_size()).finish()
    }
}

impl ValueHead {
    /// A fresh head for hidden states of width `hidden_size`: weights normal with std
    /// 1/(E + 1), as OpenRLHF's critic starts, from the stream keyed by `seed`; bias 0.
    /// Its values start near 0 whatever the trunk.
    pub fn new(hidden_size: i64, seed: u64, device: Device) -> ValueHead {
        let std = 1.0 / (hidden_size as f64 + 1.0);
        ValueHead::build(hidden_size, &Weights::Random { seed }, Init::Normal(std), device)
            .expect("random weights have every shape")
    }

    /// The head saved in `path` (a `value_head.safetensors`), checked against the
    /// trunk's width.
    pub fn load(path: &Path, hidden_size: i64, device: Device) -> Result<ValueHead> {
        let files = SafetensorsSet::open_files(&[path.to_path_buf()])?;
        ValueHead::build(hidden_size, &Weights::Files(&files), Init::Zeros, device)
    }

    fn build(hidden_size: i64, weights: &Weights, init: Init, device: Device) -> Result<ValueHead> {
        let vs = VarStore::new(device);
        let path = &vs.root() / "v_head" / "summary";
        let weight = weights.get(WEIGHT, &[1, hidden_size], init, Kind::Float, device)?;
        let bias = weights.get(BIAS, &[1], Init::Zeros, Kind::Float, device)?;
        let weight = path.add("weight", weight, true);
        let bias = path.add("bias", bias, true);
        Ok(ValueHead { vs, weight, bias })
    }

    /// Writes the head to `path`; returns the file's sha256.
    pub fn save(&self, path: &Path) -> Result<String> {
        let tensors = [(WEIGHT.to_owned(), self.weight.shallow_clone()), (BIAS.to_owned(), self.bias.shallow_clone())];
        write_safetensors(path, &tensors)
    }

    /// The head's variables: what a critic's optimiser trains, beside its trunk's.
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    pub fn hidden_size(&self) -> i64 {
        self.weight.size()[1]
    }

    /// Hidden states (…, E) → values (…), float32.
    pub(crate) fn forward(&self, hidden: &Tensor) -> Tensor {
        hidden.to_kind(Kind::Float).linear(&self.weight, Some(&self.bias)).squeeze_dim(-1)
    }
}

impl LanguageModel {
    /// The value `head` gives every position of each sequence, (len_i,) float32, the
    /// trunk run through each sequence's adapter, without gradients: the value of the
    /// state after each token.
    pub fn values(
        &mut self,
        head: &ValueHead,
        sequences: &[Vec<i64>],
        adapters: &[Option<String>],
    ) -> Result<Vec<Tensor>> {
        let width = self.config().hidden_size as i64;
        if head.hidden_size() != width {
            return Err(Error::Request {
                reason: format!(
                    "a value head for hidden states of {} cannot read this model's {width}",
                    head.hidden_size()
                ),
            });
        }
        let hidden = self.padded_hidden(sequences, adapters)?;
        let values = tch::no_grad(|| head.forward(&hidden));
        Ok(unpad(&values, sequences))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::fixture;
    use crate::model::{LoadOptions, LoraConfig};

    fn tiny() -> LanguageModel {
        LanguageModel::load(&fixture("hf-tiny-qwen3"), &LoadOptions::default()).unwrap()
    }

    fn floats(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
    }

    #[test]
    fn a_saved_head_loads_back_with_trls_keys_and_the_same_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut policy = tiny();
        let width = policy.config().hidden_size as i64;
        let head = ValueHead::new(width, 7, Device::Cpu);
        let path = dir.path().join(VALUE_HEAD_FILE);
        head.save(&path).unwrap();
        let (_, shapes) = crate::model::read_header(&path).unwrap();
        let names: Vec<&String> = shapes.keys().collect();
        assert_eq!(names, ["v_head.summary.bias", "v_head.summary.weight"]);
        let again = ValueHead::load(&path, width, Device::Cpu).unwrap();
        let sequence = vec![vec![1, 5, 9, 2]];
        let before = policy.values(&head, &sequence, &[None]).unwrap();
        let after = policy.values(&again, &sequence, &[None]).unwrap();
        assert_eq!(floats(&before[0]), floats(&after[0]));
        assert_eq!(before[0].size(), [4]);
        // Another width is refused, naming both.
        let message = ValueHead::load(&path, width + 1, Device::Cpu).unwrap_err().to_string();
        assert!(message.contains("v_head.summary.weight"), "{message}");
        let narrow = ValueHead::new(width + 1, 7, Device::Cpu);
        let message = policy.values(&narrow, &sequence, &[None]).unwrap_err().to_string();
        assert!(message.contains(&format!("{}", width + 1)) && message.contains(&width.to_string()), "{message}");
    }

    #[test]
    fn values_are_the_head_over_the_final_hidden_state_padded_or_not_through_the_adapter() {
        let mut policy = tiny();
        let head = ValueHead::new(policy.config().hidden_size as i64, 3, Device::Cpu);
        let (short, long) = (vec![3, 4], vec![7, 3, 4, 8, 1]);
        let alone = policy.values(&head, std::slice::from_ref(&short), &[None]).unwrap();
        let batched = policy.values(&head, &[short.clone(), long], &[None, None]).unwrap();
        let (a, b) = (floats(&alone[0]), floats(&batched[0]));
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5), "{a:?} vs {b:?}");
        // By hand: w · h + b at the last position.
        let hidden = policy.padded_hidden(std::slice::from_ref(&short), &[None]).unwrap();
        let h = hidden.get(0).get(1).to_kind(Kind::Float);
        let by_hand = (h * head.weight.get(0)).sum(Kind::Float).double_value(&[]) + head.bias.double_value(&[0]);
        assert!((by_hand - f64::from(a[1])).abs() < 1e-5, "{by_hand} vs {}", a[1]);
        // A critic adapter on the same base is its own trunk: once it trains, its values differ.
        let config = LoraConfig { rank: 2, ..LoraConfig::default() };
        policy.add_adapter("critic", &config, 1).unwrap();
        let same = policy.values(&head, std::slice::from_ref(&short), &[Some("critic".into())]).unwrap();
        assert_eq!(floats(&same[0]), a, "B = 0: an untrained adapter changes nothing");
        tch::no_grad(|| {
            for (_, t) in policy.adapter_var_store("critic").unwrap().variables() {
                let _ = t.shallow_clone().fill_(0.05);
            }
        });
        let trained = policy.values(&head, std::slice::from_ref(&short), &[Some("critic".into())]).unwrap();
        assert_ne!(floats(&trained[0]), a);
    }
}
