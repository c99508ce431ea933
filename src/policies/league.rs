//! A league: a role that plays a past version of its policy (fictitious self-play), the
//! version drawn per task from the versions stored before the rollout, by a rule of the
//! run file (`agents.<role>.league`). Its turns are stored (`turns.policy_version` is the
//! version it played, `turns.trainable` false) and never trained.
//!
//! Every draw is a pure function of (run seed, iteration, task, role) and of the results
//! already committed, so a resumed run draws the same opponents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rng::{SplitMix64, stream};
use crate::validate::{Invalid, check};

/// `agents.<role>.league`: which past version the role plays, drawn anew for each task.
/// Exactly one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct League {
    /// Always this version: the run's starting one (0, or a fork's source iteration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// The version k behind the one being trained (the oldest stored, where fewer exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind: Option<u32>,
    /// Uniform over the last n versions stored before the one being trained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uniform: Option<u32>,
    /// Over the last n versions before the one being trained, weighted by (1 − p)², p the
    /// trained roles' mean result against that version in earlier rollouts (each game's
    /// final team_reward from their side, 1 a win, 0.5 a draw, 0 a loss; a version not
    /// yet met counts as one draw): prioritised fictitious self-play.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toward_losses: Option<u32>,
}

/// The one rule a [`League`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Version(u32),
    Behind(u32),
    Uniform(u32),
    TowardLosses(u32),
}

impl League {
    /// The rule, once [`League::validate`] has passed.
    pub fn rule(&self) -> Rule {
        self.rules().first().copied().expect("a validated league names one rule")
    }

    fn rules(&self) -> Vec<Rule> {
        let named = [
            self.version.map(Rule::Version),
            self.behind.map(Rule::Behind),
            self.uniform.map(Rule::Uniform),
            self.toward_losses.map(Rule::TowardLosses),
        ];
        named.into_iter().flatten().collect()
    }

    pub fn validate(&self, key: &str) -> Result<(), Invalid> {
        let rules = self.rules();
        check(
            rules.len() == 1,
            key.to_string(),
            format!("names {} rules; give exactly one of version, behind, uniform or toward_losses", rules.len()),
        )?;
        match rules[0] {
            Rule::Uniform(n) | Rule::TowardLosses(n) => {
                check(n >= 1, key.to_string(), "must draw from at least 1 past version")
            }
            Rule::Version(_) | Rule::Behind(_) => Ok(()),
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Version(v) => write!(f, "version {v}"),
            Rule::Behind(k) => write!(f, "{k} behind"),
            Rule::Uniform(n) => write!(f, "uniform over the last {n}"),
            Rule::TowardLosses(n) => write!(f, "the last {n}, weighted toward those the trained roles lose to"),
        }
    }
}

/// The trained roles' record against one past version: games met, and their summed results.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Record {
    pub games: u64,
    pub score: f64,
}

impl Rule {
    /// How many versions behind the trained one this rule may reach (None: a fixed version).
    pub fn reach(&self) -> Option<u32> {
        match *self {
            Rule::Version(_) => None,
            Rule::Behind(k) => Some(k),
            Rule::Uniform(n) | Rule::TowardLosses(n) => Some(n),
        }
    }

    /// The versions this rule draws from when `current` is trained, among `stored` (the
    /// committed versions of the policy, ascending). Empty: nothing it may play is stored.
    pub fn candidates(&self, current: u32, stored: &[u32]) -> Vec<u32> {
        let before: Vec<u32> = stored.iter().copied().filter(|&v| v < current).collect();
        match *self {
            Rule::Version(v) => stored.iter().copied().filter(|&s| s == v && s <= current).collect(),
            Rule::Behind(k) => {
                let wanted = current.saturating_sub(k);
                let at_or_before = stored.iter().copied().filter(|&v| v <= wanted).max();
                // The oldest stored version stands in while fewer than k exist.
                at_or_before.or_else(|| stored.iter().copied().find(|&v| v <= current)).into_iter().collect()
            }
            Rule::Uniform(n) | Rule::TowardLosses(n) => {
                let window: Vec<u32> = before.iter().rev().take(n as usize).rev().copied().collect();
                // Before any update the only version is the trained one itself.
                if window.is_empty() { stored.iter().copied().filter(|&v| v == current).collect() } else { window }
            }
        }
    }

