//! The reward a candidate is credited with, before it is compared with its group: its
//! turn's own mixed reward, or its return over the rest of the episode.
//!
//! One rule for every agent of an episode. For agent a's turns i = 0..n−1 (in play
//! order) with local rewards r_i, and R the team reward after the episode's last step:
//!
//! ```text
//!  credit: turn     c_i = α·R_i + r_i                         (R_i: team reward after turn i)
//!  credit: return   c_i = Σ_{j=i}^{n−1} γ^{j−i}·r_j + γ^{n−1−i}·α·R
//! ```
//!
//! So with returns a game's final result (R, and whatever it credits each agent on its
//! latest turn) reaches every move that led to it, discounted by the agent's own turns
//! still to play, and every agent gets the same team reward once, at its last turn.

use serde::{Deserialize, Serialize};

use super::mixed_reward;

/// `algorithm.credit`: what a candidate's reward is, before grouping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Credit {
    /// The turn's own mixed reward α·r_team + r_local: the paper's tasks reward every
    /// turn, and the team reward is the state after the turn.
    #[default]
    Turn,
    /// The agent's discounted return from the turn to the end of the episode, with the
    /// team's final reward at its last turn: for games whose reward comes at the end.
    /// Needs whole trajectories per candidate (`rollout.mode: independent`).
    Return,
}

/// One step of an episode, in play order, as the credit rule reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step<'a> {
    pub agent: &'a str,
    pub local_reward: f64,
    /// The team reward after this step.
    pub team_reward: f64,
}

/// The credited reward of each step of one episode (`steps` in play order).
pub fn credited(credit: Credit, alpha: f64, gamma: f64, steps: &[Step]) -> Vec<f64> {
    match credit {
        Credit::Turn => steps.iter().map(|s| mixed_reward(alpha, s.team_reward, s.local_reward)).collect(),
        Credit::Return => returns(alpha, gamma, steps),
    }
}

/// [`Credit::Return`]: each agent's steps, walked back from its last.
fn returns(alpha: f64, gamma: f64, steps: &[Step]) -> Vec<f64> {
    let team = steps.last().map_or(0.0, |s| s.team_reward);
    let mut credited = vec![0.0; steps.len()];
    // The return of the agent's next step, per agent seen so far walking backwards.
    let mut later: Vec<(&str, f64)> = Vec::new();
    for (i, step) in steps.iter().enumerate().rev() {
        let value = match later.iter_mut().find(|(agent, _)| *agent == step.agent) {
            Some((_, next)) => {
                *next = step.local_reward + gamma * *next;
                *next
            }
            None => {
                let last = step.local_reward + alpha * team;
                later.push((step.agent, last));
                last
            }
        };
        credited[i] = value;
    }
    credited
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(agent: &str, local_reward: f64, team_reward: f64) -> Step<'_> {
        Step { agent, local_reward, team_reward }
    }

    /// A two-agent game rewarded only at its end: x and o move in turn, the game is a
    /// draw (team reward 0.5 after the last move), and the host credits each 0.5 on its
    /// latest move.
    fn draw() -> Vec<Step<'static>> {
        vec![step("x", 0.0, 0.0), step("o", 0.0, 0.0), step("x", 0.5, 0.0), step("o", 0.5, 0.5)]
    }

    #[test]
    fn turn_credit_is_each_steps_mixed_reward() {
        assert_eq!(credited(Credit::Turn, 1.0, 1.0, &draw()), vec![0.0, 0.0, 0.5, 1.0]);
        assert_eq!(credited(Credit::Turn, 0.5, 0.9, &draw()), vec![0.0, 0.0, 0.5, 0.75]);
    }

    #[test]
    fn returns_carry_the_final_result_back_to_the_first_moves_and_to_every_agent_alike() {
        // γ = 1, α = 1: each agent's moves all get its 0.5 plus the team's 0.5.
        assert_eq!(credited(Credit::Return, 1.0, 1.0, &draw()), vec![1.0, 1.0, 1.0, 1.0]);
        // γ = 0.5, α = 2: last moves 0.5 + 2·0.5 = 1.5, first moves 0 + 0.5·1.5 = 0.75.
        assert_eq!(credited(Credit::Return, 2.0, 0.5, &draw()), vec![0.75, 0.75, 1.5, 1.5]);
    }

    #[test]
    fn returns_sum_an_agents_own_later_rewards_only() {
        // a: 1, then 2 (last); b: 4 (last). Team reward 1 after the last step, α = 1, γ = 0.5.
        let steps = [step("a", 1.0, 0.0), step("b", 4.0, 0.0), step("a", 2.0, 3.0), step("b", 0.0, 1.0)];
        // a's last: 2 + 1 = 3; a's first: 1 + 0.5·3 = 2.5; b's last: 0 + 1 = 1; b's first: 4 + 0.5·1 = 4.5.
        assert_eq!(credited(Credit::Return, 1.0, 0.5, &steps), vec![2.5, 4.5, 3.0, 1.0]);
    }

    #[test]
    fn a_one_step_episode_credits_the_same_either_way() {
        let steps = [step("solo", 0.25, 1.0)];
        assert_eq!(credited(Credit::Return, 0.7, 0.9, &steps), credited(Credit::Turn, 0.7, 0.9, &steps));
        assert!(credited(Credit::Return, 1.0, 1.0, &[]).is_empty());
    }
}
