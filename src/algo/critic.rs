//! The math of a learned critic: generalised advantage estimation over one agent's
//! trajectory and over every agent's turns of an episode, advantage whitening, and PPO's
//! clipped value loss.
//!
//! A trajectory is any sequence of steps with a reward and a value each, ending in a
//! terminal state whose value is 0: an agent's turns across an episode, or the tokens of
//! those turns laid end to end with each turn's reward on its last token.
//!
//! ```text
//!  δ_t = r_t + γ·V_{t+1} − V_t            (V_T = 0)
//!  A_t = δ_t + γλ·A_{t+1}                 (A_T = 0)
//!  R_t = A_t + V_t                        the value target
//!  L_V = ½·max((V − R)², (clip(V, V_old − ε, V_old + ε) − R)²)
//! ```

use super::credit::Step;

/// Advantages and value targets of one trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimates {
    pub advantages: Vec<f64>,
    /// A_t + V_t: what the critic is fitted to.
    pub returns: Vec<f64>,
}

/// GAE(γ, λ) over `rewards` and the critic's `values` of the same steps.
pub fn gae(rewards: &[f64], values: &[f64], gamma: f64, lambda: f64) -> Estimates {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    let mut advantages = vec![0.0; rewards.len()];
    let (mut next_value, mut next_advantage) = (0.0, 0.0);
    for t in (0..rewards.len()).rev() {
        let delta = rewards[t] + gamma * next_value - values[t];
        next_advantage = delta + gamma * lambda * next_advantage;
        advantages[t] = next_advantage;
        next_value = values[t];
    }
    let returns = advantages.iter().zip(values).map(|(a, v)| a + v).collect();
    Estimates { advantages, returns }
}

/// GAE over one episode, `steps` in play order with the critic's value of each step's
/// state in `values`: each agent's own turns are its trajectory (the value after its last
/// turn is 0), rewarded as `credit: return` rewards them, one rule for every agent: its
/// local rewards, and α·R, the team's reward after the episode's last step, at its last
/// turn. So a game's end reaches every move, discounted per turn of the agent's own.
pub fn episode_gae(alpha: f64, gamma: f64, lambda: f64, steps: &[Step], values: &[f64]) -> Estimates {
    assert_eq!(steps.len(), values.len(), "one value per step");
    let rewards = episode_rewards(alpha, steps);
    let mut agents: Vec<&str> = steps.iter().map(|s| s.agent).collect();
    agents.sort_unstable();
    agents.dedup();
    let mut estimates = Estimates { advantages: vec![0.0; steps.len()], returns: vec![0.0; steps.len()] };
    for agent in agents {
        let turns: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].agent == agent).collect();
        let rewards: Vec<f64> = turns.iter().map(|&i| rewards[i]).collect();
        let own: Vec<f64> = turns.iter().map(|&i| values[i]).collect();
        let trajectory = gae(&rewards, &own, gamma, lambda);
        for (k, &i) in turns.iter().enumerate() {
            estimates.advantages[i] = trajectory.advantages[k];
            estimates.returns[i] = trajectory.returns[k];
        }
    }
    estimates
}

/// The reward of each step of an episode in [`episode_gae`]: its local reward, plus α·R
/// at each agent's last step (R the team reward after the episode's last step).
pub fn episode_rewards(alpha: f64, steps: &[Step]) -> Vec<f64> {
    let team = steps.last().map_or(0.0, |s| s.team_reward);
    let mut rewards: Vec<f64> = steps.iter().map(|s| s.local_reward).collect();
    for (i, step) in steps.iter().enumerate() {
        if !steps[i + 1..].iter().any(|later| later.agent == step.agent) {
            rewards[i] += alpha * team;
        }
    }
    rewards
}

/// Advantages shifted to mean 0 and scaled to variance 1 (verl's and OpenRLHF's
/// whitening): GAE's scale follows the rewards' and the critic's error, and the PPO clip
/// assumes it is about one. One advantage, or all equal, become 0 (to rounding).
pub fn whiten(advantages: &mut [f64]) {
    let n = advantages.len() as f64;
    let mean = advantages.iter().sum::<f64>() / n.max(1.0);
    let variance = advantages.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n.max(1.0);
    for a in advantages.iter_mut() {
        *a = (*a - mean) / (variance + 1e-8).sqrt();
    }
}

/// PPO's clipped value loss of one prediction `value`, made by a critic that predicted
/// `old_value` when the step was sampled, against its target `target`: the new value may
/// not buy a lower loss by moving more than `clip` from the old one.
pub fn clipped_value_loss(value: f64, old_value: f64, target: f64, clip: f64) -> f64 {
    let clipped = old_value + (value - old_value).clamp(-clip, clip);
    0.5 * (value - target).powi(2).max((clipped - target).powi(2))
}

/// Below this variance (in squared reward units) the targets are one number.
const TARGETS_AGREE: f64 = 1e-12;

