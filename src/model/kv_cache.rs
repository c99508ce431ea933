//! The key/value cache of one attention block.
//!
//! Keys and values are (B, H_kv, S, D). Appending writes into a preallocated buffer that
//! grows by doubling, so a decode step costs one small copy instead of re-concatenating
//! the whole cache (what makes transformers' `DynamicCache` slow on CPU).

use tch::Tensor;

#[derive(Debug, Default)]
pub struct KvCache {
    /// (B, H_kv, capacity, D) buffers; `None` until the first append.
    buffers: Option<(Tensor, Tensor)>,
    /// Filled positions along dim 2.
    len: i64,
    /// Capacity to allocate at the first append, when larger than what it needs.
    reserve: i64,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the capacity the first append allocates (the sampler knows prompt + new tokens).
    pub fn reserve(&mut self, positions: i64) {
        self.reserve = positions;
    }

    pub fn clear(&mut self) {
        self.buffers = None;
        self.len = 0;
        self.reserve = 0;
    }

    /// Appends (B, H_kv, L, D) keys and values; returns views of everything held, (B, H_kv, S, D).
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let add = k.size()[2];
        let needed = self.len + add;
        let capacity = self.buffers.as_ref().map_or(0, |(b, _)| b.size()[2]);
        if needed > capacity {
            let new_capacity = needed.max(self.reserve).max(capacity * 2);
            let mut size = k.size();
            size[2] = new_capacity;
            let grow = |old: Option<&Tensor>, like: &Tensor| {
                let buffer = Tensor::zeros(size.as_slice(), (like.kind(), like.device()));
                if let Some(old) = old {
                    buffer.narrow(2, 0, self.len).copy_(&old.narrow(2, 0, self.len));
                }
                buffer
            };
            let (kb, vb) = (grow(self.buffers.as_ref().map(|b| &b.0), k), grow(self.buffers.as_ref().map(|b| &b.1), v));
            self.buffers = Some((kb, vb));
        }
        let (kb, vb) = self.buffers.as_ref().expect("allocated above");
        kb.narrow(2, self.len, add).copy_(k);
        vb.narrow(2, self.len, add).copy_(v);
        self.len = needed;
        (kb.narrow(2, 0, self.len), vb.narrow(2, 0, self.len))
    }

    /// Keeps only the given batch rows (finished sequences leave the batch).
    pub fn select_rows(&mut self, rows: &Tensor) {
        if let Some((k, v)) = self.buffers.take() {
            self.buffers = Some((k.index_select(0, rows), v.index_select(0, rows)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn appends_grow_past_the_capacity_and_keep_the_order() {
        let mut cache = KvCache::default();
        cache.reserve(3);
        let step = |i: i64| Tensor::full([1, 1, 1, 2], i as f64, (Kind::Float, Device::Cpu));
        for i in 0..5 {
            let (k, v) = cache.append(&step(i), &step(10 + i));
            assert_eq!(k.size(), vec![1, 1, i + 1, 2]);
            assert_eq!(v.double_value(&[0, 0, i, 1]), (10 + i) as f64);
        }
        let (k, _) = cache.append(
            &Tensor::zeros([1, 1, 0, 2], (Kind::Float, Device::Cpu)),
            &Tensor::zeros([1, 1, 0, 2], (Kind::Float, Device::Cpu)),
        );
        let firsts: Vec<f64> = (0..5).map(|i| k.double_value(&[0, 0, i, 0])).collect();
        assert_eq!(firsts, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(cache.len(), 5);
        cache.clear();
        assert!(cache.is_empty());
    }

    #[test]
    fn selecting_rows_keeps_those_rows() {
        let mut cache = KvCache::default();
        let kv = Tensor::arange(3, (Kind::Float, Device::Cpu)).reshape([3, 1, 1, 1]);
        let _ = cache.append(&kv, &kv);
        cache.select_rows(&Tensor::from_slice(&[2i64, 0]));
        let (k, _) = cache.append(
            &Tensor::zeros([2, 1, 1, 1], (Kind::Float, Device::Cpu)),
            &Tensor::zeros([2, 1, 1, 1], (Kind::Float, Device::Cpu)),
        );
        assert_eq!((k.double_value(&[0, 0, 0, 0]), k.double_value(&[1, 0, 0, 0])), (2.0, 0.0));
    }
}
