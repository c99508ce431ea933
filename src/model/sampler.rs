//! Choosing the next token of every row of a batch, with its logprob.
//!
//! [`Sampling`] says how (greedy, or temperature with top-k / top-p), [`Sampler`] does it
//! for a (B, V) block of logits. Each row draws its one uniform number from the
//! counter-based stream keyed by that row's own seed at its own step, and inverts the
//! filtered distribution's CDF with it, so a sequence's sample never depends on which
//! other sequences share its batch. The logprob returned is that of the chosen token
//! under the distribution it was drawn from, softmax(logits / temperature), which is the
//! behaviour policy PPO's ratio and the trainer's scoring ([`super::MicroBatching`]'s
//! temperature) refer to. top-k and top-p are not in it: a training rollout refuses them
//! (only evaluation, which trains on nothing, filters), and greedy rows give the
//! temperature-1 logprob.

use tch::{Kind, Tensor};

use serde::{Deserialize, Serialize};

use crate::rng::{Counter, unit_f64};
use crate::validate::{Invalid, check};

/// `sampling:` of `rollout` and `evaluation` in a run's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 means greedy decoding.
    pub temperature: f64,
    /// Nucleus threshold; 1 disables it.
    pub top_p: f64,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: u32,
    /// Tokens generated at most per response.
    pub max_new_tokens: u32,
    /// Generation also stops after any of these strings.
    pub stop: Vec<String>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig { temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: 256, stop: Vec::new() }
    }
}

impl SamplingConfig {
    pub fn greedy() -> Self {
        SamplingConfig { temperature: 0.0, ..SamplingConfig::default() }
    }

    pub fn validate(&self, key: &str) -> Result<(), Invalid> {
        check(self.temperature >= 0.0, format!("{key}.temperature"), "must not be negative (0 is greedy)")?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, format!("{key}.top_p"), "must be in (0, 1]")?;
        check(self.max_new_tokens >= 1, format!("{key}.max_new_tokens"), "must be at least 1")
    }
}

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (the lowest id among ties, as `torch.argmax`).
    Greedy,
    /// Sample from softmax(logits / temperature), keeping the `top_k` most likely tokens
    /// (0: all) and the smallest set whose probability reaches `top_p` (1: all).
    Sample { temperature: f64, top_k: usize, top_p: f64 },
}

impl Sampling {
    /// From petting's `sampling` settings: temperature 0 means greedy.
    pub fn from_config(cfg: &SamplingConfig) -> Sampling {
        if cfg.temperature <= 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Sample { temperature: cfg.temperature, top_k: cfg.top_k as usize, top_p: cfg.top_p }
        }
    }
}

/// Picks tokens for a batch of rows.
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
}

impl Sampler {
    pub fn new(sampling: Sampling) -> Sampler {
        Sampler { sampling }
    }

    /// logits (B, V); row i draws from stream `seeds[i]` at counter `steps[i]`. The
    /// (row, token) pairs in `banned` (e.g. EOS before a row's minimum length) get no
    /// probability. Returns each row's token and its logprob under softmax(logits /
    /// temperature) (temperature 1 for greedy rows).
    pub fn sample(
        &self,
        logits: &Tensor,
        seeds: &[u64],
        steps: &[u64],
        banned: &[(usize, i64)],
    ) -> (Vec<i64>, Vec<f32>) {
        let logits = logits.to_kind(Kind::Float);
        let mut scores = logits.shallow_clone();
        if !banned.is_empty() {
            let rows: Vec<i64> = banned.iter().map(|&(row, _)| row as i64).collect();
            let ids: Vec<i64> = banned.iter().map(|&(_, id)| id).collect();
            let index = [Some(Tensor::from_slice(&rows)), Some(Tensor::from_slice(&ids))]
                .map(|t| t.map(|t| t.to_device(logits.device())));
            scores = scores.index_put(&index, &Tensor::from(f64::NEG_INFINITY).to_kind(Kind::Float), false);
        }
        let (tokens, temperature) = match self.sampling {
            Sampling::Greedy => (scores.argmax(-1, false), 1.0),
            Sampling::Sample { temperature, top_k, top_p } => {
                let scores = if temperature == 1.0 { scores } else { scores / temperature };
                let draws: Vec<f64> = seeds.iter().zip(steps).map(|(&s, &t)| unit_f64(Counter::at(s, t))).collect();
                let tokens = match candidates(&scores, top_k, top_p) {
                    Candidates::Head { scores, ids } => {
                        ids.gather(1, &inverse_cdf(&scores, &draws).unsqueeze(1), false).squeeze_dim(1)
                    }
                    Candidates::Vocabulary(scores) => inverse_cdf(&scores, &draws),
                };
                (tokens, temperature)
            }
        };
        // log softmax at the chosen token only: a (B, V) log_softmax is one more full pass.
        let scaled = if temperature == 1.0 { logits } else { logits / temperature };
        let chosen = scaled.gather(1, &tokens.unsqueeze(1), false).squeeze_dim(1) - scaled.logsumexp([-1], false);
        (Vec::<i64>::try_from(&tokens).expect("token ids"), Vec::<f32>::try_from(&chosen).expect("logprobs"))
    }
}