    /// The weight of each candidate: equal, or toward the versions the trained roles lose to.
    pub fn weights(&self, candidates: &[u32], records: &BTreeMap<u32, Record>) -> Vec<f64> {
        match self {
            Rule::TowardLosses(_) => candidates
                .iter()
                .map(|v| {
                    let r = records.get(v).copied().unwrap_or_default();
                    // One draw as a prior: an unmet version is neither avoided nor preferred.
                    let p = ((r.score + 0.5) / (r.games as f64 + 1.0)).clamp(0.0, 1.0);
                    (1.0 - p).powi(2)
                })
                .collect(),
            _ => vec![1.0; candidates.len()],
        }
    }

    /// The version a role plays in one task: a draw from the candidates by their weights,
    /// seeded by `keys` (run seed, iteration, task, role). None when no candidate is stored.
    pub fn draw(&self, current: u32, stored: &[u32], records: &BTreeMap<u32, Record>, keys: &[u64]) -> Option<u32> {
        let candidates = self.candidates(current, stored);
        let weights = self.weights(&candidates, records);
        pick(&candidates, &weights, SplitMix64::new(stream(keys)).unit())
    }
}

/// The candidate whose share of the total weight covers `u` in [0, 1); every weight zero
/// counts them equal.
fn pick(candidates: &[u32], weights: &[f64], u: f64) -> Option<u32> {
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return candidates.get((u * candidates.len() as f64) as usize).copied();
    }
    let mut reached = 0.0;
    for (&version, &w) in candidates.iter().zip(weights) {
        reached += w / total;
        if u < reached {
            return Some(version);
        }
    }
    candidates.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORED: [u32; 6] = [0, 1, 2, 3, 4, 5];

    #[test]
    fn each_rule_draws_from_the_versions_it_names() {
        assert_eq!(Rule::Version(2).candidates(5, &STORED), vec![2]);
        assert_eq!(Rule::Version(2).candidates(1, &STORED), Vec::<u32>::new(), "not stored before v1 trains");
        assert_eq!(Rule::Behind(2).candidates(5, &STORED), vec![3]);
        assert_eq!(Rule::Behind(2).candidates(1, &STORED), vec![0], "the oldest stands in");
        assert_eq!(Rule::Uniform(3).candidates(5, &STORED), vec![2, 3, 4]);
        assert_eq!(Rule::Uniform(3).candidates(2, &STORED), vec![0, 1]);
        assert_eq!(Rule::Uniform(3).candidates(0, &STORED[..1]), vec![0], "before any update: itself");
        // A fork holds versions from its source iteration on.
        assert_eq!(Rule::Behind(4).candidates(7, &[5, 6, 7]), vec![5]);
        assert_eq!(Rule::TowardLosses(2).candidates(7, &[5, 6, 7]), vec![5, 6]);
    }

    #[test]
    fn toward_losses_weighs_each_version_by_the_square_of_what_the_trained_roles_did_not_win() {
        let records = BTreeMap::from([
            (1, Record { games: 3, score: 3.0 }), // p = 3.5 / 4 = 0.875
            (2, Record { games: 1, score: 0.0 }), // p = 0.5 / 2 = 0.25
        ]);
        let weights = Rule::TowardLosses(3).weights(&[1, 2, 3], &records);
        let expected = [0.125f64.powi(2), 0.75f64.powi(2), 0.25];
        for (w, e) in weights.iter().zip(expected) {
            assert!((w - e).abs() < 1e-12, "{weights:?}");
        }
        assert_eq!(Rule::Uniform(3).weights(&[1, 2, 3], &records), vec![1.0; 3]);
    }

    #[test]
    fn a_draw_follows_the_weights_and_its_keys() {
        assert_eq!(pick(&[1, 2, 3], &[1.0, 2.0, 1.0], 0.0), Some(1));
        assert_eq!(pick(&[1, 2, 3], &[1.0, 2.0, 1.0], 0.3), Some(2));
        assert_eq!(pick(&[1, 2, 3], &[1.0, 2.0, 1.0], 0.74), Some(2));
        assert_eq!(pick(&[1, 2, 3], &[1.0, 2.0, 1.0], 0.76), Some(3));
        assert_eq!(pick(&[1, 2], &[0.0, 0.0], 0.6), Some(2));
        assert_eq!(pick(&[], &[], 0.5), None);
        let rule = Rule::Uniform(5);
        let none = BTreeMap::new();
        let draws: Vec<u32> = (0..200).map(|task| rule.draw(5, &STORED, &none, &[7, 5, task]).unwrap()).collect();
        for v in 0..5 {
            assert!(draws.contains(&v), "uniform over 0..5 never drew v{v}");
        }
        assert!(!draws.contains(&5), "the trained version is not a past one");
        let again: Vec<u32> = (0..200).map(|task| rule.draw(5, &STORED, &none, &[7, 5, task]).unwrap()).collect();
        assert_eq!(draws, again);
    }
}
