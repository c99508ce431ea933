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
//! Prefill writes each row's positions into its slot from the column where that slot's
//! cached prefix ends; a decode step writes one column per slot, each at its own length.
//! A finished sequence's slot is refilled by moving the last running slot into it (one
//! slot's columns, not the whole cache), so the running slots stay `0..n` and every
//! decode step works on views.

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

    /// Writes a prefill forward's (B, H_kv, L, D) keys and values where `placement` puts
    /// them; returns what its rows attend to: their slots' columns `0..span`, or the
    /// forward's own keys and values when every row starts at column 0.
    pub fn write_placed(&mut self, placement: &Placement, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let (b, h, l, d) = k.size4().expect("keys are (B, H_kv, L, D)");
        let (kb, vb) = self.buffers_like(k);
        let (mut kb, mut vb) = (kb.shallow_clone(), vb.shallow_clone());
        for (buffer, x) in [(&mut kb, k), (&mut vb, v)] {
            let written = x.transpose(1, 2).reshape([b * l, h, d]).index_select(0, &placement.source);
            let _ = buffer.index_put_(&[Some(&placement.slot), None, Some(&placement.column)], &written, false);
        }
        if placement.fresh {
            return (k.shallow_clone(), v.shallow_clone());
        }
        let attended = |buffer: &Tensor| buffer.narrow(2, 0, placement.span).index_select(0, &placement.rows);
        (attended(&kb), attended(&vb))
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

/// Where the positions of one prefill forward go: each row's first `length` of its L
/// positions into its `slot` from column `start` on (the rest is padding).
pub struct Placement {
    /// (B,) the slot of each row.
    rows: Tensor,
    /// (N,) each written position's index among the forward's B·L, its slot and column.
    source: Tensor,
    slot: Tensor,
    column: Tensor,
    /// Columns a row attends to: `0..span` of its slot.
    span: i64,
    /// Every row starts at column 0: it attends only to this forward's positions.
    fresh: bool,
}

impl Placement {
    /// `segments`: (slot, start column, length) of each row; `l` the forward's length.
    pub fn new(segments: &[(i64, i64, i64)], l: i64, device: tch::Device) -> Placement {
        let mut source = Vec::new();
        let (mut slot, mut column) = (Vec::new(), Vec::new());
        for (r, &(s, start, len)) in segments.iter().enumerate() {
            source.extend((0..len).map(|i| r as i64 * l + i));
            slot.extend(std::iter::repeat_n(s, len as usize));
            column.extend(start..start + len);
        }
        let tensor = |values: &[i64]| Tensor::from_slice(values).to_device(device);
        let rows: Vec<i64> = segments.iter().map(|&(s, _, _)| s).collect();
        Placement {
            rows: tensor(&rows),
            source: tensor(&source),
            slot: tensor(&slot),
            column: tensor(&column),
            span: segments.iter().map(|&(_, start, len)| start + len).max().unwrap_or(0),
            fresh: segments.iter().all(|&(_, start, _)| start == 0),
        }
    }

    pub fn fresh(&self) -> bool {
        self.fresh
    }

    pub fn span(&self) -> i64 {
        self.span
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
        // Slots 2 and 1 get 3 columns at 0 (slot 1 two of them, the third padding), then
        // one more column each at their own lengths.
        let fresh = Placement::new(&[(2, 0, 3), (1, 0, 2)], 3, Device::Cpu);
        let (k, _) = cache.write_placed(&fresh, &filled([2, 1, 3, 2], 1.0), &filled([2, 1, 3, 2], -1.0));
        assert_eq!(k.size(), vec![2, 1, 3, 2]);
        let on_top = Placement::new(&[(2, 3, 1), (1, 2, 1)], 1, Device::Cpu);
        let (k, v) = cache.write_placed(&on_top, &filled([2, 1, 1, 2], 2.0), &filled([2, 1, 1, 2], -2.0));
        assert_eq!(
            (k.size(), v.double_value(&[0, 0, 3, 0]), v.double_value(&[1, 0, 2, 0])),
            (vec![2, 1, 4, 2], -2.0, -2.0)
        );
        assert_eq!(
            (k.double_value(&[0, 0, 0, 0]), k.double_value(&[1, 0, 3, 0])),
            (1.0, 0.0),
            "slot 1's column 3 is free"
        );
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