/// Inverts each row's CDF of softmax(scores) (B, C) in column order at its draw in [0, 1):
/// the first column whose cumulative probability exceeds it. In float64 so that long
/// tails add up; columns of probability zero are never hit.
fn inverse_cdf(scores: &Tensor, draws: &[f64]) -> Tensor {
    let cdf = scores.softmax(-1, Kind::Double).cumsum(-1, Kind::Double);
    let total = cdf.select(1, -1).unsqueeze(1);
    let u = Tensor::from_slice(draws).to_device(scores.device()).unsqueeze(1) * total;
    let columns = scores.size()[1];
    u.searchsorted(&cdf, false, true, "right", None::<Tensor>).squeeze_dim(1).clamp_max(columns - 1)
}

/// The tokens each row may draw after top-k and top-p.
enum Candidates {
    /// Every row keeps only tokens among its most likely ones: their filtered scores and
    /// vocabulary ids, (B, C) in vocabulary order, so that the draw over them is the draw
    /// over the whole filtered vocabulary (up to float64 rounding) without a float64
    /// softmax and cumsum of 152k columns per row and step.
    Head { scores: Tensor, ids: Tensor },
    /// Filtered scores over the whole vocabulary (B, V).
    Vocabulary(Tensor),
}

impl Candidates {
    fn head(values: &Tensor, indices: &Tensor) -> Candidates {
        let (ids, order) = indices.sort(-1, false);
        Candidates::Head { scores: values.gather(1, &order, false), ids }
    }
}

fn candidates(scores: &Tensor, top_k: usize, top_p: f64) -> Candidates {
    let v = scores.size()[1];
    if top_k > 0 && (top_k as i64) < v {
        let (values, indices) = scores.topk(top_k as i64, -1, true, true);
        if top_p >= 1.0 {
            return Candidates::head(&values, &indices);
        }
        // The nucleus is taken from what top-k left, as transformers' warpers chain.
        let total = values.logsumexp([-1], true);
        let nucleus = HeadNucleus::new(values, indices, &total, top_p);
        return if nucleus.short.numel() == 0 {
            Candidates::head(&nucleus.values, &nucleus.indices)
        } else {
            Candidates::Vocabulary(filter(scores, top_k, top_p))
        };
    }
    if top_p >= 1.0 {
        return Candidates::Vocabulary(scores.shallow_clone());
    }
    let nucleus = HeadNucleus::of(scores, top_p);
    if nucleus.short.numel() == 0 {
        Candidates::head(&nucleus.values, &nucleus.indices)
    } else {
        Candidates::Vocabulary(nucleus.over_vocabulary(scores, top_p))
    }
}

/// top-k then top-p filtering of (B, V) scores, as transformers' `TopKLogitsWarper` and
/// `TopPLogitsWarper`: removed tokens get −∞, at least one token is kept.
fn filter(scores: &Tensor, top_k: usize, top_p: f64) -> Tensor {
    let v = scores.size()[1];
    let mut scores = scores.shallow_clone();
    if top_k > 0 && (top_k as i64) < v {
        // Below the k-th largest score: removed.
        let (values, _) = scores.topk(top_k as i64, -1, true, true);
        let kth = values.narrow(1, top_k as i64 - 1, 1);
        scores = scores.masked_fill(&scores.lt_tensor(&kth), f64::NEG_INFINITY);
    }
    if top_p < 1.0 {
        scores = nucleus(&scores, top_p);
    }
    scores
}

/// Tokens searched for the nucleus before the whole vocabulary is sorted.
const NUCLEUS_HEAD: i64 = 256;

