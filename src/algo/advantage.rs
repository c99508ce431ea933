//! Advantage estimators, one pure function per algorithm, over one group's rewards.
//!
//! Groups with one member or all-equal rewards carry no signal: every estimator gives
//! them zero advantage (verl's original GRPO would hand a singleton its raw reward,
//! which trains on noise without a baseline).

use super::Algorithm;

/// Size, mean and unbiased standard deviation of one group's rewards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupStats {
    pub size: usize,
    pub mean: f64,
    /// Unbiased (n - 1); 0 for a group of one.
    pub std: f64,
    /// One member, or every reward equal.
    pub degenerate: bool,
}

pub fn group_stats(rewards: &[f64]) -> GroupStats {
    let size = rewards.len();
    let mean = rewards.iter().sum::<f64>() / size.max(1) as f64;
    let std = if size > 1 {
        (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (size - 1) as f64).sqrt()
    } else {
        0.0
    };
    let degenerate = size < 2 || rewards.iter().all(|r| *r == rewards[0]);
    GroupStats { size, mean, std, degenerate }
}

/// GRPO and AT-GRPO: A = (r - mean) / (std + eps).
pub fn grpo(rewards: &[f64], std_epsilon: f64) -> Vec<f64> {
    let stats = group_stats(rewards);
    without_signal_as_zero(rewards, stats, |r| (r - stats.mean) / (stats.std + std_epsilon))
}

/// Dr.GRPO and MAGRPO: A = r - mean (no std normalisation).
pub fn mean_baseline(rewards: &[f64]) -> Vec<f64> {
    let stats = group_stats(rewards);
    without_signal_as_zero(rewards, stats, |r| r - stats.mean)
}

/// MARLOO: A_i = r_i - mean of the other members.
pub fn leave_one_out(rewards: &[f64]) -> Vec<f64> {
    let stats = group_stats(rewards);
    let sum: f64 = rewards.iter().sum();
    let others = (stats.size.max(2) - 1) as f64;
    without_signal_as_zero(rewards, stats, |r| r - (sum - r) / others)
}

/// MAReMax: A = r - max of the group (the best member gets 0, the others less).
pub fn max_baseline(rewards: &[f64]) -> Vec<f64> {
    let stats = group_stats(rewards);
    let max = rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    without_signal_as_zero(rewards, stats, |r| r - max)
}

fn without_signal_as_zero(rewards: &[f64], stats: GroupStats, advantage: impl Fn(f64) -> f64) -> Vec<f64> {
    if stats.degenerate { vec![0.0; rewards.len()] } else { rewards.iter().map(|r| advantage(*r)).collect() }
}

impl Algorithm {
    /// The advantages of one group's rewards, for a group baseline.
    pub fn advantages(self, rewards: &[f64], std_epsilon: f64) -> Vec<f64> {
        match self {
            Algorithm::AtGrpo | Algorithm::Grpo => grpo(rewards, std_epsilon),
            Algorithm::DrGrpo | Algorithm::Magrpo => mean_baseline(rewards),
            Algorithm::Marloo => leave_one_out(rewards),
            Algorithm::Maremax => max_baseline(rewards),
            Algorithm::Ppo => unreachable!("{CRITIC_NOT_GROUP}"),
        }
    }

    /// [`Algorithm::advantages`] in SQL, over a candidate's `reward` and its group's
    /// window columns `g_mean`, `g_std`, `g_sum`, `g_size` and `g_max` (groups without
    /// signal are zeroed by the caller, as `without_signal_as_zero` does here).
    pub fn advantage_sql(self, std_epsilon: f64) -> String {
        match self {
            Algorithm::AtGrpo | Algorithm::Grpo => {
                format!("(reward - g_mean) / (g_std + CAST({std_epsilon:?} AS DOUBLE))")
            }
            Algorithm::DrGrpo | Algorithm::Magrpo => "reward - g_mean".to_string(),
            Algorithm::Marloo => "reward - (g_sum - reward) / (g_size - 1)".to_string(),
            Algorithm::Maremax => "reward - g_max".to_string(),
            Algorithm::Ppo => unreachable!("{CRITIC_NOT_GROUP}"),
        }
    }
}

/// The advantage stage routes a critic's estimator to GAE before any group formula.
const CRITIC_NOT_GROUP: &str = "PPO's advantages are GAE over a critic's values (algo::critic), not a group's";

