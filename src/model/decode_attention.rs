//! A decode step's attention on CPU in float32: each row's one new query over its own
//! cached columns only (`csrc/decode_attention.cpp`).
//!
//! libtorch's scaled-dot-product attention, given the step's mask, computes every row
//! over the columns of the longest row and reads each key head once per query head it
//! serves; this reads each row's keys and values once, up to its own length. The same
//! product up to float summation order (the test below pins it to SDPA's).
//!
//! The branches of one prompt hold copies of its cached columns. They read them from the
//! slot they were copied from ([`SharedColumns`]), one after the other, so that on long
//! prompts a step fetches those columns from memory once rather than once per branch.

use tch::{Device, Kind, Tensor};

use super::csrc::{petting_decode_attention, tensor_from};

/// Whether [`attend`] takes these queries: float32 on CPU.
pub(crate) fn supported(q: &Tensor) -> bool {
    q.device() == Device::Cpu && q.kind() == Kind::Float
}

/// Row i's columns `0..len[i]` are the same values as those of row `slot[i]` (a copy of
/// that row's prompt), and can be read there; a length of 0 reads none. (n,) int64 each.
pub(crate) struct SharedColumns {
    pub(crate) slot: Tensor,
    pub(crate) len: Tensor,
}

impl SharedColumns {
    /// `rows[i]`: the row whose first columns row i holds a copy of, and how many. On the
    /// CPU, where [`attend`] runs, whatever the model's device.
    pub(crate) fn new(rows: &[Option<(usize, i64)>]) -> SharedColumns {
        let slot: Vec<i64> = rows.iter().map(|r| r.map_or(0, |(slot, _)| slot as i64)).collect();
        let len: Vec<i64> = rows.iter().map(|r| r.map_or(0, |(_, len)| len)).collect();
        SharedColumns { slot: Tensor::from_slice(&slot), len: Tensor::from_slice(&len) }
    }
}

/// q (n, H, 1, D) against keys and values (n, K, S, D) (views of the cache, D
/// contiguous), row i over its columns `0..=last[i]` ((n,) int64), the first of them
/// where `shared` says: (n, H, 1, D).
pub(crate) fn attend(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    last: &Tensor,
    shared: &SharedColumns,
    scale: f64,
) -> Tensor {
    // The shapes are the decoder's own, so a failure here is a bug, as with tch's
    // panicking ops the rest of the forward uses.
    tensor_from(|out| unsafe {
        petting_decode_attention(
            q.as_ptr(),
            keys.as_ptr(),
            values.as_ptr(),
            last.as_ptr(),
            shared.slot.as_ptr(),
            shared.len.as_ptr(),
            scale,
            out,
        )
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
            let got = attend(&q, &keys, &values, &last, &SharedColumns::new(&[None; 3]), scale);
            assert_eq!(got.size(), [3, 6, 1, d]);
            let diff = f64::try_from((&got - &want).abs().max()).unwrap();
            assert!(diff < 1e-5, "D {d}: differs from SDPA by {diff}");
        }
    }

    #[test]
    fn a_row_past_the_columns_it_is_given_is_an_error_not_a_read_out_of_bounds() {
        let opts = (Kind::Float, Device::Cpu);
        let (q, kv) = (Tensor::zeros([1, 2, 1, 8], opts), Tensor::zeros([1, 1, 4, 8], opts));
        let none = SharedColumns::new(&[None]);
        let result = std::panic::catch_unwind(|| attend(&q, &kv, &kv, &Tensor::from_slice(&[4i64]), &none, 1.0));
        let message = *result.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("attends to 5 of 4 columns"), "{message}");
    }

    #[test]
    fn a_branch_reads_its_shared_columns_from_the_slot_it_copied_them_from() {
        tch::manual_seed(6);
        let opts = (Kind::Float, Device::Cpu);
        // Rows 1 and 2 are branches of row 0's 5-column prompt, then went their own ways.
        let keys = Tensor::randn([3, 2, 9, 16], opts);
        let values = Tensor::randn([3, 2, 9, 16], opts);
        for branch in [1, 2] {
            for t in [&keys, &values] {
                t.get(branch).narrow(1, 0, 5).copy_(&t.get(0).narrow(1, 0, 5));
            }
        }
        let q = Tensor::randn([3, 4, 1, 16], opts);
        let last = Tensor::from_slice(&[6i64, 8, 5]);
        let own = attend(&q, &keys, &values, &last, &SharedColumns::new(&[None; 3]), 0.25);
        let shared = SharedColumns::new(&[None, Some((0, 5)), Some((0, 5))]);
        assert!(attend(&q, &keys, &values, &last, &shared, 0.25).equal(&own));
        // The branches' own copies are not read: spoiling them changes nothing.
        for t in [&keys, &values] {
            let _ = t.narrow(0, 1, 2).narrow(2, 0, 5).fill_(1e3);
        }
        assert!(attend(&q, &keys, &values, &last, &shared, 0.25).equal(&own));
        // Reading more columns than the source row holds is an error, not a stale read.
        let past = SharedColumns::new(&[None, Some((2, 7)), None]);
        let result = std::panic::catch_unwind(|| attend(&q, &keys, &values, &last, &past, 0.25));
        let message = *result.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("row 1 reads 7 columns of row 2"), "{message}");
    }
}
