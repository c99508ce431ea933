//! Every random number of petting, as a pure function of seeds passed as arguments: no
//! global generator, no `thread_rng()`, no libtorch generator.
//!
//! ```text
//!  stream([run seed, Key::ROLLOUT, iteration, …]) ──► u64 seed
//!        │
//!        ├─► SplitMix64::new(seed)        sequential draws: instances, demonstrations,
//!        │                                shuffles (task epochs, SFT and PPO sample order)
//!        └─► Counter::at(seed, i)         draw i alone: tensor initialisation by name,
//!                                         LoRA dropout masks, the sampler's token draws
//! ```
//!
//! A stream is named by the keys that make it: the run seed, one of the stage keys in
//! [`Key`], then whatever tells its draws apart (iteration, task, agent, turn, branch).
//! Text becomes a key by [`text_key`]; the two other text hashes below predate it and
//! are kept bit for bit, because each seeds draws that every stored run (and every figure
//! in README.md and RESULTS.md) was made with.

/// The stage keys that start a stream, after the run seed.
pub struct Key;

impl Key {
    /// Which train tasks each iteration's rollout plays, and its sampling seeds.
    pub const ROLLOUT: u64 = 0x2011;
    /// Evaluation episodes' sampling seeds.
    pub const EVALUATE: u64 = 0xE7A1;
    /// Generated train instances (prepare-data).
    pub const TRAIN_TASKS: u64 = 1;
    /// Generated test instances (prepare-data).
    pub const TEST_TASKS: u64 = 2;
    /// The demonstrator's choices while playing warm-start demonstrations.
    pub const DEMONSTRATIONS: u64 = 3;
    /// A scratch model's initial weights.
    pub const INIT: u64 = 0x494E_4954; // "INIT"
    /// A new LoRA adapter's A matrices.
    pub const LORA: u64 = 0x4C4F_5241; // "LORA"
    /// The supervised warm start's example order and dropout.
    pub const SFT: u64 = 0x5346_5400; // "SFT"
    /// A PPO update's sample order and dropout.
    pub const PPO: u64 = 0x5050_4F00; // "PPO"
    /// A fresh value head's weights, and the order its fit takes the samples in.
    pub const CRITIC: u64 = 0x4352_4954; // "CRIT"
    /// The past version a league role plays in each task.
    pub const LEAGUE: u64 = 0x4C45_4147; // "LEAG"
}

/// One step of splitmix64's output function (Steele, Lea, Flood 2014).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from several keys, e.g. `stream(&[run_seed, Key::TEST_TASKS, index])`.
/// Different key lists give unrelated seeds.
pub fn stream(keys: &[u64]) -> u64 {
    keys.iter().fold(0x5E_ED0F_9E77_1265u64, |acc, &k| mix(acc ^ mix(k)))
}

