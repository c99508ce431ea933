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

/// How a step's estimate reaches back to the one before it: its discount γ and GAE's λ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub gamma: f64,
    pub lambda: f64,
}

/// GAE(γ, λ) over `rewards` and the critic's `values` of the same steps.
pub fn gae(rewards: &[f64], values: &[f64], gamma: f64, lambda: f64) -> Estimates {
    linked_gae(rewards, values, &vec![Link { gamma, lambda }; rewards.len()])
}

/// GAE where `links[t]` joins step t to step t + 1 (the last one to the terminal state):
/// the tokens of a reply are joined by γ = 1 and one λ, a reply's last token to the
/// agent's next turn by the episode's γ and λ.
pub fn linked_gae(rewards: &[f64], values: &[f64], links: &[Link]) -> Estimates {
    assert_eq!(rewards.len(), values.len(), "one value per reward");
    assert_eq!(rewards.len(), links.len(), "one link per step");
    let mut advantages = vec![0.0; rewards.len()];
    let (mut next_value, mut next_advantage) = (0.0, 0.0);
    for t in (0..rewards.len()).rev() {
        let Link { gamma, lambda } = links[t];
        let delta = rewards[t] + gamma * next_value - values[t];
        next_advantage = delta + gamma * lambda * next_advantage;
        advantages[t] = next_advantage;
        next_value = values[t];
    }
    let returns = advantages.iter().zip(values).map(|(a, v)| a + v).collect();
    Estimates { advantages, returns }
}

/// The discounts of [`episode_gae`]: γ and λ between an agent's turns, and λ between the
/// tokens of one reply, whose γ is 1 (the environment answers a whole reply; a token is
/// no later in the game than the one before it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Discounts {
    pub gamma: f64,
    pub lambda: f64,
    pub token_lambda: f64,
}

/// GAE over one episode, `steps` in play order with the critic's values of each step in
/// `values`: one value for a turn valued at its state, or one per token of its reply
/// (the state before each token; the turn's reward is on its last). Each agent's own
/// turns, laid end to end, are its trajectory (the value after its last is 0), rewarded
/// as `credit: return` rewards them, one rule for every agent: its local rewards, and
/// α·R, the team's reward after the episode's last step, at its last turn. So a game's
/// end reaches every move, discounted per turn of the agent's own. The estimates come
/// back per step, one per value.
pub fn episode_gae(alpha: f64, discounts: Discounts, steps: &[Step], values: &[Vec<f64>]) -> Vec<Estimates> {
    assert_eq!(steps.len(), values.len(), "values for every step");
    assert!(values.iter().all(|v| !v.is_empty()), "at least one value per step");
    let rewards = episode_rewards(alpha, steps);
    let mut agents: Vec<&str> = steps.iter().map(|s| s.agent).collect();
    agents.sort_unstable();
    agents.dedup();
    let mut estimates = vec![Estimates { advantages: Vec::new(), returns: Vec::new() }; steps.len()];
    for agent in agents {
        let turns: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].agent == agent).collect();
        let (mut flat_rewards, mut flat_values, mut links) = (Vec::new(), Vec::new(), Vec::new());
        for &i in &turns {
            let n = values[i].len();
            flat_values.extend(&values[i]);
            flat_rewards.extend((0..n).map(|j| if j + 1 == n { rewards[i] } else { 0.0 }));
            links.extend((0..n).map(|j| match j + 1 == n {
                true => Link { gamma: discounts.gamma, lambda: discounts.lambda },
                false => Link { gamma: 1.0, lambda: discounts.token_lambda },
            }));
        }
        let trajectory = linked_gae(&flat_rewards, &flat_values, &links);
        let mut start = 0;
        for &i in &turns {
            let end = start + values[i].len();
            estimates[i] = Estimates {
                advantages: trajectory.advantages[start..end].to_vec(),
                returns: trajectory.returns[start..end].to_vec(),
            };
            start = end;
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

/// The shift and scale that whiten advantages to mean 0 and variance 1 (verl's and
/// OpenRLHF's whitening): GAE's scale follows the rewards' and the critic's error, and
/// the PPO clip assumes it is about one. One advantage, or all equal, become 0 (to
/// rounding).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Whitening {
    mean: f64,
    std: f64,
}

impl Whitening {
    /// The whitening of `advantages`.
    pub fn of(advantages: &[f64]) -> Whitening {
        let n = advantages.len() as f64;
        let mean = advantages.iter().sum::<f64>() / n.max(1.0);
        let variance = advantages.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n.max(1.0);
        Whitening { mean, std: (variance + 1e-8).sqrt() }
    }

