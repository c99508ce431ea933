//! Learning-rate schedules.

use serde::{Deserialize, Serialize};

/// The learning rate's course after the warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    #[default]
    Constant,
    Cosine,
}

/// The learning rate of optimiser step `step` (from 0) of `total`: linear warm-up to
/// `lr` over `warmup_steps`, then constant or cosine decay to 0 at `total`.
pub fn learning_rate(lr: f64, warmup_steps: u32, schedule: Schedule, step: u64, total: u64) -> f64 {
    let warmup = u64::from(warmup_steps);
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    match schedule {
        Schedule::Constant => lr,
        Schedule::Cosine => {
            let progress = ((step - warmup) as f64 / total.saturating_sub(warmup).max(1) as f64).min(1.0);
            lr * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learning_rate_warms_up_then_follows_the_schedule() {
        let lrs: Vec<f64> = (0..9).map(|s| learning_rate(1.0, 4, Schedule::Cosine, s, 8)).collect();
        let expected = [0.25, 0.5, 0.75, 1.0, 1.0, 0.8535533905932737, 0.5, 0.14644660940672624, 0.0];
        for (got, want) in lrs.iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{lrs:?}");
        }
        let constant = |step| learning_rate(0.5, 0, Schedule::Constant, step, 10);
        assert_eq!((constant(0), constant(99)), (0.5, 0.5));
    }
}
