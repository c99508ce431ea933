//! The PPO-clip policy loss, token by token, with CleanRL's names.
//!
//! `model::trainer` computes the same terms on tensors; a test there keeps the two equal.

use super::Algorithm;

/// One token's contribution and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenTerms {
    pub ratio: f64,
    /// max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)).
    pub pg_loss: f64,
    /// The clipped term is the one taken (it binds: the token gives no gradient), as
    /// verl's `pg_clipfrac` counts; a ratio outside the range whose unclipped term is the
    /// larger loss still trains and is not counted.
    pub clipped: bool,
    /// (ratio - 1) - log(ratio), an unbiased, non-negative KL estimate.
    pub approx_kl: f64,
}

/// The log-ratio is clamped to ±this before `exp` (as verl does): a token whose new and
/// old logprobs are 100 apart would otherwise give an infinite ratio and a NaN loss.
pub const LOG_RATIO_LIMIT: f64 = 20.0;

pub fn ppo_clip_token(logp_new: f64, logp_old: f64, advantage: f64, clip_epsilon: f64) -> TokenTerms {
    let logratio = (logp_new - logp_old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT);
    let ratio = logratio.exp();
    let pg_loss1 = -advantage * ratio;
    let pg_loss2 = -advantage * ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon);
    TokenTerms {
        ratio,
        pg_loss: pg_loss1.max(pg_loss2),
        clipped: pg_loss2 > pg_loss1,
        approx_kl: (ratio - 1.0) - logratio,
    }
}

/// The truncated importance weight of one token (Yao et al., 2025): the engine sampled
/// it with `engine_logp`, the trainer's copy of the same weights gives `trainer_logp`;
/// the policy-gradient term is weighted by their ratio, capped at `cap` so a token the
/// engine found far less likely than the trainer does cannot dominate the step.
pub fn truncated_importance_weight(trainer_logp: f64, engine_logp: f64, cap: f64) -> f64 {
    (trainer_logp - engine_logp).exp().min(cap)
}

/// The advantage a trained sequence's tokens are credited with: one for the whole reply
/// (a group baseline, a critic that values the turn) or one per token (`critic.values:
/// token`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Advantage<'a> {
    Sequence(f64),
    Tokens(&'a [f32]),
}

impl Advantage<'_> {
    /// The advantage of response token `token`.
    pub fn at(&self, token: usize) -> f64 {
        match self {
            Advantage::Sequence(a) => *a,
            Advantage::Tokens(a) => f64::from(a[token]),
        }
    }
}

/// How token losses become one number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Aggregation {
    /// Mean over every response token of the mini-batch (AT-GRPO, GRPO, DAPO).
    TokenMean,
    /// Sum over each sequence's tokens divided by a constant, then the mean over
    /// sequences (Dr.GRPO): long and short responses weigh per token alike.
    SequenceSum { normaliser: f64 },
}

impl Aggregation {
    /// The factor turning a mini-batch's summed token losses into its loss: 1/tokens for
    /// the token mean, 1/(normaliser · sequences) for the sequence sum of Dr.GRPO.
    pub fn token_weight(self, tokens: usize, sequences: usize) -> f64 {
        match self {
            Aggregation::TokenMean => 1.0 / tokens.max(1) as f64,
            Aggregation::SequenceSum { normaliser } => 1.0 / (normaliser * sequences.max(1) as f64),
        }
    }
}

impl Algorithm {
    /// How this estimator aggregates token losses: Dr.GRPO sums each response and divides
    /// by a constant, the longest possible response (`max_new_tokens`); the others take
    /// the token mean.
    pub fn aggregation(self, max_new_tokens: u32) -> Aggregation {
        match self {
            Algorithm::DrGrpo => Aggregation::SequenceSum { normaliser: f64::from(max_new_tokens.max(1)) },
            _ => Aggregation::TokenMean,
        }
    }
}

/// Mini-batch summary of the PPO-clip terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PpoSummary {
    pub loss: f64,
    pub clip_fraction: f64,
    pub approx_kl: f64,
    pub ratio_mean: f64,
    pub ratio_max: f64,
    pub tokens: usize,
}