/// The key of a text (a task id): the first 8 bytes of its sha256.
pub fn text_key(text: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(text.as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The key of a policy name: [`stream`] over its bytes (seeds of that policy's
/// initialisation, adapter, warm start and updates).
pub fn name_key(name: &str) -> u64 {
    stream(&name.bytes().map(u64::from).collect::<Vec<_>>())
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
        unit_f64(self.next_u64())
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

/// 0..n in an order that depends only on `seed`.
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    order
}

/// 0..n in the order of one epoch over the train split. It draws `next % (i + 1)` where
/// [`permutation`] multiplies and shifts: kept so that every stored run's batches stay
/// the tasks they were.
pub fn epoch_permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// SplitMix64's finaliser: a bijective mix of 64 bits.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Combines two keys into one (order matters); the model's counterpart of [`stream`].
pub fn combine(a: u64, b: u64) -> u64 {
    mix64(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(b.wrapping_add(0x632b_e59b_d9b4_e019)))
}

/// The key of a tensor or layer name (FNV-1a, then mixed), for [`Counter`] streams.
pub fn tensor_key(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    mix64(h)
}

/// Counter-based draws: the i-th draw is a function of (key, i) alone.
#[derive(Debug, Clone)]
pub struct Counter {
    key: u64,
    counter: u64,
}

impl Counter {
    pub fn new(key: u64) -> Counter {
        Counter { key: mix64(key), counter: 0 }
    }

    /// The draw at a given counter, without moving the stream.
    pub fn at(key: u64, counter: u64) -> u64 {
        mix64(mix64(key).wrapping_add(counter.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        mix64(self.key.wrapping_add(self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// Standard normal (Box–Muller; one of the pair is used, for simplicity over speed).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]: ln is finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Uniform draws in [0, 1) of `shape`, computed on `device`: element i is a function of
/// (key, i) alone, so a LoRA dropout mask costs no host loop and a recomputed forward
/// draws the same mask. 32-bit integer hashing (three rounds of Mueller's hash32, the key
/// folded in between them) in int64 lanes, whose products stay below 2^59; 24 bits of
/// each hash make the float.
pub fn uniform_tensor(key: u64, shape: &[i64], device: tch::Device) -> tch::Tensor {
    use tch::{Kind, Tensor};
    const LOW32: i64 = 0xFFFF_FFFF;
    let numel: i64 = shape.iter().product();
    let round = |x: &Tensor| {
        (x.bitwise_right_shift_tensor_scalar(16).bitwise_xor_tensor(x) * 0x045d_9f3b_i64).bitwise_and(LOW32)
    };
    let (low, high) = ((key & 0xFFFF_FFFF) as i64, (key >> 32) as i64);
    let mut x = Tensor::arange(numel, (Kind::Int64, device)).bitwise_xor(low).bitwise_and(LOW32);
    for salt in [high, low ^ 0x9E37_79B9, high ^ 0x85EB_CA6B] {
        x = round(&x).bitwise_xor(salt);
    }
    let x = x.bitwise_right_shift_tensor_scalar(16).bitwise_xor_tensor(&x).bitwise_and(LOW32);
    (x.bitwise_right_shift_tensor_scalar(8).to_kind(Kind::Float) / (1u64 << 24) as f64).reshape(shape)
}

/// Maps 64 random bits to [0, 1).
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
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

    #[test]
    fn permutations_are_fixed_by_their_seed() {
        for order in [permutation(50, 7), epoch_permutation(50, 7)] {
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, (0..50).collect::<Vec<_>>());
            assert_ne!(order, sorted);
        }
        assert_eq!(permutation(50, 7), permutation(50, 7));
        assert_ne!(permutation(50, 7), permutation(50, 8));
        assert_ne!(epoch_permutation(50, 7), epoch_permutation(50, 8));
    }

    #[test]
    fn the_order_of_stored_runs_is_pinned() {
        // Golden values: the first train epoch of the embedded default (seed 1234, 640
        // tasks), an 8-sample PPO order and the three text keys. A change here changes
        // the data and seeds of every run, and every figure made with them.
        let epoch = epoch_permutation(640, stream(&[1234, Key::ROLLOUT, 0]));
        assert_eq!(epoch[..6], [13, 340, 285, 356, 141, 475]);
        assert_eq!(permutation(8, stream(&[5, 0])), [0, 2, 3, 6, 1, 7, 5, 4]);
        assert_eq!(text_key("plan_path/train/000007"), 0x52A1_D7F0_2D96_7C84);
        assert_eq!(name_key("shared"), 0xD627_232F_748B_9286);
        assert_eq!(tensor_key("lm_head.weight"), 0x2A21_476C_D5F3_C84D);
    }

    #[test]
    fn a_counter_stream_is_its_counter_function() {
        let mut s = Counter::new(7);
        let drawn: Vec<u64> = (0..4).map(|_| s.next_u64()).collect();
        let direct: Vec<u64> = (0..4).map(|i| Counter::at(7, i)).collect();
        assert_eq!(drawn, direct);
        assert_ne!(Counter::at(7, 0), Counter::at(8, 0));
    }

    #[test]
    fn device_draws_are_uniform_and_fixed_by_their_key() {
        let a = uniform_tensor(7, &[4, 50_000], tch::Device::Cpu);
        assert_eq!(a.size(), [4, 50_000]);
        let values = Vec::<f32>::try_from(a.reshape([-1])).unwrap();
        assert!(values.iter().all(|v| (0.0..1.0).contains(v)));
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
        let below_tenth = values.iter().filter(|&&v| v < 0.1).count() as f64 / values.len() as f64;
        assert!((mean - 0.5).abs() < 0.005 && (below_tenth - 0.1).abs() < 0.005, "{mean} {below_tenth}");
        assert!(a.equal(&uniform_tensor(7, &[4, 50_000], tch::Device::Cpu)));
        let other = uniform_tensor(7 | 1 << 40, &[4, 50_000], tch::Device::Cpu);
        let same = a.eq_tensor(&other).to_kind(tch::Kind::Float).mean(tch::Kind::Float).double_value(&[]);
        assert!(same < 0.01, "a key's high half changes the draws ({same} equal)");
        // Neighbouring elements are not correlated.
        let (x, y) = (a.narrow(1, 0, 49_999), a.narrow(1, 1, 49_999));
        let cov = ((&x - 0.5) * (&y - 0.5)).mean(tch::Kind::Float).double_value(&[]);
        assert!(cov.abs() < 0.002, "{cov}");
    }

    #[test]
    fn normals_have_unit_moments() {
        let mut s = Counter::new(42);
        let xs: Vec<f64> = (0..200_000).map(|_| s.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.01, "mean {mean} var {var}");
    }
}
