//! Proof that a vLLM server holds a checkpoint's full weights: the sum and the sum of
//! squares of every weight value, in float64, computed by the server over what it holds
//! (`python/petting_vllm`, a worker extension reached through `/collective_rpc`) and by
//! petting over the checkpoint's safetensors files, each value cast to the dtype the
//! server holds. Both sums ignore layout (vLLM fuses q/k/v and gate/up, and pads the
//! vocabulary with zero rows), and both are exact up to float64 summation order, so two
//! versions apart by one optimiser step differ by far more than the tolerance: at lr
//! 1e-6 the sum of squares of a 135M model moves by ~1e-9 of itself, the summation noise
//! is ~1e-15.

use std::path::Path;

use serde::Deserialize;
use tch::Kind;

use crate::model::{SafetensorsSet, is_weight_file};

/// Relative difference within which two fingerprints are of the same weights.
const TOLERANCE: f64 = 1e-11;

/// What the server's `petting_weights_fingerprint` answers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Fingerprint {
    pub sum: f64,
    pub sum_squares: f64,
    /// Values summed (the server's padding included).
    pub values: u64,
    /// The dtypes of the server's parameters, as torch names them (`float32`, `bfloat16`).
    #[serde(default)]
    pub dtypes: Vec<String>,
}

impl Fingerprint {
    /// Whether `self` and `other` are of the same weight values.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        let scale = self.sum_squares.abs().max(other.sum_squares.abs()).max(f64::MIN_POSITIVE);
        // Σ|x| ≤ sqrt(n · Σx²) bounds the sum's rounding.
        let sum_scale = (scale * self.values.max(other.values) as f64).sqrt();
        (self.sum_squares - other.sum_squares).abs() <= TOLERANCE * scale
            && (self.sum - other.sum).abs() <= TOLERANCE * sum_scale
    }

    /// The tch dtype of a server holding `dtypes`: one dtype, else none.
    pub fn kind(&self) -> Option<Kind> {
        match self.dtypes.as_slice() {
            [one] => match one.as_str() {
                "float32" => Some(Kind::Float),
                "bfloat16" => Some(Kind::BFloat16),
                "float16" => Some(Kind::Half),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The fingerprint of the model weights in `dir` (one `model.safetensors` or shards),
/// each value cast to `kind` as a server holding that dtype would.
pub fn of_checkpoint(dir: &Path, kind: Kind) -> Result<Fingerprint, crate::model::Error> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| crate::model::Error::io(dir, e))? {
        let path = entry.map_err(|e| crate::model::Error::io(dir, e))?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(is_weight_file) {
            files.push(path);
        }
    }
    files.sort();
    let set = SafetensorsSet::open_files(&files)?;
    let (mut sum, mut sum_squares, mut values) = (0.0, 0.0, 0u64);
    tch::no_grad(|| -> Result<(), crate::model::Error> {
        for name in set.names() {
            let (shape, stored) = set.info(name).expect("a listed tensor");
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let held = set.tensor(name, &shape, stored, tch::Device::Cpu)?.to_kind(kind).to_kind(Kind::Double);
            sum += held.sum(Kind::Double).double_value(&[]);
            sum_squares += held.square().sum(Kind::Double).double_value(&[]);
            values += held.numel() as u64;
        }
        Ok(())
    })?;
    Ok(Fingerprint { sum, sum_squares, values, dtypes: vec![format!("{kind:?}")] })
}

/// The fingerprint of loose tensors, for tests.
#[cfg(test)]
fn of_tensors(tensors: &[tch::Tensor]) -> Fingerprint {
    let sum = tensors.iter().map(|t| t.to_kind(Kind::Double).sum(Kind::Double).double_value(&[])).sum();
    let sum_squares =
        tensors.iter().map(|t| t.to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[])).sum();
    let values = tensors.iter().map(|t| t.numel() as u64).sum();
    Fingerprint { sum, sum_squares, values, dtypes: Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    #[test]
    fn fusing_and_padding_leave_the_fingerprint_and_one_step_changes_it() {
        tch::manual_seed(5);
        let (q, k, v) = (
            Tensor::randn([64, 32], tch::kind::FLOAT_CPU) * 0.05,
            Tensor::randn([16, 32], tch::kind::FLOAT_CPU) * 0.05,
            Tensor::randn([16, 32], tch::kind::FLOAT_CPU) * 0.05,
        );
        let embed = Tensor::randn([100, 32], tch::kind::FLOAT_CPU) * 0.05;
        let separate = of_tensors(&[q.shallow_clone(), k.shallow_clone(), v.shallow_clone(), embed.shallow_clone()]);
        // vLLM: one qkv projection, the vocabulary padded to 128 rows with zeros.
        let fused = Tensor::cat(&[&q, &k, &v], 0);
        let padded = Tensor::cat(&[&embed, &Tensor::zeros([28, 32], tch::kind::FLOAT_CPU)], 0);
        assert!(separate.matches(&of_tensors(&[fused, padded])));
        // A step of 1e-6 on every weight, as AdamW's first step at lr 1e-6 makes.
        let stepped = of_tensors(&[&q - 1e-6, &k + 1e-6, v.shallow_clone(), embed.shallow_clone()]);
        assert!(!separate.matches(&stepped), "{separate:?} vs {stepped:?}");
    }

    #[test]
    fn a_checkpoint_is_fingerprinted_in_the_servers_dtype() {
        let dir = tempfile::tempdir().unwrap();
        // 1 + 2^-10 is 1 in bf16: the bf16 server holds other values than the file.
        let w = Tensor::from_slice(&[1.0f32 + 1.0 / 1024.0, -0.5]);
        crate::model::write_safetensors(&dir.path().join("model.safetensors"), &[("w".into(), w)]).unwrap();
        let f32_print = of_checkpoint(dir.path(), Kind::Float).unwrap();
        assert!((f32_print.sum - (0.5 + 1.0 / 1024.0)).abs() < 1e-12, "{f32_print:?}");
        let bf16_print = of_checkpoint(dir.path(), Kind::BFloat16).unwrap();
        assert_eq!((bf16_print.sum, bf16_print.sum_squares, bf16_print.values), (0.5, 1.25, 2));
    }
}
