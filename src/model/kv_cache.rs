//! The key/value cache of one attention block, as fixed slots the sampler fills and frees.
//!
//! Keys and values are (slots, H_kv, capacity, D), allocated once per generation from the
//! memory budget. Every sequence owns one slot and its positions start at column 0, so a
//! sequence's cache is its own columns `0..len` and nothing is padded on the left:
//!
//! ```text
//!  slot 0  [p p p p g g g . . .]   p: prompt, g: generated, .: free (masked out)
//!  slot 1  [p p g . . . . . . .]
//!  slot 2  [p p p p p p g g g .]
//! ```
//!
//! Prefill writes a block of columns for a run of slots; a decode step writes one column
//! per slot, each at its own length. A finished sequence's slot is refilled by moving the
//! last running slot into it (one slot's columns, not the whole cache), so the running
//! slots stay `0..n` and every forward works on views.

use tch::Tensor;

#[derive(Debug, Default)]
pub struct KvCache {
    /// (slots, H_kv, capacity, D) buffers; `None` until the first write.
    buffers: Option<(Tensor, Tensor)>,
    /// (slots, capacity) the first write allocates.
    shape: (i64, i64),
}

impl KvCache {
    /// Sets the slots and columns the first write allocates.
    pub fn reserve(&mut self, slots: i64, capacity: i64) {
        self.buffers = None;
        self.shape = (slots, capacity);
    }

    pub fn clear(&mut self) {
        *self = KvCache::default();
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> u64 {
        self.buffers.as_ref().map_or(0, |(k, v)| ((k.numel() + v.numel()) * k.kind().elt_size_in_bytes()) as u64)
    }

    fn buffers_like(&mut self, k: &Tensor) -> &(Tensor, Tensor) {
        let (slots, capacity) = self.shape;
        self.buffers.get_or_insert_with(|| {
            let size = [slots, k.size()[1], capacity, k.size()[3]];
            let zeros = || Tensor::zeros(size, (k.kind(), k.device()));
            (zeros(), zeros())
        })
    }

    /// Writes (m, H_kv, L, D) keys and values into slots `first..first + m` at columns
    /// `offset..offset + L`; returns those slots' columns `0..offset + L`.
    pub fn write_block(&mut self, first: i64, offset: i64, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let (m, l) = (k.size()[0], k.size()[2]);
        let (kb, vb) = self.buffers_like(k);
        let (kb, vb) = (kb.narrow(0, first, m), vb.narrow(0, first, m));
        kb.narrow(2, offset, l).copy_(k);
        vb.narrow(2, offset, l).copy_(v);
        (kb.narrow(2, 0, offset + l), vb.narrow(2, 0, offset + l))
    }

    /// Writes one (n, H_kv, 1, D) column per slot `0..n`, slot i at column `columns[i]`
    /// ((n,) int64); returns slots `0..n`, columns `0..span`.
    pub fn write_columns(&mut self, columns: &Tensor, span: i64, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let n = k.size()[0];
        let index = columns.view([n, 1, 1, 1]).expand(k.size(), false);
        let (kb, vb) = self.buffers_like(k);
        let (mut kb, mut vb) = (kb.narrow(0, 0, n), vb.narrow(0, 0, n));
        let _ = kb.scatter_(2, &index, k);
        let _ = vb.scatter_(2, &index, v);
        (kb.narrow(2, 0, span), vb.narrow(2, 0, span))
    }

    /// Copies columns `0..len` of slot `from` into slot `to`.
    pub fn copy_slot(&mut self, from: i64, to: i64, len: i64) {
        if let Some((k, v)) = &self.buffers {
            for b in [k, v] {
                b.get(to).narrow(1, 0, len).copy_(&b.get(from).narrow(1, 0, len));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn filled(size: [i64; 4], value: f64) -> Tensor {
        Tensor::full(size, value, (Kind::Float, Device::Cpu))
    }

    #[test]
    fn blocks_and_columns_land_in_their_slots_and_columns() {
        let mut cache = KvCache::default();
        cache.reserve(3, 6);
        // Slots 1 and 2 get a 3-column block at offset 0, then one more column at 3.
        let (k, _) = cache.write_block(1, 0, &filled([2, 1, 3, 2], 1.0), &filled([2, 1, 3, 2], -1.0));
        assert_eq!(k.size(), vec![2, 1, 3, 2]);
        let (k, v) = cache.write_block(1, 3, &filled([2, 1, 1, 2], 2.0), &filled([2, 1, 1, 2], -2.0));
        assert_eq!((k.size(), v.double_value(&[1, 0, 3, 0])), (vec![2, 1, 4, 2], -2.0));
        // Slot 0 copies slot 2's four columns; then each slot writes its own next column.
        cache.copy_slot(2, 0, 4);
        let columns = Tensor::from_slice(&[4i64, 5, 4]);
        let step = Tensor::arange(3, (Kind::Float, Device::Cpu)).view([3, 1, 1, 1]).expand([3, 1, 1, 2], false) + 10.0;
        let (k, _) = cache.write_columns(&columns, 6, &step, &step);
        let at = |slot: i64, col: i64| k.double_value(&[slot, 0, col, 1]);
        assert_eq!((at(0, 0), at(0, 3), at(0, 4)), (1.0, 2.0, 10.0));
        assert_eq!((at(1, 4), at(1, 5)), (0.0, 11.0));
        assert_eq!((at(2, 3), at(2, 4), at(2, 5)), (2.0, 12.0, 0.0));
        assert_eq!(cache.bytes(), 2 * 3 * 6 * 2 * 4);
        cache.clear();
        assert_eq!(cache.bytes(), 0);
    }
}
