//! A rollout's turns as the episodes GAE walks: each (task, episode) in play order, its
//! steps rewarded as the run's algorithm rewards them.

use std::collections::{BTreeMap, HashMap};

use crate::algo::credit::Step;
use crate::algo::critic::{Discounts, episode_gae};
use crate::algo::{AlgorithmConfig, TRUNCATED_FINISH_REASON, Truncated};
use crate::tables::TurnRow;

/// Every episode of `turns`, its rows ordered by node id: its play order, one chain per
/// episode under `rollout.mode: independent`.
pub fn episodes(turns: &[TurnRow]) -> Vec<Vec<&TurnRow>> {
    let mut episodes: BTreeMap<(&str, u32), Vec<&TurnRow>> = BTreeMap::new();
    for row in turns {
        episodes.entry((row.task_id.as_str(), row.episode)).or_default().push(row);
    }
    let mut episodes: Vec<Vec<&TurnRow>> = episodes.into_values().collect();
    for episode in &mut episodes {
        episode.sort_by_key(|r| r.node_id);
    }
    episodes
}

/// The steps of one episode: each turn's local reward (with the truncation penalty where
/// `algorithm.truncated` asks for it) and the team reward after it.
pub fn steps<'a>(episode: &[&'a TurnRow], algorithm: &AlgorithmConfig) -> Vec<Step<'a>> {
    let penalty = |row: &TurnRow| match algorithm.truncated {
        Truncated::Penalty if row.finish_reason == TRUNCATED_FINISH_REASON => algorithm.truncation_penalty,
        _ => 0.0,
    };
    episode
        .iter()
        .map(|r| Step { agent: &r.agent, local_reward: r.local_reward + penalty(r), team_reward: r.team_reward })
        .collect()
}

/// Each turn's discounted return to its episode's end (GAE with λ = 1 and no values), by
/// candidate id: what a critic is fitted to from stored rollouts alone, at every token
/// of the turn's reply as at its state (γ is 1 between the tokens of a reply).
pub fn returns(turns: &[TurnRow], algorithm: &AlgorithmConfig) -> HashMap<String, f64> {
    let mut returns = HashMap::with_capacity(turns.len());
    for episode in episodes(turns) {
        let zero = vec![vec![0.0]; episode.len()];
        let monte_carlo = Discounts { gamma: algorithm.gamma, lambda: 1.0, token_lambda: 1.0 };
        let estimates = episode_gae(algorithm.alpha, monte_carlo, &steps(&episode, algorithm), &zero);
        for (row, e) in episode.iter().zip(estimates) {
            returns.insert(row.candidate_id.clone(), e.returns[0]);
        }
    }
    returns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(episode: u32, node_id: u32, agent: &str, local_reward: f64, team_reward: f64) -> TurnRow {
        TurnRow {
            candidate_id: format!("e{episode}/n{node_id}"),
            task_id: "t".into(),
            episode,
            node_id,
            agent: agent.into(),
            local_reward,
            team_reward,
            finish_reason: "stop".into(),
            ..TurnRow::default()
        }
    }

    #[test]
    fn a_return_is_the_agents_discounted_rewards_to_the_end_with_the_team_reward_at_its_last_turn() {
        // a, b, a (stored out of order); the team earns 1 at the end. α = 0.5, γ = 0.9.
        let rows = vec![turn(0, 2, "a", 0.2, 1.0), turn(0, 0, "a", 0.1, 0.0), turn(0, 1, "b", 0.0, 0.0)];
        let algorithm = AlgorithmConfig { alpha: 0.5, gamma: 0.9, ..AlgorithmConfig::default() };
        let got = returns(&rows, &algorithm);
        // a: 0.2 + 0.5 at its last turn, 0.1 + 0.9·0.7 = 0.73 at its first; b: 0.5.
        assert!((got["e0/n2"] - 0.7).abs() < 1e-12 && (got["e0/n0"] - 0.73).abs() < 1e-12, "{got:?}");
        assert!((got["e0/n1"] - 0.5).abs() < 1e-12, "{got:?}");
        let order: Vec<u32> = episodes(&rows)[0].iter().map(|r| r.node_id).collect();
        assert_eq!(order, [0, 1, 2]);
    }
}
