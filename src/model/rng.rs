//! Counter-based random numbers: draw `i` of a stream depends only on (key, i).
//!
//! Nothing in the model code uses libtorch's global generator or `thread_rng()`: random
//! initialisation, LoRA initialisation, LoRA dropout and sampling all draw from a
//! [`Stream`] keyed by what they are (a seed and a tensor name, a sequence's seed and
//! its step), so the same inputs give the same numbers whatever else runs beside them.

/// SplitMix64's finaliser: a bijective mix of 64 bits.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Combines two keys into one (order matters).
pub(crate) fn combine(a: u64, b: u64) -> u64 {
    mix64(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(b.wrapping_add(0x632b_e59b_d9b4_e019)))
}

/// A stable 64-bit key for a string (FNV-1a, then mixed).
pub(crate) fn key_of(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    mix64(h)
}

/// One stream of draws: the i-th draw is `mix64(key + i·γ)`.
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    key: u64,
    counter: u64,
}

impl Stream {
    pub(crate) fn new(key: u64) -> Stream {
        Stream { key: mix64(key), counter: 0 }
    }

    /// The draw at a given counter, without moving the stream.
    pub(crate) fn at(key: u64, counter: u64) -> u64 {
        mix64(mix64(key).wrapping_add(counter.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        mix64(self.key.wrapping_add(self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// Standard normal (Box–Muller; one of the pair is used, for simplicity over speed).
    pub(crate) fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]: ln is finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Maps 64 random bits to [0, 1).
pub(crate) fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_its_counter_function() {
        let mut s = Stream::new(7);
        let drawn: Vec<u64> = (0..4).map(|_| s.next_u64()).collect();
        let direct: Vec<u64> = (0..4).map(|i| Stream::at(7, i)).collect();
        assert_eq!(drawn, direct);
        assert_ne!(Stream::at(7, 0), Stream::at(8, 0));
    }

    #[test]
    fn normals_have_unit_moments() {
        let mut s = Stream::new(42);
        let xs: Vec<f64> = (0..200_000).map(|_| s.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.01, "mean {mean} var {var}");
    }
}
