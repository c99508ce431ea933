//! A decode step's attention on CPU in float32: each row's one new query over its own
//! cached columns only (`csrc/decode_attention.cpp`).
//!
//! libtorch's scaled-dot-product attention, given the step's mask, computes every row
//! over the columns of the longest row and reads each key head once per query head it
//! serves; this reads each row's keys and values once, up to its own length. The same
//! product up to float summation order (the test below pins it to SDPA's).

use tch::{Device, Kind, Tensor};

use super::csrc::{petting_decode_attention, tensor_from};

/// Whether [`attend`] takes these queries: float32 on CPU.
pub(crate) fn supported(q: &Tensor) -> bool {
    q.device() == Device::Cpu && q.kind() == Kind::Float
}

/// q (n, H, 1, D) against keys and values (n, K, S, D) (views of the cache, D
/// contiguous), row i over its columns `0..=last[i]` ((n,) int64): (n, H, 1, D).
pub(crate) fn attend(q: &Tensor, keys: &Tensor, values: &Tensor, last: &Tensor, scale: f64) -> Tensor {
    // The shapes are the decoder's own, so a failure here is a bug, as with tch's
    // panicking ops the rest of the forward uses.
    tensor_from(|out| unsafe {
        petting_decode_attention(q.as_ptr(), keys.as_ptr(), values.as_ptr(), last.as_ptr(), scale, out)
    })
    .unwrap_or_else(|e| panic!("decode attention: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_masked_grouped_sdpa_over_each_rows_own_columns() {
        tch::manual_seed(5);
        let opts = (Kind::Float, Device::Cpu);
        // 3 rows, 6 query heads over 2 key heads, D 64 and 20 (not a multiple of the
        // vector width); a cache of 4 slots × 12 columns viewed as the step does.
        for d in [64, 20] {
            let cache_k = Tensor::randn([4, 2, 12, d], opts);
            let cache_v = Tensor::randn([4, 2, 12, d], opts);
            let (keys, values) = (cache_k.narrow(0, 0, 3).narrow(2, 0, 9), cache_v.narrow(0, 0, 3).narrow(2, 0, 9));
            let q = Tensor::randn([3, 6, 1, d], opts);
            let last = Tensor::from_slice(&[8i64, 3, 0]);
            let mask =
                Tensor::arange(9, (Kind::Int64, Device::Cpu)).view([1, 1, 1, 9]).le_tensor(&last.view([3, 1, 1, 1]));
            let scale = 1.0 / (d as f64).sqrt();
            let want =
                Tensor::scaled_dot_product_attention(&q, &keys, &values, Some(&mask), 0.0, false, Some(scale), true);
            let got = attend(&q, &keys, &values, &last, scale);
            assert_eq!(got.size(), [3, 6, 1, d]);
            let diff = f64::try_from((&got - &want).abs().max()).unwrap();
            assert!(diff < 1e-5, "D {d}: differs from SDPA by {diff}");
        }
    }

    #[test]
    fn a_row_past_the_columns_it_is_given_is_an_error_not_a_read_out_of_bounds() {
        let opts = (Kind::Float, Device::Cpu);
        let (q, kv) = (Tensor::zeros([1, 2, 1, 8], opts), Tensor::zeros([1, 1, 4, 8], opts));
        let result = std::panic::catch_unwind(|| attend(&q, &kv, &kv, &Tensor::from_slice(&[4i64]), 1.0));
        let message = *result.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("attends to 5 of 4 columns"), "{message}");
    }
}
