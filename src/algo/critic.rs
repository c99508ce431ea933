//! The math of a learned critic: generalised advantage estimation over one agent's
//! trajectory, and PPO's clipped value loss.
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

/// PPO's clipped value loss of one prediction `value`, made by a critic that predicted
/// `old_value` when the step was sampled, against its target `target`: the new value may
/// not buy a lower loss by moving more than `clip` from the old one.
pub fn clipped_value_loss(value: f64, old_value: f64, target: f64, clip: f64) -> f64 {
    let clipped = old_value + (value - old_value).clamp(-clip, clip);
    0.5 * (value - target).powi(2).max((clipped - target).powi(2))
}

/// The share of the targets' variance the values explain: 1 − Var(R − V) / Var(R),
/// 1 for a perfect critic, 0 for one that predicts the mean, None when the targets do not
/// vary.
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
    (of_targets > 0.0).then(|| 1.0 - of_errors / of_targets)
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
    }
}