    pub fn apply(&self, advantage: f64) -> f64 {
        (advantage - self.mean) / self.std
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

    fn discounts(gamma: f64, lambda: f64) -> Discounts {
        Discounts { gamma, lambda, token_lambda: 1.0 }
    }

    /// Per-step estimates of one value each, as one trajectory's.
    fn turn_level(steps: Vec<Estimates>) -> Estimates {
        Estimates {
            advantages: steps.iter().map(|e| e.advantages[0]).collect(),
            returns: steps.iter().map(|e| e.returns[0]).collect(),
        }
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
        let values = [0.5, 0.2, 0.4, 0.6].map(|v| vec![v]);
        let e = turn_level(episode_gae(0.5, discounts(0.9, 1.0), &steps, &values));
        // a: rewards 0.1, 0 + 0.5·2 = 1; returns 1 and 0.1 + 0.9·1 = 1.0.
        // b: rewards 0, 0.3 + 1 = 1.3; returns 1.3 and 0.9·1.3 = 1.17.
        assert!(close(&e.returns, &[1.0, 1.17, 1.0, 1.3]), "{e:?}");
        assert!(close(&e.advantages, &[0.5, 0.97, 0.6, 0.7]), "{e:?}");
        assert!(close(&episode_rewards(0.5, &steps), &[0.1, 0.0, 1.0, 1.3]));
        // λ = 0: a's first turn is judged by its own next value: 0.1 + 0.9·0.4 − 0.5 = −0.04.
        let one_step = turn_level(episode_gae(0.5, discounts(0.9, 0.0), &steps, &values));
        assert!((one_step.advantages[0] + 0.04).abs() < 1e-12, "{one_step:?}");
        // Without a team reward (α = 0) only local rewards count.
        let local = turn_level(episode_gae(0.0, discounts(1.0, 1.0), &steps, &vec![vec![0.0]; 4]));
        assert!(close(&local.returns, &[0.1, 0.3, 0.0, 0.3]), "{local:?}");
    }

    #[test]
    fn token_values_judge_each_token_against_its_turns_return_joined_across_turns_by_gamma_and_lambda() {
        let step = |agent, local_reward, team_reward| Step { agent, local_reward, team_reward };
        // a replies with 2 tokens, b with 1, a with 2; R = 1 at the end; α = 1, γ = 0.5, λ = 0.5.
        let steps = [step("a", 0.0, 0.0), step("b", 0.0, 0.0), step("a", 0.0, 1.0)];
        let values = [vec![0.2, 0.4], vec![0.3], vec![0.6, 0.8]];
        let token_lambda_one = Discounts { gamma: 0.5, lambda: 0.5, token_lambda: 1.0 };
        let e = episode_gae(1.0, token_lambda_one, &steps, &values);
        // a's last turn: tokens joined by γ = 1, λ = 1, reward 1 on the last:
        //   A = 1 − 0.8 = 0.2 on the last token; 0 + 0.8 − 0.6 + 0.2 = 0.4 on the first.
        // a's first turn, its last token joined to 0.6 by γ = 0.5, λ = 0.5:
        //   δ = 0 + 0.5·0.6 − 0.4 = −0.1; A = −0.1 + 0.25·0.4 = 0.0;
        //   first token: δ = 0.4 − 0.2 = 0.2, A = 0.2 + 0.0 = 0.2.
        // b: one token, its last turn: 1 − 0.3 = 0.7.
        assert!(close(&e[2].advantages, &[0.4, 0.2]), "{e:?}");
        assert!(close(&e[0].advantages, &[0.2, 0.0]), "{e:?}");
        assert!(close(&e[1].advantages, &[0.7]), "{e:?}");
        assert!(close(&e[0].returns, &[0.4, 0.4]), "{e:?}");
        // λ = 1 inside a reply: every token's target is the return of its turn's first
        // token (GAE within a turn telescopes), whatever the values inside.
        assert!(close(&e[2].returns, &[1.0, 1.0]), "{e:?}");
        // token λ = 0: each token is judged by the next token's value alone.
        let one_step = episode_gae(1.0, Discounts { token_lambda: 0.0, ..token_lambda_one }, &steps, &values);
        assert!(close(&one_step[2].advantages, &[0.8 - 0.6, 0.2]), "{one_step:?}");
        // One value per turn is the turn-level estimate.
        let per_turn = [vec![0.2], vec![0.3], vec![0.6]];
        let by_turn = turn_level(episode_gae(1.0, token_lambda_one, &steps, &per_turn));
        let by_definition = gae(&[0.0, 1.0], &[0.2, 0.6], 0.5, 0.5);
        assert!(close(&[by_turn.advantages[0], by_turn.advantages[2]], &by_definition.advantages), "{by_turn:?}");
    }

    #[test]
    fn whitening_centres_and_scales_and_zeroes_a_constant() {
        let whiten = |xs: &[f64]| xs.iter().map(|&x| Whitening::of(xs).apply(x)).collect::<Vec<f64>>();
        // mean 2, variance 1: −1 and 1 (up to the 1e-8 in the root).
        let a = whiten(&[1.0, 3.0]);
        assert!(close(&a.iter().map(|x| (x * 1e6).round() / 1e6).collect::<Vec<_>>(), &[-1.0, 1.0]), "{a:?}");
        let constant = whiten(&[0.7, 0.7, 0.7]);
        assert!(constant.iter().all(|a| a.abs() < 1e-9), "{constant:?}");
        // Fitted on some, applied to any: 5 is 3 standard deviations above [1, 3].
        assert!((Whitening::of(&[1.0, 3.0]).apply(5.0) - 3.0).abs() < 1e-6);
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