/// Keeps the nucleus of each row: a token stays while the tokens more likely than it hold
/// less than `top_p` of the probability. Sorting a 152k vocabulary for every row at every
/// step took over a second of a batch-79 decode step on this CPU, against 0.02 s for a
/// `topk`; the nucleus nearly always lies in the few hundred most likely tokens, so it is
/// found there, and only rows whose head holds less than `top_p` are sorted in full.
fn nucleus(scores: &Tensor, top_p: f64) -> Tensor {
    HeadNucleus::of(scores, top_p).over_vocabulary(scores, top_p)
}

/// The nucleus among each row's most likely tokens.
struct HeadNucleus {
    /// The head's scores, most likely first, with the tokens outside the nucleus at −∞.
    values: Tensor,
    /// Their vocabulary ids.
    indices: Tensor,
    /// The rows whose head holds less than `top_p`: their nucleus reaches past it.
    short: Tensor,
}

impl HeadNucleus {
    /// From the `NUCLEUS_HEAD` most likely tokens of (B, V) scores.
    fn of(scores: &Tensor, top_p: f64) -> HeadNucleus {
        let (values, indices) = scores.topk(NUCLEUS_HEAD.min(scores.size()[1]), -1, true, true);
        HeadNucleus::new(values, indices, &scores.logsumexp([-1], true), top_p)
    }

    /// From a head (most likely first) and the log of its rows' total probability mass.
    fn new(values: Tensor, indices: Tensor, total: &Tensor, top_p: f64) -> HeadNucleus {
        let probs = (&values - total).exp();
        let cumulative = probs.cumsum(-1, Kind::Float);
        let more_likely = &cumulative - &probs;
        let short = cumulative.select(1, -1).lt(top_p).nonzero().squeeze_dim(1);
        HeadNucleus { values: values.masked_fill(&more_likely.ge(top_p), f64::NEG_INFINITY), indices, short }
    }

    /// The filtered (B, V) scores: the head's kept tokens, and the short rows sorted in full.
    fn over_vocabulary(&self, scores: &Tensor, top_p: f64) -> Tensor {
        let kept = scores.full_like(f64::NEG_INFINITY).scatter(1, &self.indices, &self.values);
        if self.short.numel() == 0 {
            return kept;
        }
        let sorted = nucleus_by_sort(&scores.index_select(0, &self.short), top_p);
        kept.index_copy(0, &self.short, &sorted)
    }
}