/// The share of the targets' variance the values explain: 1 − Var(R − V) / Var(R),
/// 1 for a perfect critic, 0 for one that predicts the mean, None when the targets do not
/// vary. Targets that agree to rounding (the same return summed in another order) count
/// as not varying: their variance of 1e-30 would give a ratio of −1e24 that says nothing.
pub fn explained_variance(values: &[f64], targets: &[f64]) -> Option<f64> {
    let variance = |xs: &mut dyn Iterator<Item = f64>| {
        let xs: Vec<f64> = xs.collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64
    };
    if targets.is_empty() {
        return None;
    }
    let of_targets = variance(&mut targets.iter().copied());
    let of_errors = variance(&mut targets.iter().zip(values).map(|(r, v)| r - v));
    (of_targets > TARGETS_AGREE).then(|| 1.0 - of_errors / of_targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    #[test]
    fn gae_over_three_turns_by_hand() {
        // Rewards only at the end; values 0.5, 0.25, 1; γ = 0.9, λ = 0.5.
        // δ2 = 1 − 1 = 0;  δ1 = 0 + 0.9·1 − 0.25 = 0.65;  δ0 = 0 + 0.9·0.25 − 0.5 = −0.275
        // A2 = 0;  A1 = 0.65 + 0.45·0 = 0.65;  A0 = −0.275 + 0.45·0.65 = 0.0175
        let e = gae(&[0.0, 0.0, 1.0], &[0.5, 0.25, 1.0], 0.9, 0.5);
        assert!(close(&e.advantages, &[0.0175, 0.65, 0.0]), "{e:?}");
        assert!(close(&e.returns, &[0.5175, 0.9, 1.0]), "{e:?}");
    }

    #[test]
    fn lambda_one_gives_the_discounted_return_less_the_value_and_lambda_zero_the_one_step_error() {
        let (rewards, values) = ([1.0, -0.5, 2.0], [0.3, 0.1, 0.7]);
        // λ = 1: R_t = Σ γ^k r_{t+k}: R2 = 2, R1 = −0.5 + 0.5·2 = 0.5, R0 = 1 + 0.5·0.5 = 1.25.
        let monte_carlo = gae(&rewards, &values, 0.5, 1.0);
        assert!(close(&monte_carlo.returns, &[1.25, 0.5, 2.0]), "{monte_carlo:?}");
        // λ = 0: A_t = r_t + γ V_{t+1} − V_t.
        let one_step = gae(&rewards, &values, 0.5, 0.0);
        assert!(close(&one_step.advantages, &[1.0 + 0.05 - 0.3, -0.5 + 0.35 - 0.1, 2.0 - 0.7]), "{one_step:?}");
        assert_eq!(gae(&[], &[], 0.9, 0.9), Estimates { advantages: vec![], returns: vec![] });
    }

    #[test]
    fn episode_gae_gives_each_agent_its_own_trajectory_and_the_team_reward_at_its_last_turn() {
        let step = |agent, local_reward, team_reward| Step { agent, local_reward, team_reward };
        // a, b, a, b; the team earns R = 2 at the end; α = 0.5, γ = 0.9, λ = 1.
        let steps = [step("a", 0.1, 0.0), step("b", 0.0, 0.0), step("a", 0.0, 0.0), step("b", 0.3, 2.0)];
        let values = [0.5, 0.2, 0.4, 0.6];
        let e = episode_gae(0.5, 0.9, 1.0, &steps, &values);
        // a: rewards 0.1, 0 + 0.5·2 = 1; returns 1 and 0.1 + 0.9·1 = 1.0.
        // b: rewards 0, 0.3 + 1 = 1.3; returns 1.3 and 0.9·1.3 = 1.17.
        assert!(close(&e.returns, &[1.0, 1.17, 1.0, 1.3]), "{e:?}");
        assert!(close(&e.advantages, &[0.5, 0.97, 0.6, 0.7]), "{e:?}");
        assert!(close(&episode_rewards(0.5, &steps), &[0.1, 0.0, 1.0, 1.3]));
        // λ = 0: a's first turn is judged by its own next value: 0.1 + 0.9·0.4 − 0.5 = −0.04.
        let one_step = episode_gae(0.5, 0.9, 0.0, &steps, &values);
        assert!((one_step.advantages[0] + 0.04).abs() < 1e-12, "{one_step:?}");
        // Without a team reward (α = 0) only local rewards count.
        let local = episode_gae(0.0, 1.0, 1.0, &steps, &[0.0; 4]);
        assert!(close(&local.returns, &[0.1, 0.3, 0.0, 0.3]), "{local:?}");
    }

    #[test]
    fn whitening_centres_and_scales_and_zeroes_a_constant() {
        let mut a = [1.0, 3.0];
        whiten(&mut a);
        // mean 2, variance 1: −1 and 1 (up to the 1e-8 in the root).
        assert!(close(&a.map(|x| (x * 1e6).round() / 1e6), &[-1.0, 1.0]), "{a:?}");
        let mut constant = [0.7, 0.7, 0.7];
        whiten(&mut constant);
        assert!(constant.iter().all(|a| a.abs() < 1e-9), "{constant:?}");
    }

    #[test]
    fn the_value_loss_takes_the_worse_of_the_free_and_the_clipped_prediction() {
        // Within the clip both agree: ½·(0.6 − 1)² = 0.08.
        assert!((clipped_value_loss(0.6, 0.5, 1.0, 0.2) - 0.08).abs() < 1e-12);
        // A move past the clip towards the target buys nothing: clipped to 0.7, ½·0.3² = 0.045.
        assert!((clipped_value_loss(0.9, 0.5, 1.0, 0.2) - 0.045).abs() < 1e-12);
        // A move away from the target is charged in full: ½·(0.0 − 1)² = 0.5.
        assert!((clipped_value_loss(0.0, 0.5, 1.0, 0.2) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn explained_variance_is_one_for_a_perfect_critic_and_zero_for_the_mean() {
        let targets = [1.0, 2.0, 3.0];
        assert_eq!(explained_variance(&targets, &targets), Some(1.0));
        assert_eq!(explained_variance(&[2.0, 2.0, 2.0], &targets), Some(0.0));
        assert_eq!(explained_variance(&[0.0, 1.0], &[1.0, 1.0]), None);
        assert_eq!(explained_variance(&[0.0, 1.0], &[0.3, 0.1 + 0.2]), None, "equal but for rounding");
        assert!(explained_variance(&[0.0, 0.0], &[0.0, 1e-3]).is_some(), "a small spread is still a spread");
    }
}
