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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_are_mean_and_max() {
        let (mean, max) = mean_max([0.5, 0.1, 0.3].into_iter());
        assert!((mean - 0.3).abs() < 1e-12 && max == 0.5);
        assert_eq!(mean_max(std::iter::empty()), (0.0, 0.0));
    }
}
