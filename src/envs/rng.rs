//! Counter-based random streams: every random choice of the project is a pure function
//! of seeds passed as arguments (no global RNG, no `thread_rng()`).
//!
//! [`stream`] hashes a list of keys (run seed, split, index, …) into one 64-bit seed with
//! splitmix64, and [`SplitMix64`] turns a seed into a sequence. Both are tiny, fast and
//! well-known, so an instance is reproducible from its seed on any platform.

/// One step of splitmix64's output function (Steele, Lea, Flood 2014).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from several keys, e.g. `stream(&[run_seed, SPLIT_TEST, index])`.
/// Different key lists give unrelated seeds.
pub fn stream(keys: &[u64]) -> u64 {
    keys.iter().fold(0x5E_ED0F_9E77_1265u64, |acc, &k| mix(acc ^ mix(k)))
}

/// The splitmix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0), without modulo bias worth caring about for small n.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0)");
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // Reference values of splitmix64 seeded with 0 (as in Vigna's splitmix64.c).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn streams_depend_on_every_key_and_their_order() {
        let a = stream(&[1, 2, 3]);
        assert_eq!(a, stream(&[1, 2, 3]));
        assert_ne!(a, stream(&[1, 2, 4]));
        assert_ne!(a, stream(&[2, 1, 3]));
        assert_ne!(stream(&[0]), stream(&[0, 0]));
    }

    #[test]
    fn below_and_shuffle_stay_in_range_and_permute() {
        let mut rng = SplitMix64::new(7);
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            counts[rng.below(3)] += 1;
        }
        assert!(counts.iter().all(|&c| (900..1100).contains(&c)), "{counts:?}");
        let mut items: Vec<u32> = (0..10).collect();
        rng.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(items, sorted);
    }
}