/// The nucleus as transformers' `TopPLogitsWarper` finds it: sort ascending, drop the low
/// tail whose cumulative probability is ≤ 1 − top_p.
fn nucleus_by_sort(scores: &Tensor, top_p: f64) -> Tensor {
    let v = scores.size()[1];
    let (sorted, indices) = scores.sort(-1, false);
    let cumulative = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
    let remove_sorted = cumulative.le(1.0 - top_p);
    // The most likely token always stays.
    let _ = remove_sorted.narrow(1, v - 1, 1).fill_(0);
    let remove = remove_sorted.scatter(1, &indices, &remove_sorted);
    scores.masked_fill(&remove, f64::NEG_INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(rows: &[&[f32]]) -> Tensor {
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).reshape([rows.len() as i64, rows[0].len() as i64])
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_reports_its_logprob() {
        let l = logits(&[&[0.0, 2.0, 2.0, 1.0], &[5.0, 0.0, 0.0, 0.0]]);
        let (tokens, lps) = Sampler::new(Sampling::Greedy).sample(&l, &[0, 0], &[0, 0], &[]);
        assert_eq!(tokens, vec![1, 0]);
        // log softmax of [0, 2, 2, 1] at index 1, by hand.
        let z = (0f64.exp() + 2f64.exp() * 2.0 + 1f64.exp()).ln();
        assert!((lps[0] as f64 - (2.0 - z)).abs() < 1e-6);
        // A banned token is skipped, in the rows it is banned in only.
        let (tokens, _) = Sampler::new(Sampling::Greedy).sample(&l, &[0, 0], &[0, 0], &[(0, 1), (1, 0), (1, 1)]);
        assert_eq!(tokens, vec![2, 2]);
        let (tokens, _) = Sampler::new(Sampling::Greedy).sample(&l, &[0, 0], &[0, 0], &[(1, 0)]);
        assert_eq!(tokens, vec![1, 1]);
    }

    #[test]
    fn a_rows_sample_depends_only_on_its_seed_and_step() {
        let sampler = Sampler::new(Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 });
        let row: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let other: Vec<f32> = (0..50).map(|i| (i as f32 * 1.3).cos() * 3.0).collect();
        let alone = sampler.sample(&logits(&[&row]), &[11], &[3], &[]);
        let batched = sampler.sample(&logits(&[&other, &row, &other]), &[5, 11, 6], &[0, 3, 9], &[]);
        assert_eq!(alone.0[0], batched.0[1]);
        assert_eq!(alone.1[0], batched.1[1]);
    }

    #[test]
    fn sampled_frequencies_follow_the_distribution() {
        let sampler = Sampler::new(Sampling::Sample { temperature: 1.0, top_k: 0, top_p: 1.0 });
        let probs = [0.1f32, 0.2, 0.3, 0.4];
        let row: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let n = 20_000;
        let mut counts = [0usize; 4];
        let rows = vec![row.as_slice(); n];
        let seeds: Vec<u64> = (0..n as u64).collect();
        let (tokens, _) = sampler.sample(&logits(&rows), &seeds, &vec![0; n], &[]);
        for t in tokens {
            counts[t as usize] += 1;
        }
        for (c, p) in counts.iter().zip(probs) {
            assert!((*c as f64 / n as f64 - p as f64).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn top_k_and_top_p_keep_the_head_as_transformers_does() {
        let probs = [0.05f32, 0.5, 0.3, 0.15];
        let row: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let kept = |k: usize, p: f64| {
            let f = filter(&logits(&[&row]), k, p);
            (0..4).filter(|&i| f.double_value(&[0, i]).is_finite()).collect::<Vec<i64>>()
        };
        assert_eq!(kept(2, 1.0), vec![1, 2]);
        // Ascending cumulative: 0.05, 0.20, 0.50, 1.0; with top_p 0.7, ≤ 0.3 is removed.
        assert_eq!(kept(0, 0.7), vec![1, 2]);
        assert_eq!(kept(0, 0.4), vec![1]);
        assert_eq!(kept(0, 0.01), vec![1]);
    }

    #[test]
    fn drawing_from_the_head_draws_what_the_whole_vocabulary_draws() {
        tch::manual_seed(1);
        let v = 2000;
        let scores = Tensor::randn([8, v], (Kind::Float, tch::Device::Cpu)) * 3.0;
        for (top_k, top_p) in [(0, 0.9), (0, 0.5), (50, 1.0), (50, 0.8), (300, 0.95)] {
            let Candidates::Head { scores: head, ids } = candidates(&scores, top_k, top_p) else {
                panic!("the nucleus lies in the head: top_k {top_k}, top_p {top_p}")
            };
            for step in 0..50u64 {
                let draws: Vec<f64> = (0..8).map(|row| unit_f64(Counter::at(row, step))).collect();
                let from_head = ids.gather(1, &inverse_cdf(&head, &draws).unsqueeze(1), false).squeeze_dim(1);
                let from_vocabulary = inverse_cdf(&filter(&scores, top_k, top_p), &draws);
                assert!(from_head.equal(&from_vocabulary), "top_k {top_k}, top_p {top_p}, step {step}");
            }
        }
        // A flat row's nucleus is past the head: the whole vocabulary is filtered instead.
        let flat = Tensor::zeros([1, v], (Kind::Float, tch::Device::Cpu));
        assert!(matches!(candidates(&flat, 0, 0.9), Candidates::Vocabulary(_)));
        assert!(matches!(candidates(&scores, 0, 1.0), Candidates::Vocabulary(_)));
    }

    #[test]
    fn the_nucleus_from_the_head_is_the_sorted_nucleus() {
        // Peaked rows keep their nucleus within the head; the flat last row does not and
        // is sorted in full.
        tch::manual_seed(0);
        let v = 1000;
        let peaked = Tensor::randn([5, v], (Kind::Float, tch::Device::Cpu)) * 4.0;
        let scores = Tensor::cat(&[peaked, Tensor::zeros([1, v], (Kind::Float, tch::Device::Cpu))], 0);
        for top_p in [0.5, 0.9, 0.95, 0.999] {
            let fast = nucleus(&scores, top_p).isfinite();
            let sorted = nucleus_by_sort(&scores, top_p).isfinite();
            assert!(fast.equal(&sorted), "top_p {top_p}");
        }
    }
}
