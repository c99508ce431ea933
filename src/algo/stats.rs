//! Summaries of per-token statistics (logprob drift, engine gaps, entropy) that the
//! update's rows and the engine's probe report.

/// (mean, max) of the values; (0, 0) when there are none.
pub fn mean_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut sum, mut max, mut n) = (0.0, 0.0f64, 0usize);
    for v in values {
        sum += v;
        max = max.max(v);
        n += 1;
    }
    if n == 0 { (0.0, 0.0) } else { (sum / n as f64, max) }
}

/// The band of trainer/sampler probability ratios within which a token counts as
/// matched: [0.9, 1.1], as TRL's mismatch reports draw it.
pub const MISMATCH_BAND: f64 = 0.1;

/// The sampler/trainer mismatch of some tokens, from each token's log-ratio (trainer
/// logprob − sampler logprob): the share whose ratio lies outside [1 − band, 1 + band],
/// and the 95th percentile (nearest rank) of |log-ratio|. (0, 0) when there are none.
pub fn mismatch(log_ratios: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut gaps, mut outside) = (Vec::new(), 0usize);
    for d in log_ratios {
        let ratio = d.exp();
        outside += usize::from(!(1.0 - MISMATCH_BAND..=1.0 + MISMATCH_BAND).contains(&ratio));
        gaps.push(d.abs());
    }
    if gaps.is_empty() {
        return (0.0, 0.0);
    }
    gaps.sort_by(f64::total_cmp);
    let rank = ((0.95 * gaps.len() as f64).ceil() as usize).clamp(1, gaps.len());
    (outside as f64 / gaps.len() as f64, gaps[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_counts_tokens_outside_the_band_and_takes_the_95th_percentile() {
        // Ratios e^0.05, e^-0.1 = 0.905 inside; e^0.1 = 1.105, e^-0.5 outside.
        let (fraction, p95) = mismatch([0.05, -0.1, 0.1, -0.5].into_iter());
        assert_eq!((fraction, p95), (0.5, 0.5));
        // Twenty gaps 0.01..0.20: the 19th (nearest rank of 95%) is 0.19.
        let (_, p95) = mismatch((1..=20).map(|i| f64::from(i) / 100.0));
        assert!((p95 - 0.19).abs() < 1e-12, "{p95}");
        assert_eq!(mismatch(std::iter::empty()), (0.0, 0.0));
    }

    #[test]
    fn statistics_are_mean_and_max() {
        let (mean, max) = mean_max([0.5, 0.1, 0.3].into_iter());
        assert!((mean - 0.3).abs() < 1e-12 && max == 0.5);
        assert_eq!(mean_max(std::iter::empty()), (0.0, 0.0));
    }
}