/// `sequences[i]` holds (logp_new, logp_old) per response token and the sequence's
/// advantage; `weights`, when given, each token's weight in the loss (the truncated
/// importance weights, [`truncated_importance_weight`]), in the same shape.
pub fn ppo_clip_loss(
    sequences: &[(&[(f64, f64)], Advantage)],
    weights: Option<&[Vec<f64>]>,
    clip_epsilon: f64,
    aggregation: Aggregation,
) -> PpoSummary {
    let terms: Vec<Vec<TokenTerms>> = sequences
        .iter()
        .map(|(tokens, advantage)| {
            let token =
                |(j, (new, old)): (usize, &(f64, f64))| ppo_clip_token(*new, *old, advantage.at(j), clip_epsilon);
            tokens.iter().enumerate().map(token).collect()
        })
        .collect();
    let weight = |s: usize, j: usize| weights.map_or(1.0, |w| w[s][j]);
    let weighted: Vec<Vec<f64>> = terms
        .iter()
        .enumerate()
        .map(|(s, seq)| seq.iter().enumerate().map(|(j, t)| t.pg_loss * weight(s, j)).collect())
        .collect();
    let all: Vec<&TokenTerms> = terms.iter().flatten().collect();
    let tokens = all.len();
    let mean = |f: &dyn Fn(&TokenTerms) -> f64| all.iter().map(|t| f(t)).sum::<f64>() / tokens.max(1) as f64;
    let loss = match aggregation {
        Aggregation::TokenMean => weighted.iter().flatten().sum::<f64>() / tokens.max(1) as f64,
        Aggregation::SequenceSum { normaliser } => {
            let per_sequence: f64 = weighted.iter().map(|seq| seq.iter().sum::<f64>() / normaliser).sum();
            per_sequence / sequences.len().max(1) as f64
        }
    };
    PpoSummary {
        loss,
        clip_fraction: mean(&|t| f64::from(u8::from(t.clipped))),
        approx_kl: mean(&|t| t.approx_kl),
        ratio_mean: mean(&|t| t.ratio),
        ratio_max: all.iter().map(|t| t.ratio).fold(f64::NEG_INFINITY, f64::max),
        tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LN_1_5: f64 = 0.4054651081081644;
    const LN_0_5: f64 = -std::f64::consts::LN_2;
    const LN_1_1: f64 = 0.09531017980432493;

    #[test]
    fn the_importance_weight_is_the_ratio_up_to_its_cap() {
        // trainer 1.5x as likely as the engine: weight 1.5; 2x with cap 1.8: the cap.
        assert!((truncated_importance_weight(LN_1_5, 0.0, 2.0) - 1.5).abs() < 1e-12);
        assert!((truncated_importance_weight(-1.0 + LN_0_5, -1.0, 2.0) - 0.5).abs() < 1e-12);
        assert_eq!(truncated_importance_weight(std::f64::consts::LN_2, 0.0, 1.8), 1.8);
    }

    #[test]
    fn the_clip_binds_only_where_it_limits_improvement() {
        // Ratio 1.5 with A = +1: clipped to 1.2 -> -1.2.
        let t = ppo_clip_token(LN_1_5, 0.0, 1.0, 0.2);
        assert!((t.pg_loss + 1.2).abs() < 1e-12 && t.clipped);
        // Ratio 0.5 with A = +1: the unclipped -0.5 is the larger loss and stays, so the
        // clip does not bind.
        let t = ppo_clip_token(LN_0_5, 0.0, 1.0, 0.2);
        assert!((t.pg_loss + 0.5).abs() < 1e-12 && !t.clipped);
        // Ratio 0.5 with A = -1: clipped to 0.8 -> 0.8 binds.
        let t = ppo_clip_token(LN_0_5, 0.0, -1.0, 0.2);
        assert!((t.pg_loss - 0.8).abs() < 1e-12 && t.clipped);
        // Ratio 1.1 with A = -1: inside the range, 1.1.
        let t = ppo_clip_token(LN_1_1, 0.0, -1.0, 0.2);
        assert!((t.pg_loss - 1.1).abs() < 1e-12 && !t.clipped);
    }

    #[test]
    fn token_mean_summary_matches_the_hand_computation() {
        let a = [(LN_1_5, 0.0), (LN_0_5, 0.0)];
        let b = [(LN_1_1, 0.0)];
        let summary = ppo_clip_loss(
            &[(&a, Advantage::Sequence(1.0)), (&b, Advantage::Sequence(-1.0))],
            None,
            0.2,
            Aggregation::TokenMean,
        );
        assert!((summary.loss - (-1.2 - 0.5 + 1.1) / 3.0).abs() < 1e-12, "{summary:?}");
        // Only the first token's clip binds.
        assert!((summary.clip_fraction - 1.0 / 3.0).abs() < 1e-12);
        assert!((summary.approx_kl - 0.09745729754915201).abs() < 1e-12);
        assert!((summary.ratio_mean - (1.5 + 0.5 + 1.1) / 3.0).abs() < 1e-12);
        assert!((summary.ratio_max - 1.5).abs() < 1e-12);
        assert_eq!(summary.tokens, 3);
    }

    #[test]
    fn sequence_sum_divides_each_sequence_by_the_constant() {
        let a = [(LN_1_5, 0.0), (LN_0_5, 0.0)];
        let b = [(LN_1_1, 0.0)];
        let summary = ppo_clip_loss(
            &[(&a, Advantage::Sequence(1.0)), (&b, Advantage::Sequence(-1.0))],
            None,
            0.2,
            Aggregation::SequenceSum { normaliser: 4.0 },
        );
        // ((-1.2 - 0.5) / 4 + 1.1 / 4) / 2.
        assert!((summary.loss - (-0.6 / 4.0) / 2.0).abs() < 1e-12, "{summary:?}");
    }

    #[test]
    fn importance_weights_scale_each_tokens_loss() {
        let a = [(LN_1_5, 0.0), (LN_0_5, 0.0)];
        let b = [(LN_1_1, 0.0)];
        let weights = vec![vec![0.5, 2.0], vec![1.0]];
        let summary = ppo_clip_loss(
            &[(&a, Advantage::Sequence(1.0)), (&b, Advantage::Sequence(-1.0))],
            Some(&weights),
            0.2,
            Aggregation::TokenMean,
        );
        assert!((summary.loss - (-1.2 * 0.5 - 0.5 * 2.0 + 1.1) / 3.0).abs() < 1e-12, "{summary:?}");
    }

    #[test]
    fn a_huge_log_ratio_is_clamped_and_stays_finite() {
        // New and old 200 apart: exp(200) would overflow the ratio's f32 twin and make
        // 0 · inf = NaN where the advantage is 0.
        let t = ppo_clip_token(0.0, -200.0, 0.0, 0.2);
        assert_eq!(t.ratio, LOG_RATIO_LIMIT.exp());
        assert!(t.pg_loss.is_finite() && t.approx_kl.is_finite(), "{t:?}");
    }

    #[test]
    fn per_token_advantages_weigh_each_token_by_its_own() {
        // On policy (ratio 1) the loss is minus the mean advantage: (0.5 − 1.5 + 2) / 3.
        let tokens = [(-1.0, -1.0), (-2.0, -2.0), (-0.5, -0.5)];
        let per_token = [0.5f32, -1.5, 2.0];
        let summary = ppo_clip_loss(&[(&tokens, Advantage::Tokens(&per_token))], None, 0.2, Aggregation::TokenMean);
        assert!((summary.loss + 1.0 / 3.0).abs() < 1e-12, "{summary:?}");
        // Off policy, token 0 at ratio 1.5 with A = 0.5 is clipped (−0.6 > −0.75), token 1
        // at ratio 0.5 with A = −1.5 too (0.8·1.5 = 1.2 > 0.75): each by its own sign.
        let off = [(LN_1_5, 0.0), (LN_0_5, 0.0), (0.0, 0.0)];
        let summary = ppo_clip_loss(&[(&off, Advantage::Tokens(&per_token))], None, 0.2, Aggregation::TokenMean);
        assert!((summary.loss - (-0.6 + 1.2 - 2.0) / 3.0).abs() < 1e-12, "{summary:?}");
        assert!((summary.clip_fraction - 2.0 / 3.0).abs() < 1e-12, "{summary:?}");
    }

    #[test]
    fn on_policy_ratios_are_one_and_the_loss_is_minus_the_mean_advantage() {
        let tokens = [(-1.0, -1.0), (-2.0, -2.0)];
        let summary = ppo_clip_loss(&[(&tokens, Advantage::Sequence(0.5))], None, 0.2, Aggregation::TokenMean);
        assert_eq!((summary.loss, summary.clip_fraction, summary.approx_kl, summary.ratio_max), (-0.5, 0.0, 0.0, 1.0));
    }
}
