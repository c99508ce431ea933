//! Linear layers with their weights packed once for oneDNN, for sampling on CPU.
//!
//! libtorch's x·Wᵀ on CPU (MKL) repacks the weight into its own blocked layout on every
//! call; a decode step of 128 rows spends a third of its products doing so. The sampler
//! instead packs each float32 weight once at the start of a generate call into oneDNN's
//! layout (libtorch's `mkldnn::_reorder_linear_weight`) and multiplies with
//! `mkldnn::_linear_pointwise`, through the C++ in `csrc/onednn_linear.cpp`. The packed
//! copies live only for that call, so the weights a trainer updates between calls are
//! never read stale; they cost a second copy of the weights while the call runs, which
//! the call makes only where it fits beside the caches' budget.

use tch::{Device, Kind, Tensor};

use super::Error;
use super::csrc::{petting_onednn_available, petting_pack_linear_weight, petting_packed_linear, tensor_from};

/// A weight (out, in) in oneDNN's packed layout.
#[derive(Debug)]
pub(crate) struct PackedWeight(Tensor);

/// Whether `weight` can be packed: float32 on CPU, with libtorch built with oneDNN.
pub(crate) fn packable(weight: &Tensor) -> bool {
    weight.device() == Device::Cpu && weight.kind() == Kind::Float && unsafe { petting_onednn_available() }
}

impl PackedWeight {
    pub(crate) fn new(weight: &Tensor) -> Result<PackedWeight, Error> {
        tensor_from(|packed| unsafe { petting_pack_linear_weight(weight.as_ptr(), packed) })
            .map(PackedWeight)
            .map_err(|source| Error::Torch { context: "packing a linear weight for oneDNN".into(), source })
    }

    /// x·Wᵀ + b, (…, in) → (…, out).
    pub(crate) fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Tensor {
        let bias = bias.map_or(std::ptr::null(), |b| b.as_ptr());
        // Shapes and kinds are the model's own, so a failure here is a bug, as with tch's
        // panicking ops the rest of the forward uses.
        tensor_from(|out| unsafe { petting_packed_linear(x.as_ptr(), self.0.as_ptr(), bias, out) })
            .unwrap_or_else(|e| panic!("oneDNN linear: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_products_equal_plain_ones_for_every_batch_size() {
        tch::manual_seed(11);
        let weight = Tensor::randn([300, 96], (Kind::Float, Device::Cpu));
        let bias = Tensor::randn([300], (Kind::Float, Device::Cpu));
        assert!(packable(&weight), "this libtorch has oneDNN");
        let packed = PackedWeight::new(&weight).unwrap();
        for rows in [1, 7, 64, 1000] {
            let x = Tensor::randn([rows, 96], (Kind::Float, Device::Cpu));
            let plain = x.linear(&weight, Some(&bias));
            let fast = packed.forward(&x, Some(&bias));
            assert_eq!(fast.size(), [rows, 300]);
            let diff = f64::try_from((fast - &plain).abs().max()).unwrap();
            assert!(diff < 1e-4, "{rows} rows differ by {diff}");
        }
        // (B, L, in) as the decoder passes it.
        let x = Tensor::randn([2, 5, 96], (Kind::Float, Device::Cpu));
        let diff = f64::try_from((packed.forward(&x, None) - x.linear::<Tensor>(&weight, None)).abs().max()).unwrap();
        assert!(diff < 1e-4);
    }

    #[test]
    fn packing_a_weight_of_another_kind_is_an_error_not_a_crash() {
        let weight = Tensor::ones([4, 4], (Kind::Int64, Device::Cpu));
        assert!(!packable(&weight));
        let err = PackedWeight::new(&weight).unwrap_err().to_string();
        assert!(err.contains("packing a linear weight"), "{err}");
    }
}