/// Which groups are kept: degenerate ones are dropped if asked, then the
/// `drop_lowest_mean_fraction` of the remaining groups with the lowest mean reward
/// (rounded down; ties dropped in input order).
pub fn kept_groups(stats: &[GroupStats], drop_degenerate: bool, drop_lowest_mean_fraction: f64) -> Vec<bool> {
    let mut kept: Vec<bool> = stats.iter().map(|s| !(drop_degenerate && s.degenerate)).collect();
    let mut candidates: Vec<usize> = (0..stats.len()).filter(|&i| kept[i]).collect();
    let drop = (candidates.len() as f64 * drop_lowest_mean_fraction).floor() as usize;
    candidates.sort_by(|&a, &b| stats[a].mean.total_cmp(&stats[b].mean));
    for &i in candidates.iter().take(drop) {
        kept[i] = false;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: &[f64], expected: &[f64]) {
        assert_eq!(actual.len(), expected.len());
        for (a, e) in actual.iter().zip(expected) {
            assert!((a - e).abs() < 1e-9, "{actual:?} != {expected:?}");
        }
    }

    #[test]
    fn group_stats_use_the_unbiased_std() {
        let stats = group_stats(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((stats.size, stats.mean, stats.degenerate), (4, 2.5, false));
        assert!((stats.std - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(group_stats(&[7.0]), GroupStats { size: 1, mean: 7.0, std: 0.0, degenerate: true });
        assert!(group_stats(&[0.5, 0.5]).degenerate);
    }

    #[test]
    fn grpo_normalises_by_mean_and_std() {
        // mean 2.5, std sqrt(5/3) = 1.2909944; 1.5 / (1.2909944 + 1e-6) = 1.1618941.
        close(
            &grpo(&[1.0, 2.0, 3.0, 4.0], 1e-6),
            &[-1.1618941038629222, -0.3872980346209741, 0.3872980346209741, 1.1618941038629222],
        );
        // mean 1/3, std sqrt(1/3) = 0.5773503.
        close(&grpo(&[0.0, 0.0, 1.0], 1e-6), &[-0.5773492691913578, -0.5773492691913578, 1.1546985383827157]);
    }

    #[test]
    fn baselines_of_the_other_estimators() {
        let rewards = [1.0, 2.0, 3.0, 4.0];
        close(&mean_baseline(&rewards), &[-1.5, -0.5, 0.5, 1.5]);
        // Others' means: 9/3, 8/3, 7/3, 6/3.
        close(&leave_one_out(&rewards), &[-2.0, -2.0 / 3.0, 2.0 / 3.0, 2.0]);
        close(&max_baseline(&rewards), &[-3.0, -2.0, -1.0, 0.0]);
    }

    #[test]
    fn groups_without_signal_get_zero_advantage_under_every_estimator() {
        for algorithm in Algorithm::GROUP_BASELINES {
            assert_eq!(algorithm.advantages(&[1.5, 1.5, 1.5], 1e-6), vec![0.0; 3], "{algorithm:?} all equal");
            assert_eq!(algorithm.advantages(&[3.0], 1e-6), vec![0.0], "{algorithm:?} size 1");
        }
    }

    #[test]
    fn grpo_advantages_of_a_group_sum_to_zero() {
        let advantages = grpo(&[0.25, -1.0, 2.0, 0.5, 0.5], 1e-6);
        assert!(advantages.iter().sum::<f64>().abs() < 1e-12);
    }

    #[test]
    fn filters_drop_degenerate_groups_then_the_lowest_means() {
        let stats: Vec<GroupStats> = [vec![1.0, 1.0], vec![0.0, 1.0], vec![2.0, 3.0], vec![-1.0, 0.0], vec![5.0, 6.0]]
            .iter()
            .map(|r| group_stats(r))
            .collect();
        assert_eq!(kept_groups(&stats, false, 0.0), vec![true; 5]);
        assert_eq!(kept_groups(&stats, true, 0.0), vec![false, true, true, true, true]);
        // Of the 4 left, floor(4 * 0.5) = 2 with the lowest means go: -0.5 and 0.5.
        assert_eq!(kept_groups(&stats, true, 0.5), vec![false, false, true, false, true]);
        assert_eq!(kept_groups(&stats, false, 0.2), vec![true, true, true, false, true]);
    }
}
